"""Speed at accelerator scale: target step vs the HBM floor, round overhead, speedup vs acceptance.

Random weights of a Llama-2-7B-shaped target and a ~160M-parameter draft (bfloat16 on an
accelerator, float32 on a CPU). Measures, each as a `lax.fori_loop` of n steps inside one jit
(no per-step dispatch):
  1. target forward at T=1 and T=K+1 (draft forward at T=1 and T=2) against the floor
     (param bytes + KV-cache bytes) / bandwidth;
  2. the plain decode step (`speculative_step`, K=0) against the same floor;
  3. one speculative round (`speculative_step`, K drafted tokens) minus its forward passes
     (1 target pass of K+1 tokens, 1 draft pass of 2 and K-1 of 1): the round overhead;
  4. end to end, `jaxspec.generate` with a benchmark-only draft that proposes the target's own
     greedy token with probability alpha (else a wrong one; `jaxspec.bench.AlphaDraft`), against
     plain greedy decoding.

  python scripts/bench_scale.py                       # H200: Llama-2-7B target, 160M draft, bf16
  python scripts/bench_scale.py --preset cpu-small    # a small shape that runs on a laptop CPU
  python scripts/bench_scale.py --mesh model=8 ...    # tensor parallel over 8 chips

Prints a table and writes JSON (--out).
"""

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import jaxspec as js  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxspec import bench, sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from models import cli, llama  # pylint: disable=g-import-not-at-top,wrong-import-position

PRESETS = {
    # Llama-2-7B target; a 162M draft (12 layers, width 768, untied 32000 vocabulary).
    '7b': dict(layers=32, width=4096, heads=32, kv_heads=32, mlp=11008, vocab=32000,
               draft_layers=12, draft_width=768, draft_heads=12, draft_mlp=3072,
               prompt_len=128, max_new_tokens=256, iters=50, bandwidth='4.3e12'),
    'cpu-small': dict(layers=4, width=512, heads=8, kv_heads=8, mlp=1376, vocab=8192,
                      draft_layers=1, draft_width=128, draft_heads=4, draft_mlp=344,
                      prompt_len=32, max_new_tokens=64, iters=10, bandwidth='measure'),
}


def _alpha(text: str) -> float:
  value = cli.nonnegative_float(text)
  if value > 1:
    raise argparse.ArgumentTypeError(f'an acceptance rate is in [0, 1], got {text!r}')
  return value


def _bandwidth(text: str) -> str:
  if text != 'measure':
    cli.nonnegative_float(text)
  return text


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--preset', choices=sorted(PRESETS), default='7b')
  for name in PRESETS['7b']:
    p.add_argument('--' + name.replace('_', '-'), default=None,
                   type=_bandwidth if name == 'bandwidth' else cli.positive_int,
                   help='default: the preset\'s' + (" (bytes/s, or 'measure')"
                                                    if name == 'bandwidth' else ''))
  p.add_argument('--dtype', default='auto', choices=('auto',) + cli.DTYPES,
                 help="'auto': bfloat16 on GPU/TPU, float32 on CPU")
  p.add_argument('--batch-size', type=cli.positive_int, default=1)
  p.add_argument('--num-draft-tokens', type=cli.positive_int, default=4,
                 help='K, drafted tokens per round')
  p.add_argument('--alphas', type=cli.list_of(_alpha), default='0.0,0.5,0.7,0.8,0.9,1.0',
                 help='comma-separated acceptance rates in [0, 1]')
  cli.add_mesh_flag(p)
  p.add_argument('--out', default='runs/bench_scale.json', help='JSON results (git-ignored dir)')
  args = p.parse_args(argv)
  for name, value in PRESETS[args.preset].items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  if args.dtype == 'auto':
    args.dtype = 'float32' if jax.default_backend() == 'cpu' else 'bfloat16'
  return args


