"""Side-by-side benchmark: plain vs speculative decoding of SmolLM2 with each draft, and
`transformers` (greedy `generate`, assisted generation with the exported draft, prompt lookup).

Same prompts (the chat and grounded prompts of shared/prompts/dev.jsonl, chat template applied),
same machine, batch 1, one prompt at a time; every prompt is padded to one length bucket so each
configuration compiles once. For each configuration: tokens/s, speedup over our plain decoding
and over transformers, acceptance rate, mean accepted length (tokens per target pass), the
accepted-length histogram, compile time and the process's peak RSS. At temperature 0 it checks
that the output equals plain greedy output. It then times the pieces of a round (draft proposal,
verify pass) on their own and the whole round inside the decode loop (the rest, "other", is the
difference: sampling, commit, draft bookkeeping, loop carry), estimates alpha and the cost ratio
c, and shows Leviathan et al.'s Theorem 3.8 speedup (and the same with the measured verify
cost) next to the measured one, with the K the formula picks. Writes `<out>/benchmark.json`,
`<out>/results.md`, `<out>/speedup_vs_k.png`, `<out>/accepted_length_hist.png`.

  .venv/bin/python scripts/benchmark.py --quick                      # a few minutes
  .venv/bin/python scripts/benchmark.py --peers_python .venv-ref/bin/python   # the full run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxspec as js  # pylint: disable=g-import-not-at-top
from jaxspec import speedup  # pylint: disable=g-import-not-at-top
from models import draft_heads, gguf_loader, llama, tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
from bench_scale import round_loop  # pylint: disable=g-import-not-at-top  (scripts/ is on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--quick', action='store_true', help='K=3, 4 prompts, 48 new tokens')
  p.add_argument('--prompts', default=os.path.join(ROOT, '..', 'shared', 'prompts', 'dev.jsonl'))
  p.add_argument('--kinds', default='chat,grounded')
  p.add_argument('--num_prompts', type=int, default=0, help='0 = all of the selected kinds')
  p.add_argument('--max_new_tokens', type=int, default=128)
  p.add_argument('--ks', default='1,2,3,4,5,6,7,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--drafts', default='ngram,exit_untrained,exit_trained,small,eagle')
  p.add_argument('--untrained_exit_layer', type=int, default=8)
  p.add_argument('--exit_draft', default=os.path.join(ROOT, 'drafts', 'smollm2_exit'))
  p.add_argument('--eagle_draft', default=os.path.join(ROOT, 'drafts', 'smollm2_eagle'))
  p.add_argument('--small_draft', default=os.path.join(ROOT, 'runs', 'smollm2_small'),
                 help='made by scripts/train_draft.py --kind small (43 MB, not committed)')
  p.add_argument('--peers_python', default=None,
                 help='a python with transformers (e.g. .venv-ref/bin/python); none = skip')
  p.add_argument('--hf_drafts', default='runs/hf_exit,runs/hf_small',
                 help='comma-separated exported HF drafts for assisted generation')
  p.add_argument('--out', default='runs/benchmark')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args()
  if args.quick:
    args.ks, args.num_prompts, args.max_new_tokens = '3', args.num_prompts or 4, 48
  return args


def _load_prompts(args, tok):
  with open(args.prompts, encoding='utf-8') as f:
    rows = [json.loads(line) for line in f if line.strip()]
  kinds = args.kinds.split(',')
  rows = [r for r in rows if r['kind'] in kinds]
  if args.num_prompts:  # keep the kinds mixed: round-robin over kinds
    by_kind = [[r for r in rows if r['kind'] == k] for k in kinds]
    mixed = [r for group in zip(*by_kind) for r in group]
    rows = (mixed + [r for r in rows if r not in mixed])[:args.num_prompts]
  return rows, [tok.encode_chat(r['prompt']) for r in rows]


def _build_drafts(args, config, params):
  """name -> (draft, draft params, extra bytes the draft adds beyond the target's params)."""
  drafts = {}
  for name in args.drafts.split(','):
    if name == 'ngram':
      drafts[name] = (js.NGramDraft(max_ngram=3), None, 0)
    elif name == 'exit_untrained':
      fwd = llama.LlamaForward(config, num_layers=args.untrained_exit_layer)
      drafts[name] = (js.ModelDraft(fwd, shares_target_cache=True), params, 0)
    elif name in ('exit_trained', 'small', 'eagle'):
      path = {'exit_trained': args.exit_draft, 'small': args.small_draft,
              'eagle': args.eagle_draft}[name]
      if not os.path.isfile(os.path.join(path, 'draft.json')):
        print(f'skipping {name}: no draft at {path}')
        continue
      draft, dparams = draft_heads.load_trained_draft(path, config, params)
      target_ids = {id(a) for a in jax.tree.leaves(params)}
      extra = sum(a.nbytes for a in jax.tree.leaves(dparams) if id(a) not in target_ids)
      drafts[name] = (draft, dparams, extra)
    else:
      raise ValueError(f'unknown draft {name!r}')
  return drafts


def _cache_bytes(draft, buffer_len):
  """Bytes of the KV cache a draft keeps besides the target's (0 for shared or no cache)."""
  own_cache = isinstance(draft, js.FeatureDraft) or (isinstance(draft, js.ModelDraft) and
                                                     not draft.shares_target_cache)
  if not own_cache:
    return 0
  shapes = jax.eval_shape(lambda: draft.forward.init_cache(1, buffer_len))
  return sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(shapes))


