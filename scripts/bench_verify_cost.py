"""What verifying T tokens costs on this machine: SmolLM2 forward passes against the memory floor.

Measures, in one run and interleaved (every repeat runs every job once, the best is kept, so load
from other jobs on a shared machine hits all of them alike):
  1. memory bandwidth: numpy copy of a 256 MiB float32 array, (bytes read + written) / time;
  2. the weight-read floor: fp32 parameter bytes / that bandwidth;
  3. the target forward at cache position --position for each T in --widths at batch 1, with
     XLA's dot (`cpu_kernel=False`) and with the C++ small-row kernel (models/cpu_matmul.py):
     ms, ratio to T=1 and ratio to the floor, side by side;
  4. plain batched decoding for each B in --batch-sizes: a decode step (T=1 forward at the same
     position, argmax fed back) at batch B, tokens/s and the ratio to batch 1, both paths.
Each timed job is a `lax.fori_loop` of --iters forwards inside one jit (no dispatch in the time).

  .venv/bin/python scripts/bench_verify_cost.py --position 200 --widths 1,2,3,5,9,16 \\
      --batch-sizes 1,16 --repeats 7
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxspec import bench  # pylint: disable=g-import-not-at-top,wrong-import-position
from models import cli, cpu_matmul, loading  # pylint: disable=g-import-not-at-top,wrong-import-position
from models.llama import LlamaForward  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--position', type=cli.nonnegative_int, default=200,
                 help='cache position of the new tokens')
  p.add_argument('--widths', type=cli.list_of(cli.positive_int), default='1,2,3,5,9,16',
                 help='T values (new tokens per forward), comma-separated')
  p.add_argument('--batch-sizes', type=cli.list_of(cli.positive_int), default='1,16',
                 help='batch sizes of the decode-step rows, comma-separated')
  p.add_argument('--repeats', type=cli.positive_int, default=7, help='timed repeats (best kept)')
  p.add_argument('--iters', type=cli.positive_int, default=8, help='forwards per timed call')
  p.add_argument('--bandwidth-mib', type=cli.positive_int, default=256,
                 help='size of the copied array')
  return p.parse_args(argv)


def _table(letter, values, paths, columns, cells):
  """A Markdown table: one row a value of `letter`, `columns` per path, `cells(path, value)`."""
  print(f'| {letter} | ' + ' | '.join(f'{n} {c}' for n in paths for c in columns) + ' |')
  print('|---|' + '---|' * len(columns) * len(paths))
  for v in values:
    print(f'| {v} | ' + ' | '.join(c for n in paths for c in cells(n, v)) + ' |')


def main(argv=None):
  args = parse_args(argv)
  widths, batches = args.widths, args.batch_sizes
  config, params, _ = loading.load_model(args.model)
  weight_bytes = bench.nbytes(params)
  paths = {'xla': LlamaForward(dataclasses.replace(config, cpu_kernel=False)),
           'kernel': LlamaForward(dataclasses.replace(config, cpu_kernel=True))}
  print(cpu_matmul.platform_line())
  if not cpu_matmul.available():
    paths.pop('kernel')

  jobs = {}
  for name, fwd in paths.items():
    for t in widths:
      jobs[(name, 'T', t)] = (bench.forward_loop(fwd, 1, t, args.position, args.position + t,
                                                 args.iters), (params,))
    for b in batches:
      jobs[(name, 'B', b)] = (bench.forward_loop(fwd, b, 1, args.position, args.position + 1,
                                                 args.iters), (params,))
  bandwidth = bench.host_copy_bandwidth(args.bandwidth_mib, args.repeats)
  secs = {job: s / args.iters for job, s in bench.timed_together(jobs, args.repeats).items()}
  bandwidth = max(bandwidth, bench.host_copy_bandwidth(args.bandwidth_mib, args.repeats))
  floor_ms = 1e3 * weight_bytes / bandwidth
  print(f'copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write); fp32 weights '
        f'{weight_bytes / 1e6:.0f} MB; weight-read floor {floor_ms:.1f} ms')
  print(f'\nforward at cache position {args.position}, batch 1 (best of {args.repeats}):')
  ms = lambda n, kind, v: 1e3 * secs[(n, kind, v)]
  _table('T', widths, paths, ('ms', '/ T=1', '/ floor'), lambda n, t: (
      f'{ms(n, "T", t):.1f}', f'{ms(n, "T", t) / ms(n, "T", widths[0]):.2f}',
      f'{ms(n, "T", t) / floor_ms:.2f}'))
  print(f'\nplain decode step (T=1) at position {args.position}, batch B:')
  tps = lambda n, b: b / secs[(n, 'B', b)]
  _table('B', batches, paths, ('ms/step', 'tok/s', '/ B=1'), lambda n, b: (
      f'{ms(n, "B", b):.1f}', f'{tps(n, b):.0f}', f'{tps(n, b) / tps(n, batches[0]):.2f}'))


if __name__ == '__main__':
  main()
