"""Side-by-side benchmark: plain vs speculative decoding of SmolLM2 with each draft, and
`transformers` (greedy `generate`, assisted generation with the exported draft, prompt lookup).

Same prompts (the chat and grounded prompts of data/dev_prompts.jsonl, the evaluation set, chat
template applied), same machine, batch 1, one prompt at a time; every prompt is padded to one
length bucket so each configuration compiles once. Every configuration is compiled and called
once untimed first, then timed interleaved (`--repeats` sweeps over the prompts, each prompt run
by every configuration in turn, the best time kept per prompt), so load hits all alike. For each
configuration: tokens/s, speedup over our plain decoding and over transformers, acceptance rate,
mean accepted length (tokens per target pass), the accepted-length histogram, compile time, the
MB the draft adds, and the process's peak RSS (all configurations' programs are loaded at once). At
temperature 0 it checks that the output equals plain greedy output. It then times the pieces of
a round (draft proposal, verify pass) on their own and the whole round inside the decode loop
(the rest, "other", is the difference: sampling, commit, draft bookkeeping, loop carry; it
can come out negative: each piece is timed in a program of its own, which can cost more than
the same piece inside the round's program, and the machine's noise is of the same size),
estimates alpha and the cost ratio c, and shows Leviathan et al.'s Theorem 3.8 speedup (and the
same with the measured verify cost) next to the measured one, with the K the formula picks.
Writes `<out>/benchmark.json`, `<out>/results.md`, and with matplotlib
(`pip install -e '.[bench]'`) `<out>/speedup_vs_k.png`, `<out>/accepted_length_hist.png`.
The measuring code is `jaxspec.bench_rounds`.

`--mode operations` is what a server sees: the same requests (the selected prompts) served in
batches of each size (`--batch-sizes`; the last batch filled by repeating requests), plain
decoding and each draft, per-request latency (time to first token, time per
output token), throughput over the batch, the memory split (target params, draft params, target
KV cache, draft KV cache / state, from array sizes), the target's work per committed token
relative to plain decoding (Leviathan et al. Theorem 3.11, measured), prefill and compile time
apart, and the batch size where speculation stops paying, per draft. Writes
`<out>/operations.json`, `<out>/operations.md`, and with matplotlib
`<out>/latency_vs_throughput.png`, `<out>/speedup_vs_batch.png`. The measuring code is
`jaxspec.operations`.

  .venv/bin/python scripts/benchmark.py --quick   # 2.5 min on 2 quiet cores
  .venv/bin/python scripts/benchmark.py --peers-python .venv-ref/bin/python   # the full run
  .venv/bin/python scripts/benchmark.py --mode operations --quick   # 21 min here: 21 compiles
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxspec as js  # pylint: disable=g-import-not-at-top
from jaxspec import bench, bench_rounds, operations  # pylint: disable=g-import-not-at-top
from models import cli, loading, prompts as prompt_files  # pylint: disable=g-import-not-at-top

ROOT = cli.ROOT
DRAFTS = ('ngram', 'exit_untrained', 'exit_trained', 'small', 'eagle')
QUICK_DRAFTS = ('ngram', 'exit_trained', 'eagle')
# Per mode, the defaults of the flags left unset: {quick: {flag: value}}.
MODES = {
    'speed': {False: dict(out='runs/benchmark', max_new_tokens=128,
                          num_draft_tokens=[1, 2, 3, 4, 5, 6, 7, 8], temperatures=[0.0, 1.0],
                          drafts=list(DRAFTS), repeats=2),
              True: dict(out='runs/benchmark', max_new_tokens=48, num_draft_tokens=[3],
                         temperatures=[0.0], num_prompts=4, drafts=list(QUICK_DRAFTS),
                         repeats=1)},
    'operations': {False: dict(out='runs/operations', max_new_tokens=64, num_draft_tokens=[3],
                               temperatures=[0.0], batch_sizes=[1, 2, 4, 8, 16, 32],
                               drafts=list(DRAFTS), repeats=3),
                   True: dict(out='runs/operations', max_new_tokens=32, num_draft_tokens=[3],
                              temperatures=[0.0], batch_sizes=[1, 4, 16],
                              drafts=list(QUICK_DRAFTS), repeats=1, num_prompts=4)},
}


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--mode', choices=tuple(MODES), default='speed',
                 help='speed: batch 1, every draft and K, with the round breakdown and Theorem '
                 '3.8;\noperations: batch sizes 1..32, latency, throughput, memory, target work')
  p.add_argument('--quick', action='store_true',
                 help='speed: K=3, T=0, 4 prompts (unless --num-prompts), 48 new tokens, drafts '
                 'ngram,exit_trained,eagle;\noperations: batch sizes 1,4,16, 4 requests (unless '
                 '--num-prompts), 32 new tokens, one timed sweep, the same drafts')
  cli.add_model_flags(p, dtype=False)
  cli.add_prompt_flags(p, prompt_files.DEV_PROMPTS)
  p.add_argument('--prompt-kinds', type=cli.choices_of(prompt_files.KINDS),
                 default='chat,grounded',
                 help=f'comma-separated, from {",".join(prompt_files.KINDS)}')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=None,
                 help='default: speed 128 (quick 48), operations 64 (quick 32)')
  p.add_argument('--num-draft-tokens', type=cli.list_of(cli.positive_int), default=None,
                 help='comma-separated list of K; default: speed 1,...,8 (quick 3), operations 3')
  p.add_argument('--temperatures', type=cli.list_of(cli.nonnegative_float), default=None,
                 help='comma-separated list; default: speed 0,1 (quick 0), operations 0')
  p.add_argument('--batch-sizes', type=cli.list_of(cli.positive_int), default=None,
                 help='operations: comma-separated; default 1,2,4,8,16,32 (quick 1,4,16)')
  p.add_argument('--repeats', type=cli.positive_int, default=None,
                 help='timed sweeps over the prompts (every configuration in turn), the fastest '
                 'kept per prompt; default: speed 2, operations 3 (--quick: 1)')
  p.add_argument('--drafts', type=cli.choices_of(DRAFTS), default=None,
                 help=f'comma-separated, from {",".join(DRAFTS)}; default: all (--quick: '
                 f'{",".join(QUICK_DRAFTS)})')
  p.add_argument('--untrained-exit-layer', type=cli.positive_int, default=8,
                 help='exit_untrained: the target\'s first N layers and its head')
  p.add_argument('--exit-draft', default=os.path.join(ROOT, 'drafts', 'smollm2_exit'))
  p.add_argument('--eagle-draft', default=os.path.join(ROOT, 'drafts', 'smollm2_eagle'))
  p.add_argument('--small-draft', default=os.path.join(ROOT, 'runs', 'smollm2_small'),
                 help='made by scripts/train_draft.py --kind small (43 MB, not committed)')
  p.add_argument('--peers-python', type=cli.existing_file, default=None,
                 help='a python with transformers (e.g. .venv-ref/bin/python); none = skip')
  p.add_argument('--hf-drafts', default='runs/hf_exit,runs/hf_small',
                 help='comma-separated exported HF drafts for assisted generation')
  p.add_argument('--out', default=None,
                 help='folder for the tables, JSON and plots; default runs/benchmark (operations: '
                 'runs/operations)')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args(argv)
  for name, value in MODES[args.mode][args.quick].items():
    if getattr(args, name) in (None, 0):
      setattr(args, name, value)
  return args


def _build_drafts(args, config, params):
  """name -> (draft, draft params), each through `models.loading.load_draft`; a trained draft
  whose directory is missing is skipped, saying so."""
  specs = {'ngram': 'ngram:3', 'exit_untrained': f'early-exit:{args.untrained_exit_layer}',
           'exit_trained': args.exit_draft, 'small': args.small_draft, 'eagle': args.eagle_draft}
  drafts = {}
  for name in args.drafts:
    if not os.path.exists(specs[name]) and ':' not in specs[name]:
      print(f'skipping {name}: no draft at {specs[name]}')
      continue
    drafts[name] = loading.load_draft(specs[name], config, params)
  return drafts


def _draft_extra_mb(entry, params, prompts, args, k):
  """The MB a draft adds at batch 1: its own params and its KV cache / state."""
  draft, dparams = entry
  buffer_len = js.buffer_length(prompts[0].shape[1], args.max_new_tokens, k)
  return (bench.own_param_bytes(dparams, params) +
          bench.draft_cache_bytes(draft, 1, buffer_len)) / 2**20


def run_peers(args, prompts_tok, tok, gguf_path):
  """transformers greedy / assisted / prompt lookup in a subprocess (its own python)."""
  os.makedirs(args.out, exist_ok=True)
  spec = dict(gguf=gguf_path, prompts=prompts_tok,
              max_new_tokens=args.max_new_tokens, eos_id=tok.eos_id,
              hf_drafts=[d for d in args.hf_drafts.split(',') if d and os.path.isdir(d)],
              prompt_lookup_ks=args.num_draft_tokens[-1:])
  path_in, path_out = (os.path.join(args.out, n) for n in ('peers_in.json', 'peers_out.json'))
  with open(path_in, 'w', encoding='utf-8') as f:
    json.dump(spec, f)
  script = os.path.join(ROOT, 'scripts', 'hf_peer_bench.py')
  proc = subprocess.run([args.peers_python, script, '--spec', path_in, '--out', path_out],
                        check=False)
  if proc.returncode != 0:
    print(f'transformers side failed (exit {proc.returncode}); see its output above')
    return []
  with open(path_out, encoding='utf-8') as f:
    return json.load(f)


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
                  'x--', color=line.get_color(), alpha=0.6)  # a marker: one K shows too
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set(title=f'temperature {temp:g} (x, dashed: predicted)', xlabel='K (drafted tokens)',
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
      ax.bar(np.arange(len(h)) + (j - (len(names) - 1) / 2) * width, h / h.sum(), width,
             label=name)  # the group of bars centred on its count
  ax.set_xticks(np.arange(k_max + 1))
  ax.set(title=f'accepted drafted tokens per round (K={k_max}, T={temps[0]:g})',
         xlabel='accepted tokens', ylabel='fraction of rounds')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, 'accepted_length_hist.png'), dpi=120)


def main(argv=None):
  args = _parse(argv)
  plots = importlib.util.find_spec('matplotlib') is not None
  if not plots:
    print("matplotlib is not installed: the plots will be skipped (pip install -e '.[bench]' "
          'to get them)', file=sys.stderr)
  os.makedirs(args.out, exist_ok=True)
  config, params, gguf_path = loading.load_model(args.model)
  gguf_path = gguf_path or loading.gguf_loader.default_model_path()
  tok = loading.tokenizer_for(gguf_path)
  target = loading.forward_for(config)
  rows = prompt_files.select(prompt_files.read_rows(args.prompts_file), args.prompt_kinds,
                             args.num_prompts)
  prompt_ids = [tok.encode_chat(r['prompt']) for r in rows]
  drafts = _build_drafts(args, config, params)
  run = _speed if args.mode == 'speed' else _operations
  run(args, params, target, tok, rows, prompt_ids, drafts, plots, gguf_path)


def _speed(args, params, target, tok, rows, prompt_ids, drafts, plots, gguf_path):
  """The speed mode: batch 1, every draft, K and temperature; the round breakdown."""
  prompts = js.pad_prompts(prompt_ids, tok.pad_id, bucket=64)
  kinds = [r['kind'] for r in rows]
  ks, temps = args.num_draft_tokens, args.temperatures
  print(f'{len(rows)} prompts (padded to {prompts[0].shape[1]} tokens), '
        f'{args.max_new_tokens} new tokens, K in {ks}, T in {temps}, drafts {list(drafts)}')
  methods = {('plain', 0, t): (None, None, _config(args, tok, 0, t)) for t in temps}
  for name, (draft, dparams) in drafts.items():
    for k in ks:
      for t in temps:
        methods[(name, k, t)] = (draft, dparams, _config(args, tok, k, t))
  print(f'{len(methods)} configurations, compiled first, then timed interleaved over '
        f'{args.repeats} sweep(s)', flush=True)
  decoded = bench_rounds.decode_each(params, prompts, kinds, methods, target=target,
                                     seed=args.seed, repeats=args.repeats)
  results, plain = [], {t: decoded[('plain', 0, t)] for t in temps}
  for (name, k, t), r in decoded.items():
    if name == 'plain':
      r['draft_extra_mb'] = 0.0
      print(f"plain T={t:g}: {r['tokens_per_s']:.1f} tok/s (compile {r['compile_s']:.1f} s)")
    else:
      r['draft_extra_mb'] = _draft_extra_mb(drafts[name], params, prompts, args, k)
      if t == 0:
        r['matches_plain'] = r['outputs'] == plain[t]['outputs']
      print(f"{name} K={k} T={t:g}: {r['tokens_per_s']:.1f} tok/s, accept "
            f"{r['acceptance_rate']:.3f} ({kind_acc(r)}), {r['mean_accepted_length']:.2f} "
            f"tok/pass" + (f", matches plain: {r['matches_plain']}" if t == 0 else ''))
    results.append(dict(method=name, **r))
  plain_tps = {t: plain[t]['tokens_per_s'] for t in temps}
  for r in results:
    r['speedup_vs_plain'] = r['tokens_per_s'] / plain_tps[r['temperature']]
  parts = bench_rounds.time_round_parts(params, target, prompts, drafts, ks,
                                        args.max_new_tokens)
  for r in results:
    if r['method'] in parts['draft_s'] and r['temperature'] == 0:
      r['round_s'] = parts['round_s'][r['method']][r['k']]
      r['draft_round_s'] = parts['draft_s'][r['method']][r['k']]
      r['verify_round_s'] = parts['verify_s'][r['k']]
      r['overhead_round_s'] = r['round_s'] - r['draft_round_s'] - r['verify_round_s']
  theory = bench_rounds.add_theory(results, parts, plain_tps)
  if not args.peers_python:
    print('no --peers-python: the transformers comparison is skipped (x HF greedy: nan)')
  peers = run_peers(args, prompt_ids, tok, gguf_path) if args.peers_python else []
  hf_greedy = next((p['tokens_per_s'] for p in peers if p['method'] == 'greedy'), None)
  for p in peers:
    p['speedup_vs_plain'] = p['tokens_per_s'] / plain_tps.get(0.0, np.nan)
  _speed_report(args, rows, results, parts, theory, peers, hf_greedy, plots)


def _speed_report(args, rows, results, parts, theory, peers, hf_greedy, plots):
  """Prints the speed mode's tables and writes results.md, benchmark.json and the plots."""
  table = _fmt_table(results, peers, hf_greedy)
  breakdown = ['| draft | K | round ms | draft ms | verify ms | other ms |',
               '|---|---|---|---|---|---|']
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
    f.write(text + '\n')
  with open(os.path.join(args.out, 'benchmark.json'), 'w', encoding='utf-8') as f:
    json.dump(dict(args=vars(args), prompts=[r['prompt'] for r in rows], results=results,
                   parts={k: v for k, v in parts.items()}, theory=theory, peers=peers,
                   devices=[str(d) for d in jax.devices()]), f, indent=1, default=str)
  if plots:
    _plots(results, args)
  print(f'wrote {args.out}/benchmark.json, results.md'
        + (', speedup_vs_k.png, accepted_length_hist.png' if plots else ''))