def run_config(params, target, tok, prompts, draft_entry, k, temperature, args, kinds):
  """Decodes every prompt (batch 1) with one configuration; returns a result dict."""
  draft, dparams, extra = draft_entry if draft_entry else (None, None, 0)
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                           sampling=js.SamplingConfig(temperature=temperature),
                           eos_id=tok.eos_id, pad_id=tok.pad_id)
  tokens, lengths = prompts
  t0 = time.perf_counter()
  run = js.compile_generate(params, dparams, tokens[:1], lengths[:1], [args.seed], target=target,
                            draft=draft, config=config)
  compile_s = time.perf_counter() - t0
  outputs, stats, walls = [], [], []
  for i in range(len(tokens)):
    key_i = js.row_keys([args.seed * 1000 + i])
    t0 = time.perf_counter()
    out = run(params, dparams, jnp.asarray(tokens[i:i + 1]), jnp.asarray(lengths[i:i + 1]), key_i)
    jax.block_until_ready(out.tokens)
    walls.append(time.perf_counter() - t0)
    outputs.append(out.new_tokens()[0])
    stats.append(js.summarize(out.metrics))
  total = {n: sum(s[n] for s in stats) for n in ('new_tokens', 'target_forward_passes',
                                                 'drafted_tokens', 'accepted_tokens')}
  wall = sum(walls)
  by_kind = {}
  for kind in sorted(set(kinds)):
    sel = [i for i, x in enumerate(kinds) if x == kind]
    drafted = sum(stats[i]['drafted_tokens'] for i in sel)
    new = sum(stats[i]['new_tokens'] for i in sel)
    by_kind[kind] = dict(
        tokens_per_s=new / sum(walls[i] for i in sel),
        acceptance_rate=sum(stats[i]['accepted_tokens'] for i in sel) / max(drafted, 1),
        mean_accepted_length=new / max(sum(stats[i]['target_forward_passes'] for i in sel), 1))
  hist = np.sum([np.asarray(s['accepted_length_histogram']) for s in stats], 0).tolist()
  buffer_len = js.buffer_length(tokens.shape[1], args.max_new_tokens, k)
  return dict(
      temperature=temperature, k=k, wall_s=wall, compile_s=compile_s, **total,
      tokens_per_s=total['new_tokens'] / wall,
      acceptance_rate=total['accepted_tokens'] / max(total['drafted_tokens'], 1),
      mean_accepted_length=total['new_tokens'] / max(total['target_forward_passes'], 1),
      accepted_length_histogram=hist, by_kind=by_kind,
      peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      draft_extra_mb=(extra + _cache_bytes(draft, buffer_len)) / 2**20,
      outputs=outputs)


