"""Concrete models, weight loaders and tokenizers that plug into `jaxspec`."""