def _operations(args, params, target, tok, rows, prompt_ids, drafts, plots, gguf_path):
  """The operations mode: every batch size, plain and each draft (`jaxspec.operations`)."""
  del gguf_path
  tokens, lengths = js.pad_prompts(prompt_ids, tok.pad_id, bucket=64)  # one P for every batch
  seeds = args.seed * 1000 + np.arange(len(rows))  # a request keeps its seed at every B
  k, temp = args.num_draft_tokens[0], args.temperatures[0]
  print(f'operations: {len(rows)} requests (padded to {tokens.shape[1]} tokens) served in '
        f'batches of {args.batch_sizes} (the last batch filled by repeating requests), '
        f'{args.max_new_tokens} new tokens, K={k}, T={temp:g}, drafts {list(drafts)}',
        flush=True)
  plain, fixed = _config(args, tok, 0, temp), _config(args, tok, k, temp)
  results = []
  for b in args.batch_sizes:
    batches = operations.batches_of(tokens, lengths, seeds, b)
    methods = {'plain': (None, None, plain)}
    for n, (draft, dparams) in drafts.items():
      methods[f'{n} K={k}'] = (draft, dparams, fixed)
      # K in 0..K chosen per round inside the loop, round costs measured on this batch size
      print(f'B={b}: measuring the round cost of each K for {n} auto', flush=True)
      auto = js.measured_cost_model(params, dparams, *batches[0], target=target, draft=draft,
                                    config=fixed, more_prompts=batches[1:])
      methods[f'{n} auto'] = (draft, dparams, dataclasses.replace(fixed, schedule=auto))
    print(f'B={b}: compiling {len(methods)} methods, then timing them interleaved over '
          f'{len(batches)} batch(es)', flush=True)
    runs = operations.measure(params, batches, methods, target=target, reps=args.repeats)
    for name, r in runs.items():
      results.append(dict(method=name, temperature=temp, **r))
      print(f"B={b} ({r['num_batches']} batches) {name}: {r['tokens_per_s']:.1f} tok/s, accept "
            f"{r['acceptance_rate']:.3f}, TTFT {1e3 * r['ttft_s']:.0f} ms, TPOT "
            f"{1e3 * r['tpot_s']:.1f} ms (compile {r['compile_s']:.1f} s)", flush=True)
    _write_json(args, rows, results, {})  # so far, in case the run is cut short
  operations.add_relative(results)
  stops = operations.stops_paying(results)
  text = '\n\n'.join([f'command: {" ".join(sys.argv)}', _ops_table(results),
                       _stops_text(stops, args.batch_sizes)])
  print(text)
  with open(os.path.join(args.out, 'operations.md'), 'w', encoding='utf-8') as f:
    f.write(text + '\n')
  _write_json(args, rows, results, stops)
  if plots:
    _ops_plots(results, args)
  print(f'wrote {args.out}/operations.json, operations.md'
        + (', latency_vs_throughput.png, speedup_vs_batch.png' if plots else ''))