def _timeit(fn, state, *args, reps=7):
  """Median seconds of `state = fn(state, *args)` (buffers donated); returns (seconds, last
  state). Parameters go in `args`: closed over, they would be compile-time constants."""
  state = fn(state, *args)  # compile
  jax.block_until_ready(state)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    state = fn(state, *args)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return float(np.median(times)), state


def time_round_parts(params, target, prompts, drafts, ks, args):
  """Seconds for: one target step (T=1), prefill, a verify pass of K+1 tokens (forward + greedy
  verification), and each draft's K-token proposal; caches donated and fed back."""
  tokens, lengths = prompts
  tok0, len0 = jnp.asarray(tokens[:1]), jnp.asarray(lengths[:1])
  buffer_len = js.buffer_length(tokens.shape[1], args.max_new_tokens, max(ks))
  pos = len0 + args.max_new_tokens // 2
  zero = jnp.zeros((1,), jnp.int32)
  out = {'verify_s': {}, 'draft_s': {}}
  prefill = jax.jit(lambda c, p: target(p, tok0, c, zero)[1], donate_argnums=0)
  out['prefill_s'], cache = _timeit(prefill, target.init_cache(1, buffer_len), params, reps=3)
  step = jax.jit(lambda c, p: target(p, tok0[:, :1], c, pos - 1)[1], donate_argnums=0)
  out['target_step_s'], cache = _timeit(step, cache, params)
  for k in ks:
    window = jnp.ones((1, k + 1), jnp.int32)

    def verify(c, p, window=window):
      logits, c = target(p, window, c, pos - 1)
      n, nxt = js.verify_greedy(window[:, 1:], logits)
      return c, n, nxt

    vjit = jax.jit(verify, donate_argnums=0)
    out['verify_s'][k], (cache, _, _) = _timeit(lambda s, p: vjit(s[0], p), (cache, None, None),
                                                params)
  buffer = jnp.pad(tok0, ((0, 0), (0, buffer_len - tok0.shape[1])))
  keys = js.row_keys([0])
  for name, (draft, dparams, _) in drafts.items():
    out['draft_s'][name] = {}
    for k in ks:
      feats = None
      if draft.uses_target_features:  # its state holds a K+1 window of target features
        _, _, feats = target.with_features(params, tok0, target.init_cache(1, buffer_len), zero)
      state = draft.init(dparams, js.Prefill(tok0, len0, buffer_len, k, feats))
      if draft.uses_target_features:
        state = {**state, 'start': pos - 2}

      def propose(s, c, dp, draft=draft, k=k):
        # Returns the draft tokens too, or XLA would drop the last token's head and sampling.
        ctx = js.DraftContext(buffer, pos, c, keys, k, js.SamplingConfig(temperature=0),
                              target.config.vocab_size, js.noise.DRAFT)
        proposal = draft.propose(dp, s, ctx)
        return proposal.state, proposal.target_cache, proposal.tokens

      pjit = jax.jit(propose, donate_argnums=(0, 1))
      out['draft_s'][name][k], (_, cache, _) = _timeit(lambda st, dp: pjit(st[0], st[1], dp),
                                                       (state, cache, None), dparams)
  out['round_s'] = time_rounds(params, target, (tok0, len0), drafts, ks, args)
  return out


