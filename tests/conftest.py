"""Shared test setup: CPU, float32 matmuls, key-reuse checking on."""

import jax

jax.config.update('jax_debug_key_reuse', True)
jax.config.update('jax_default_matmul_precision', 'highest')