def _config(args, tok, k, temperature, **kw):
  return js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                         sampling=js.SamplingConfig(temperature=temperature), eos_id=tok.eos_id,
                         pad_id=tok.pad_id, **kw)


def _write_json(args, rows, results, stops):
  with open(os.path.join(args.out, 'operations.json'), 'w', encoding='utf-8') as f:
    json.dump(dict(args=vars(args), prompts=[r['prompt'] for r in rows], results=results,
                   stops_paying=stops, devices=[str(d) for d in jax.devices()]), f, indent=1)


def _ops_table(results):
  mb = lambda r, part: r['memory'][part] / 2**20
  lines = ['| method | B | TTFT ms | TPOT ms | tok/s (best) | x plain tok/s (all sweeps) | '
           'x plain TPOT | target work x plain | accept | target params MB | draft params MB | '
           'target KV MB | draft state MB | prefill ms | compile s |', '|---' * 15 + '|']
  for r in results:
    lines.append(
        f"| {r['method']} | {r['batch_size']} | {1e3 * r['ttft_s']:.0f} | "
        f"{1e3 * r['tpot_s']:.1f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f} | "
        f"{r['latency_speedup']:.2f} | {r['target_work_vs_plain']:.2f} | "
        f"{r['acceptance_rate']:.3f} | {mb(r, 'target_params'):.0f} | "
        f"{mb(r, 'draft_params'):.1f} | {mb(r, 'target_kv_cache'):.1f} | "
        f"{mb(r, 'draft_state'):.1f} | {1e3 * r['prefill_s']:.0f} | {r['compile_s']:.1f} |")
  return '\n'.join(lines)