def time_rounds(params, target, prompt, drafts, ks, args, num_rounds=4):
  """Seconds per round of the real decode step (`speculative_step`, greedy) run `num_rounds`
  times in one `fori_loop` from a prefilled state: what a round costs inside `generate`, all
  included, with no per-round dispatch. Key 'plain' is the plain (K=0) step."""
  greedy = js.SamplingConfig(temperature=0)
  init = jax.jit(js.init_state, static_argnames=('target', 'draft', 'config'))
  out = {}
  for name, (draft, dparams, _) in [('plain', (None, None, 0)), *drafts.items()]:
    for k in ks if draft is not None else [0]:
      statics = dict(target=target, draft=draft, config=js.DecodeConfig(
          num_draft_tokens=k, max_new_tokens=args.max_new_tokens, sampling=greedy))
      state = init(params, dparams, *prompt, js.row_keys([0]), **statics)
      run = round_loop(statics, num_rounds)
      jax.block_until_ready(run(state, params, dparams))  # compile
      times = []
      for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(run(state, params, dparams))
        times.append(time.perf_counter() - t0)
      out.setdefault(name, {})[k] = float(np.median(times)) / num_rounds
  return out


def run_peers(args, prompts_tok, tok):
  """transformers greedy / assisted / prompt lookup in a subprocess (its own python)."""
  os.makedirs(args.out, exist_ok=True)
  spec = dict(gguf=gguf_loader.default_model_path(), prompts=prompts_tok,
              max_new_tokens=args.max_new_tokens, eos_id=tok.eos_id,
              hf_drafts=[d for d in args.hf_drafts.split(',') if d and os.path.isdir(d)],
              prompt_lookup_ks=[int(k) for k in args.ks.split(',')][-1:] or [3])
  path_in, path_out = (os.path.join(args.out, n) for n in ('peers_in.json', 'peers_out.json'))
  with open(path_in, 'w', encoding='utf-8') as f:
    json.dump(spec, f)
  script = os.path.join(ROOT, 'scripts', 'hf_peer_bench.py')
  proc = subprocess.run([args.peers_python, script, path_in, path_out], check=False)
  if proc.returncode != 0:
    print(f'transformers side failed (exit {proc.returncode}); see its output above')
    return []
  with open(path_out, encoding='utf-8') as f:
    return json.load(f)


def add_theory(results, parts, plain_tps):
  """Per (draft, temperature): alpha from each K's tokens per round, c, Theorem 3.8 and
  measured-cost predictions per K, and the K the theorem picks."""
  theory = {}
  for name in {r['method'] for r in results if r['method'] not in ('plain',)}:
    if name not in parts['draft_s']:
      continue
    for temp in {r['temperature'] for r in results}:
      rows = [r for r in results if r['method'] == name and r['temperature'] == temp]
      if not rows:
        continue
      alphas = [speedup.alpha_from_tokens_per_round(r['mean_accepted_length'], r['k'])
                for r in rows]
      alpha = float(np.median(alphas))
      step = parts['target_step_s']
      cs = [parts['draft_s'][name][r['k']] / r['k'] / step for r in rows]
      c = float(np.median(cs))
      for r in rows:
        k = r['k']
        r['alpha_est'] = alpha
        r['c'] = parts['draft_s'][name][k] / k / step
        r['predicted_speedup_thm38'] = speedup.theorem_speedup(alpha, k, r['c'])
        r['predicted_speedup_measured_cost'] = speedup.measured_cost_speedup(
            alpha, k, parts['draft_s'][name][k] / k, parts['verify_s'][k],
            1.0 / plain_tps[temp])
      theory[f'{name}@T{temp:g}'] = dict(alpha=alpha, c=c, best_k=speedup.best_k(alpha, c, 8))
  return theory


def kind_acc(r):
  return ', '.join(f"{k} {v['acceptance_rate']:.3f}" for k, v in r['by_kind'].items())


