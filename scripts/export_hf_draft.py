"""Exports a trained draft (scripts/train_draft.py) as a Hugging Face `LlamaForCausalLM` directory
(config.json + model.safetensors), usable as `assistant_model` in `transformers`.

- small draft: its blocks, final norm and head; the target's input embedding.
- EAGLE drafts are refused: they read the target's features, which `assistant_model` cannot.
- exit draft: the target's first `exit_layer` blocks, then one more block whose attention output
  projection is zero (so the block is only the adapter's residual SwiGLU MLP, zero-padded to the
  target's MLP width), the adapter's norm and head.

Each kind's export is declared in `models.registry` (`models.hf_export` writes the files). The
reduced head becomes a full `lm_head` whose rows outside the draft vocabulary are zero.

  .venv/bin/python scripts/export_hf_draft.py --draft drafts/smollm2_exit --out runs/hf_exit
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import cli, loading, registry  # pylint: disable=g-import-not-at-top


def _trained_draft(text: str) -> str:
  if not os.path.isfile(os.path.join(text, 'draft.json')):
    raise argparse.ArgumentTypeError(f'{text!r} is not a trained draft (no draft.json)')
  return text


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--draft', required=True, type=_trained_draft,
                 help='a trained draft directory (draft.json + draft.safetensors)')
  p.add_argument('--out', required=True, help='the Hugging Face directory to write')
  cli.add_model_flags(p, dtype=False)
  args = p.parse_args(argv)
  config, params, _ = loading.load_model(args.model)
  try:
    layers = registry.export_hf_draft(args.draft, args.out, config, params)
  except ValueError as e:
    raise SystemExit(f'error: {e}') from None
  print(f'wrote {args.out}: LlamaForCausalLM with {layers} layers')


if __name__ == '__main__':
  main()
