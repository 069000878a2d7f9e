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

  .venv/bin/python scripts/bench_verify_cost.py --position 200 --widths 1,2,3,5,9,16 \
      --batch-sizes 1,16 --repeats 7
"""

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from models import cpu_matmul  # pylint: disable=g-import-not-at-top,wrong-import-position
from models import gguf_loader  # pylint: disable=g-import-not-at-top,wrong-import-position
from models.llama import LlamaForward  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--model', default=None, help='GGUF path (default: SmolLM2-135M-Instruct)')
  p.add_argument('--position', type=int, default=200, help='cache position of the new tokens')
  p.add_argument('--widths', default='1,2,3,5,9,16', help='T values (new tokens per forward)')
  p.add_argument('--batch-sizes', default='1,16', help='batch sizes of the decode-step rows')
  p.add_argument('--repeats', type=int, default=7, help='timed repeats (best kept)')
  p.add_argument('--iters', type=int, default=8, help='forwards per timed call')
  p.add_argument('--bandwidth-mib', type=int, default=256, help='size of the copied array')
  return p.parse_args(argv)


def copy_bandwidth(mib: int, repeats: int) -> float:
  """Bytes/s of `np.copyto` of an `mib`-MiB float32 array, read + written bytes counted."""
  src = np.ones(mib * 2 ** 18, np.float32)
  dst = np.empty_like(src)
  best = float('inf')
  for _ in range(repeats + 1):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t0)
  return 2 * src.nbytes / best


def forward_loop(forward, batch: int, t: int, position: int, iters: int):
  """Jitted `params -> tokens`: `iters` forwards of `t` new tokens at `position`, each fed the
  previous one's argmax (so none is dead code), cache allocated inside."""

  @jax.jit
  def run(params):
    start = jnp.full((batch,), position, jnp.int32)

    def body(_, carry):
      tokens, cache = carry
      logits, cache = forward(params, tokens, cache, start)
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return jnp.broadcast_to(nxt[:, None], (batch, t)), cache

    carry = (jnp.zeros((batch, t), jnp.int32), forward.init_cache(batch, position + t))
    return jax.lax.fori_loop(0, iters, body, carry)[0]

  return run


def timed_together(jobs: dict, params, repeats: int, iters: int) -> dict:
  """Best seconds per forward of each `name: fn(params)`, interleaved across repeats."""
  for fn in jobs.values():
    jax.block_until_ready(fn(params))
  best = dict.fromkeys(jobs, float('inf'))
  for _ in range(repeats):
    for name, fn in jobs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(params))
      best[name] = min(best[name], (time.perf_counter() - t0) / iters)
  return best


def main(argv=None):
  args = parse_args(argv)
  widths = [int(w) for w in args.widths.split(',')]
  batches = [int(b) for b in args.batch_sizes.split(',')]
  path = args.model or gguf_loader.default_model_path()
  config, params = gguf_loader.load_gguf(path)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  paths = {'xla': LlamaForward(dataclasses.replace(config, cpu_kernel=False)),
           'kernel': LlamaForward(dataclasses.replace(config, cpu_kernel=True))}
  print(f'jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} cores; '
        f'kernel path: {cpu_matmul.describe()}')
  if not cpu_matmul.available():
    paths.pop('kernel')

  jobs = {}
  for name, fwd in paths.items():
    for t in widths:
      jobs[(name, 'T', t)] = forward_loop(fwd, 1, t, args.position, args.iters)
    for b in batches:
      jobs[(name, 'B', b)] = forward_loop(fwd, b, 1, args.position, args.iters)
  bandwidth = copy_bandwidth(args.bandwidth_mib, args.repeats)
  secs = timed_together(jobs, params, args.repeats, args.iters)
  bandwidth = max(bandwidth, copy_bandwidth(args.bandwidth_mib, args.repeats))
  floor_ms = 1e3 * weight_bytes / bandwidth
  print(f'copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write); fp32 weights '
        f'{weight_bytes / 1e6:.0f} MB; weight-read floor {floor_ms:.1f} ms')
  print(f'\nforward at cache position {args.position}, batch 1 (best of {args.repeats}):')
  print('| T | ' + ' | '.join(f'{n} ms | {n} / T=1 | {n} / floor' for n in paths) + ' |')
  print('|---|' + '---|---|---|' * len(paths))
  for t in widths:
    cells = []
    for n in paths:
      ms, ms1 = 1e3 * secs[(n, 'T', t)], 1e3 * secs[(n, 'T', widths[0])]
      cells += [f'{ms:.1f}', f'{ms / ms1:.2f}', f'{ms / floor_ms:.2f}']
    print(f'| {t} | ' + ' | '.join(cells) + ' |')
  print(f'\nplain decode step (T=1) at position {args.position}, batch B:')
  print('| B | ' + ' | '.join(f'{n} ms/step | {n} tok/s | {n} / B=1' for n in paths) + ' |')
  print('|---|' + '---|---|---|' * len(paths))
  for b in batches:
    cells = []
    for n in paths:
      tps, tps1 = b / secs[(n, 'B', b)], batches[0] / secs[(n, 'B', batches[0])]
      cells += [f'{1e3 * secs[(n, "B", b)]:.1f}', f'{tps:.0f}', f'{tps / tps1:.2f}']
    print(f'| {b} | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
  main()