def _fmt_table(results, peers, hf_greedy_tps):
  lines = ['| method | T | K | tok/s | x plain | x HF greedy | accept | accept by kind | tok/pass '
           '| pred. x (Thm 3.8 / meas. cost) | compile s | peak RSS MB | draft MB |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in results:
    pred = ('' if 'predicted_speedup_thm38' not in r else
            f"{r['predicted_speedup_thm38']:.2f} / {r['predicted_speedup_measured_cost']:.2f}")
    lines.append(
        f"| {r['method']} | {r['temperature']:g} | {r['k']} | {r['tokens_per_s']:.1f} | "
        f"{r['speedup_vs_plain']:.2f} | "
        f"{(r['tokens_per_s'] / hf_greedy_tps) if hf_greedy_tps else float('nan'):.2f} | "
        f"{r['acceptance_rate']:.3f} | {kind_acc(r)} | {r['mean_accepted_length']:.2f} | {pred} | "
        f"{r['compile_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['draft_extra_mb']:.1f} |")
  for p in peers:
    lines.append(f"| HF {p['method']} | 0 | {p.get('k', '')} | {p['tokens_per_s']:.1f} | "
                 f"{p.get('speedup_vs_plain', float('nan')):.2f} | "
                 f"{p['tokens_per_s'] / hf_greedy_tps if hf_greedy_tps else float('nan'):.2f} | "
                 f" | | | | {p.get('load_s', 0):.1f} | | |")
  return '\n'.join(lines)


def _plots(results, args):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  temps = sorted({r['temperature'] for r in results})
  fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    for name in sorted({r['method'] for r in results} - {'plain'}):
      rows = sorted((r for r in results if r['method'] == name and r['temperature'] == temp),
                    key=lambda r: r['k'])
      if rows:
        line, = ax.plot([r['k'] for r in rows], [r['speedup_vs_plain'] for r in rows], 'o-',
                        label=name)
        if 'predicted_speedup_measured_cost' in rows[0]:
          ax.plot([r['k'] for r in rows], [r['predicted_speedup_measured_cost'] for r in rows],
                  '--', color=line.get_color(), alpha=0.6)
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set(title=f'temperature {temp:g} (dashed: predicted)', xlabel='K (drafted tokens)',
           ylabel='speedup over plain decoding')
    ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, 'speedup_vs_k.png'), dpi=120)
  fig, ax = plt.subplots(figsize=(7, 4))
  k_max = max(r['k'] for r in results)
  names = sorted({r['method'] for r in results} - {'plain'})
  width = 0.8 / max(len(names), 1)
  for j, name in enumerate(names):
    rows = [r for r in results if r['method'] == name and r['temperature'] == temps[0]
            and r['k'] == k_max]
    if rows:
      h = np.asarray(rows[0]['accepted_length_histogram'], float)
      ax.bar(np.arange(len(h)) + j * width, h / h.sum(), width, label=name)
  ax.set(title=f'accepted drafted tokens per round (K={k_max}, T={temps[0]:g})',
         xlabel='accepted tokens', ylabel='fraction of rounds')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, 'accepted_length_hist.png'), dpi=120)


