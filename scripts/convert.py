"""Converts a GGUF file or a Hugging Face checkpoint directory to an orbax checkpoint.

  python scripts/convert.py --model SmolLM2-135M-Instruct.Q4_1.gguf --out /ckpt/smollm2
  python scripts/convert.py --model /models/TinyLlama-1.1B --out /ckpt/tinyllama --dtype bfloat16

Restore it sharded with `models.checkpoint.restore(out, mesh=jaxspec.sharding.make_mesh(...))`.
With `--mesh`, weights are loaded straight onto that mesh and written shard by shard.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxspec import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from models import checkpoint, cli, loading  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  cli.add_model_flags(parser)
  parser.add_argument('--out', required=True, help='the orbax checkpoint directory to write')
  cli.add_mesh_flag(parser)
  args = parser.parse_args(argv)
  sharding.maybe_initialize_distributed()
  mesh = sharding.make_mesh(args.mesh) if args.mesh else None
  config, params, _ = loading.load_model(args.model, args.dtype, mesh)
  checkpoint.save(args.out, config, params)
  print(f'wrote {args.out}: {config}')


if __name__ == '__main__':
  main()