def configs(args):
  target = llama.LlamaConfig(
      vocab_size=args.vocab, num_layers=args.layers, embed_dim=args.width, mlp_dim=args.mlp,
      num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.width // args.heads,
      tie_embeddings=False, dtype=args.dtype)
  draft = dataclasses.replace(
      target, num_layers=args.draft_layers, embed_dim=args.draft_width, mlp_dim=args.draft_mlp,
      num_heads=args.draft_heads, num_kv_heads=args.draft_heads,
      head_dim=args.draft_width // args.draft_heads)
  return target, draft


def random_params(config, key, mesh):
  """Random params made on device (sharded by logical axes when a mesh is given)."""
  shardings = None
  if mesh is not None:
    abstract = jax.eval_shape(lambda: llama.init_params(config, key))
    shardings = sharding.named_shardings(llama.logical_axes(config), abstract, mesh)
  return jax.jit(lambda k: llama.init_params(config, k), out_shardings=shardings)(key)


def step_times(target, draft, tp, dp, prompts, lengths, args) -> dict:
  """Per-step ms of the forward passes, the plain step and one speculative round (interleaved)."""
  b, k, n = prompts.shape[0], args.num_draft_tokens, args.iters
  buffer_len = js.buffer_length(args.prompt_len, args.max_new_tokens, k)
  greedy = js.SamplingConfig(temperature=0)
  plain = dict(target=target, draft=None, config=js.DecodeConfig(
      num_draft_tokens=0, max_new_tokens=args.max_new_tokens, sampling=greedy))
  spec = dict(target=target, draft=draft, config=js.DecodeConfig(
      num_draft_tokens=k, max_new_tokens=args.max_new_tokens, sampling=greedy))
  init = jax.jit(js.init_state, static_argnames=('target', 'draft', 'config'))
  state = lambda p, statics: init(tp, p, prompts, lengths, js.row_keys(np.arange(b)),
                                 **statics)
  jobs = {
      'target_t1': (bench.forward_loop(target, b, 1, buffer_len - 2, buffer_len, n), (tp,)),
      'target_tk1': (bench.forward_loop(target, b, k + 1, buffer_len - k - 2, buffer_len, n),
                     (tp,)),
      'draft_t1': (bench.forward_loop(draft.forward, b, 1, buffer_len - 2, buffer_len, n),
                   (dp['model'],)),
      'draft_t2': (bench.forward_loop(draft.forward, b, 2, buffer_len - 3, buffer_len, n),
                   (dp['model'],)),
      'plain_step': (bench.round_loop(plain, n), (state(None, plain), tp, None)),
      'round': (bench.round_loop(spec, n), (state(dp, spec), tp, dp)),
  }
  r = {name + '_ms': 1e3 * seconds / n for name, seconds in bench.timed_together(jobs).items()}
  r['round_forwards_ms'] = r['target_tk1_ms'] + r['draft_t2_ms'] + (k - 1) * r['draft_t1_ms']
  r['round_overhead_ms'] = r['round_ms'] - r['round_forwards_ms']
  return r


def speedup_table(run, draft, dparams, args) -> tuple[float, list]:
  """Plain greedy ms/token, and for each alpha: acceptance, tokens per round, ms/token, speedup."""
  k, greedy = args.num_draft_tokens, js.SamplingConfig(temperature=0)
  plain_cfg = js.DecodeConfig(num_draft_tokens=0, max_new_tokens=args.max_new_tokens,
                              sampling=greedy)
  spec_cfg = dataclasses.replace(plain_cfg, num_draft_tokens=k)
  plain_ms = 1e3 * bench.timed(run, plain_cfg, None, None) / args.max_new_tokens
  jax.block_until_ready(run(spec_cfg, draft, dparams(0.5)))  # compile once: alpha is an array
  rows = []
  for alpha in args.alphas:
    times = []
    for _ in range(2):
      t0 = time.perf_counter()
      out = jax.block_until_ready(run(spec_cfg, draft, dparams(alpha)))
      times.append(1e3 * (time.perf_counter() - t0) / args.max_new_tokens)
    s = js.summarize(out.metrics)
    rows.append({'alpha': alpha, 'acceptance_rate': s['acceptance_rate'],
                 'tokens_per_round': s['mean_accepted_length'],
                 'expected_tokens_per_round': sum(alpha ** i for i in range(k + 1)),
                 'ms_per_token': min(times), 'speedup': plain_ms / min(times)})
  return plain_ms, rows


def main(argv=None):
  sharding.maybe_initialize_distributed()
  args = parse_args(argv)
  mesh = sharding.make_mesh(args.mesh) if args.mesh else None
  tc, dc = configs(args)
  target, draft_model = llama.LlamaForward(tc), llama.LlamaForward(dc)
  if mesh is not None:
    target = sharding.ShardedModel.wrap(target, llama.cache_logical_axes(tc), mesh)
    draft_model = sharding.ShardedModel.wrap(draft_model, llama.cache_logical_axes(dc), mesh)
  tp = random_params(tc, jax.random.key(0), mesh)
  dp = random_params(dc, jax.random.key(1), mesh)
  buffer_len = js.buffer_length(args.prompt_len, args.max_new_tokens, args.num_draft_tokens)
  bandwidth = bench.device_bandwidth() if args.bandwidth == 'measure' else float(args.bandwidth)
  cache_bytes = bench.nbytes(jax.eval_shape(
      lambda: llama.init_cache(tc, args.batch_size, buffer_len)))
  r = {'args': vars(args), 'device': str(jax.devices()[0].device_kind),
       'num_devices': len(jax.devices()),
       'target_params': sum(int(x.size) for x in jax.tree.leaves(tp)),
       'draft_params': sum(int(x.size) for x in jax.tree.leaves(dp)),
       'param_bytes': bench.nbytes(tp), 'cache_bytes': cache_bytes, 'bandwidth': bandwidth,
       'floor_ms': 1e3 * (bench.nbytes(tp) + cache_bytes) / bandwidth}

  rng = np.random.default_rng(0)
  prompts = rng.integers(3, tc.vocab_size, (args.batch_size, args.prompt_len)).astype(np.int32)
  lengths = np.full((args.batch_size,), args.prompt_len, np.int32)
  run = lambda cfg, d, p: js.generate(tp, p, prompts, lengths, np.arange(args.batch_size),
                                      target=target, draft=d, config=cfg)
  plain_cfg = js.DecodeConfig(num_draft_tokens=0, max_new_tokens=args.max_new_tokens,
                              sampling=js.SamplingConfig(temperature=0))
  ref = run(plain_cfg, None, None).tokens  # the target's greedy tokens, for AlphaDraft
  dparams = lambda alpha: {'model': dp, 'ref': ref, 'alpha': jnp.float32(alpha)}
  draft = bench.AlphaDraft(draft_model)
  r.update(step_times(target, draft, tp, dparams(0.8), prompts, lengths, args))
  r['plain_e2e_ms_per_token'], r['speedup'] = speedup_table(run, draft, dparams, args)
  report(r, args.num_draft_tokens)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(r, f, indent=2)
  print(f'wrote {args.out}')


def report(r, k):
  floor = r['floor_ms']
  print(f"device {r['device']} x{r['num_devices']}; target {r['target_params'] / 1e6:.0f}M "
        f"params, draft {r['draft_params'] / 1e6:.0f}M; dtype {r['args']['dtype']}")
  print(f"floor = ({r['param_bytes'] / 1e9:.3f} GB params + {r['cache_bytes'] / 1e9:.3f} GB "
        f"cache) / {r['bandwidth'] / 1e9:.0f} GB/s = {floor:.3f} ms")
  rows = [('target forward T=1', r['target_t1_ms']), (f'target forward T={k + 1}',
                                                       r['target_tk1_ms']),
          ('plain decode step (K=0)', r['plain_step_ms']), ('draft forward T=1', r['draft_t1_ms']),
          ('draft forward T=2', r['draft_t2_ms']), (f'speculative round (K={k})', r['round_ms']),
          ('  its forward passes', r['round_forwards_ms']),
          ('  round overhead', r['round_overhead_ms'])]
  print(f"{'':28s} {'ms':>9s} {'x floor':>8s}")
  for name, ms in rows:
    print(f'{name:28s} {ms:9.3f} {ms / floor:8.2f}')
  print(f"round overhead = {100 * r['round_overhead_ms'] / r['target_t1_ms']:.1f}% of a target "
        f"T=1 step; plain e2e {r['plain_e2e_ms_per_token']:.3f} ms/token")
  print(f"{'alpha':>6s} {'accept':>7s} {'tok/round':>9s} {'expected':>8s} {'ms/tok':>8s} "
        f"{'speedup':>7s}")
  for s in r['speedup']:
    print(f"{s['alpha']:6.2f} {s['acceptance_rate']:7.3f} {s['tokens_per_round']:9.2f} "
          f"{s['expected_tokens_per_round']:8.2f} {s['ms_per_token']:8.3f} {s['speedup']:7.2f}")


if __name__ == '__main__':
  main()