def main():
  args = _parse()
  plots = importlib.util.find_spec('matplotlib') is not None
  if not plots:
    print("matplotlib is not installed: the plots will be skipped (pip install -e '.[bench]' "
          'to get them)', file=sys.stderr)
  os.makedirs(args.out, exist_ok=True)
  path = gguf_loader.default_model_path()
  config, params = gguf_loader.load_gguf(path)
  tok = tok_lib.load_tokenizer(path)
  target = llama.LlamaForward(config)
  rows, prompt_ids = _load_prompts(args, tok)
  prompts = js.pad_prompts(prompt_ids, tok.pad_id, bucket=64)
  kinds = [r['kind'] for r in rows]
  ks = [int(k) for k in args.ks.split(',')]
  temps = [float(t) for t in args.temperatures.split(',')]
  drafts = _build_drafts(args, config, params)
  print(f'{len(rows)} prompts (padded to {prompts[0].shape[1]} tokens), '
        f'{args.max_new_tokens} new tokens, K in {ks}, T in {temps}, drafts {list(drafts)}')
  results, plain = [], {}
  for temp in temps:
    r = run_config(params, target, tok, prompts, None, 0, temp, args, kinds)
    plain[temp] = r
    results.append(dict(method='plain', **r))
    print(f"plain T={temp:g}: {r['tokens_per_s']:.1f} tok/s (compile {r['compile_s']:.1f} s)",
          flush=True)
  for name, entry in drafts.items():
    for k in ks:
      for temp in temps:
        r = run_config(params, target, tok, prompts, entry, k, temp, args, kinds)
        if temp == 0:
          r['matches_plain'] = r['outputs'] == plain[temp]['outputs']
        results.append(dict(method=name, **r))
        print(f"{name} K={k} T={temp:g}: {r['tokens_per_s']:.1f} tok/s, accept "
              f"{r['acceptance_rate']:.3f} ({kind_acc(r)}), {r['mean_accepted_length']:.2f} "
              f"tok/pass"
              + (f", matches plain: {r['matches_plain']}" if temp == 0 else ''), flush=True)
  plain_tps = {t: plain[t]['tokens_per_s'] for t in temps}
  for r in results:
    r['speedup_vs_plain'] = r['tokens_per_s'] / plain_tps[r['temperature']]
  parts = time_round_parts(params, target, prompts, drafts, ks, args)
  for r in results:
    if r['method'] in parts['draft_s'] and r['temperature'] == 0:
      r['round_s'] = parts['round_s'][r['method']][r['k']]
      r['draft_round_s'] = parts['draft_s'][r['method']][r['k']]
      r['verify_round_s'] = parts['verify_s'][r['k']]
      r['overhead_round_s'] = r['round_s'] - r['draft_round_s'] - r['verify_round_s']
  theory = add_theory(results, parts, plain_tps)
  peers = run_peers(args, [p for p in prompt_ids], tok) if args.peers_python else []
  hf_greedy = next((p['tokens_per_s'] for p in peers if p['method'] == 'greedy'), None)
  for p in peers:
    p['speedup_vs_plain'] = p['tokens_per_s'] / plain_tps.get(0.0, np.nan)
  table = _fmt_table(results, peers, hf_greedy)
  breakdown = ['| draft | K | round ms | draft ms | verify ms | other ms |', '|---|---|---|---|---|---|']
  for r in results:
    if 'round_s' in r:
      breakdown.append(f"| {r['method']} | {r['k']} | {1e3 * r['round_s']:.1f} | "
                       f"{1e3 * r['draft_round_s']:.1f} | {1e3 * r['verify_round_s']:.1f} | "
                       f"{1e3 * r['overhead_round_s']:.1f} |")
  summary = (f"target step (T=1) {1e3 * parts['target_step_s']:.1f} ms, plain decode step in the "
             f"loop {1e3 * parts['round_s']['plain'][0]:.1f} ms, prefill "
             f"{1e3 * parts['prefill_s']:.1f} ms, verify K+1 tokens: "
             + ', '.join(f'K={k}: {1e3 * v:.1f} ms' for k, v in parts['verify_s'].items())
             + '\ntheory (alpha, c, best K by Thm 3.8): '
             + '; '.join(f"{n}: alpha={t['alpha']:.2f} c={t['c']:.3f} K*={t['best_k']}"
                         for n, t in sorted(theory.items())))
  text = '\n\n'.join([f'command: {" ".join(sys.argv)}', table, '\n'.join(breakdown), summary])
  print(text)
  with open(os.path.join(args.out, 'results.md'), 'w', encoding='utf-8') as f:
    f.write(text)
  with open(os.path.join(args.out, 'benchmark.json'), 'w', encoding='utf-8') as f:
    json.dump(dict(args=vars(args), prompts=[r['prompt'] for r in rows], results=results,
                   parts={k: v for k, v in parts.items()}, theory=theory, peers=peers,
                   devices=[str(d) for d in jax.devices()]), f, indent=1, default=str)
  if plots:
    _plots(results, args)
  print(f'wrote {args.out}/benchmark.json, results.md'
        + (', speedup_vs_k.png, accepted_length_hist.png' if plots else ''))


if __name__ == '__main__':
  main()