def _stops_text(stops, batch_sizes):
  lines = ['where speculation stops paying (throughput below plain decoding from this batch '
           'size on):']
  for name, b in stops.items():
    lines.append(f'- {name}: ' + (f'pays up to the largest batch measured ({max(batch_sizes)})'
                                  if b is None else
                                  'never pays' if b == min(batch_sizes) else f'B = {b}'))
  return '\n'.join(lines)


def _ops_plots(results, args):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  methods = sorted({r['method'] for r in results}, key=lambda m: (m != 'plain', m))
  color = {name: f'C{i}' for i, name in enumerate(methods)}  # one color a method in both plots
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name in methods:
    rows = sorted((r for r in results if r['method'] == name), key=lambda r: r['batch_size'])
    ax.plot([r['tokens_per_s'] for r in rows], [1e3 * r['tpot_s'] for r in rows], 'o-',
            label=name, color=color[name])
    for r in rows:
      ax.annotate(str(r['batch_size']), (r['tokens_per_s'], 1e3 * r['tpot_s']), fontsize=7)
  ax.set(title='latency vs throughput (labels: batch size)', xlabel='tokens/s (batch)',
         ylabel='time per output token (ms)')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, 'latency_vs_throughput.png'), dpi=120)
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in methods[1:]:
    rows = sorted((r for r in results if r['method'] == name), key=lambda r: r['batch_size'])
    ax.plot([r['batch_size'] for r in rows], [r['speedup'] for r in rows], 'o-', label=name,
            color=color[name])
  ax.axhline(1.0, color='gray', lw=0.8)
  ax.set(title='speedup vs batch size', xlabel='batch size', xscale='log',
         ylabel='throughput / plain throughput')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, 'speedup_vs_batch.png'), dpi=120)


if __name__ == '__main__':
  main()
