"""Where a SmolLM2 forward of T new tokens spends its time: per-op totals from a profile.

Runs `--iters` forwards of T tokens at cache position --position (batch --batch-size) in one jit
per T, traces `--repeats` calls with `jax.profiler` (a Perfetto trace), and prints per forward the
milliseconds and call counts of the compiled program's ops, the C++ kernel's custom calls named by
their FFI target (from the optimized HLO, dumped to a temporary folder), side by side for every T.
Times under the profiler are inflated by its per-op overhead; compare T with T, not with
scripts/bench_verify_cost.py.

  .venv/bin/python scripts/profile_forward.py --widths 1,3,5,9
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

_DUMP = tempfile.mkdtemp(prefix='jaxspec_hlo_')
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           f' --xla_dump_to={_DUMP} --xla_dump_hlo_as_text').strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

from models import cli, cpu_matmul, loading  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--widths', type=cli.list_of(cli.positive_int), default='1,3,5,9',
                 help='T values (new tokens per forward), comma-separated')
  p.add_argument('--batch-size', type=cli.positive_int, default=1)
  p.add_argument('--position', type=cli.nonnegative_int, default=200,
                 help='cache position of the new tokens')
  p.add_argument('--iters', type=cli.positive_int, default=4, help='forwards per call')
  p.add_argument('--repeats', type=cli.positive_int, default=5, help='traced calls')
  p.add_argument('--top', type=cli.positive_int, default=12, help='ops listed')
  return p.parse_args(argv)


def _program(model, b, t, position, iters):
  """A jitted `(params, cache) -> (tokens, cache)` named `forward_T{t}` (its HLO module's name)."""
  def body(params, cache):
    start = jnp.full((b,), position, jnp.int32)

    def step(_, carry):
      tokens, cache = carry
      logits, cache = model(params, tokens, cache, start)
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return jnp.broadcast_to(nxt[:, None], (b, t)), cache

    return jax.lax.fori_loop(0, iters, step, (jnp.zeros((b, t), jnp.int32), cache))

  body.__name__ = f'forward_T{t}'
  return jax.jit(body, donate_argnums=1)


def _targets(module):
  """custom-call op name -> FFI target, from the optimized HLO dumped for `module`."""
  names = {}
  for path in glob.glob(os.path.join(_DUMP, f'*.{module}.*after_optimizations.txt')):
    with open(path, encoding='utf-8') as f:
      for line in f:
        m = re.search(r'%?(\S+) = .*custom-call\(.*custom_call_target="([^"]+)"', line)
        if m:
          names[m.group(1)] = m.group(2)
  return names


def main(argv=None):
  args = parse_args(argv)
  config, params, _ = loading.load_model(args.model)
  model = loading.forward_for(config)
  print(f'{args.model or "SmolLM2-135M-Instruct (default)"}: {config.num_layers} layers; '
        f'{cpu_matmul.platform_line()}')
  buffer_len = args.position + max(args.widths) + 1
  trace_dir = tempfile.mkdtemp(prefix='jaxspec_trace_')
  runs = {}
  for t in args.widths:
    fn = _program(model, args.batch_size, t, args.position, args.iters)
    cache = model.init_cache(args.batch_size, buffer_len)
    for _ in range(3):  # compile and warm up
      tokens, cache = fn(params, cache)
    jax.block_until_ready(tokens)
    with jax.profiler.trace(os.path.join(trace_dir, f'T{t}'), create_perfetto_trace=True):
      for _ in range(args.repeats):
        tokens, cache = fn(params, cache)
        jax.block_until_ready(tokens)
    runs[t] = f'jit_forward_T{t}'
  forwards = args.repeats * args.iters
  for t, module in runs.items():
    path = sorted(glob.glob(os.path.join(trace_dir, f'T{t}', '**', '*.trace.json.gz'),
                            recursive=True))[-1]
    with gzip.open(path) as f:
      events = json.load(f)
    events = events['traceEvents'] if isinstance(events, dict) else events
    names = _targets(module)
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
      if e.get('ph') != 'X' or e.get('args', {}).get('hlo_module') != module:
        continue
      if e['name'].startswith('ThunkExecutor'):
        continue
      op = names.get(e['name'], re.sub(r'\.\d+$', '', e['name']))
      total[op] += e['dur']
      calls[op] += 1
    print(f'T={t}, batch {args.batch_size}: {sum(total.values()) / forwards / 1e3:.1f} ms of ops '
          'a forward (profiled)')
    print('| op | ms a forward | calls a forward |\n|---|---|---|')
    for op, us in total.most_common(args.top):
      print(f'| {op} | {us / forwards / 1e3:.2f} | {calls[op] / forwards:g} |')
    print()


if __name__ == '__main__':
  main()
