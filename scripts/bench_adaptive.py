"""Adaptive K against every fixed K, one run: plain decoding, each fixed K, transformers'
heuristic schedule and `auto` (`jaxspec.CostModel` with round costs measured at start-up), per
draft, prompt kind (dev chat / grounded), temperature and batch size; tokens/s side by side.

At batch 1 every prompt is decoded alone (all padded to one bucket, so a configuration compiles
once); at batch B the kind's prompts are repeated to fill B rows (distinct seeds) in one call.
Compile time and the cost measurement are reported apart, never inside tokens/s; `auto` is
measured once a cell (prices on its first batch, the prior and bound from every batch's start-up
rounds: one program serves them all). At temperature 0 every configuration must reproduce plain
greedy tokens (checked). At temperature > 0 the
methods draw different samples, so rows decode exactly --max-new-tokens tokens, past the
end-of-turn token (as throughput benchmarks do with ignore_eos): stopping there would give each
method its own sequence lengths and so its own share of prefill in tokens/s. Plain decoding is
timed twice, as two methods ('plain' and 'plain again', the same program): the second's ratio to
the first is the run's own noise, printed beside the ratios it qualifies. Every other ratio 'x'
is `bench_rounds.sweep_speedup` (tokens over seconds summed over all sweeps, the method's over
plain's: a best time keeps one lucky call, and a copy of one program read x1.05 by best times at
batch 32 here) against plain's two copies pooled (`bench_rounds.pooled_reference`: two
measurements of one speed; the JSON keeps each method's ratio to the first copy alone too, as
'speedup_first_plain'); tok/s are from best times. Writes `<out>/adaptive.json` and
`<out>/adaptive.md`, whose last column and line say which cells meet issue 12's bars, and a
line setting plain decoding's round against the weight-read floor (the target's weight bytes
over this machine's copy bandwidth, as bench_verify_cost.py).

  .venv/bin/python scripts/bench_adaptive.py --quick
  # issue 12's whole figure in one run (~95 min on the 2-core CPU of docs/adaptive.md, run 44;
  # run 45 took as long with --batch-repeats 16):
  # the batch-1 grid, and batch 16 and 32 on chat at T = 0
  .venv/bin/python scripts/bench_adaptive.py --prompt-kinds chat,grounded --num-prompts 3 \\
      --max-new-tokens 48 --temperatures 0,1 --num-draft-tokens 1,4 --max-draft-tokens 4 \\
      --batch-sizes 1,16,32 --batch-cells chat:0 --batch-num-draft-tokens 1 --no-heuristic \\
      --repeats 8 --batch-repeats 8
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import jaxspec as js
from jaxspec import bench, bench_rounds, speedup
from models import cli, loading, prompts as prompt_files

DRAFTS = ','.join(['ngram', os.path.join(cli.ROOT, 'drafts', 'smollm2_exit'),
                   os.path.join(cli.ROOT, 'drafts', 'smollm2_eagle')])


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--drafts', default=DRAFTS,
                 type=cli.list_of(cli.parsed_by(loading.parse_draft_spec, keep_text=True)),
                 help='comma-separated draft specs, as decode.py --draft (default: ngram and the '
                 'committed exit and EAGLE drafts)')
  cli.add_prompt_flags(p, prompt_files.DEV_PROMPTS)
  p.add_argument('--prompt-kinds', type=cli.choices_of(prompt_files.KINDS),
                 default='chat,grounded', help=f'comma-separated, from '
                 f'{",".join(prompt_files.KINDS)}; --num-prompts is per kind')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=64,
                 help='new tokens a prompt (exactly this many at T > 0; default 64)')
  p.add_argument('--num-draft-tokens', type=cli.list_of(cli.positive_int), default=[1, 2, 3, 4],
                 help='comma-separated list of the fixed K to compare with (default 1,2,3,4)')
  p.add_argument('--max-draft-tokens', type=cli.positive_int, default=4,
                 help='the largest K auto and the heuristic may pick (default 4)')
  p.add_argument('--temperatures', type=cli.list_of(cli.nonnegative_float), default=[0.0, 1.0],
                 help='comma-separated sampling temperatures; 0 = greedy (default 0,1)')
  p.add_argument('--batch-sizes', type=cli.list_of(cli.positive_int), default=[1],
                 help='comma-separated batch sizes (default 1)')
  p.add_argument('--batch-cells', type=cli.list_of(_cell), default=None,
                 help='comma-separated KIND:TEMPERATURE cells (e.g. chat:0) decoded at the batch '
                 'sizes > 1 (default: every kind and temperature)')
  p.add_argument('--batch-num-draft-tokens', type=cli.list_of(cli.positive_int), default=None,
                 help='the fixed K compared at batch sizes > 1 (default: --num-draft-tokens)')
  p.add_argument('--heuristic', action=argparse.BooleanOptionalAction, default=True,
                 help="time transformers' heuristic schedule at batch 1 (default: on)")
  p.add_argument('--repeats', type=cli.positive_int, default=2,
                 help='timed sweeps over the methods (tok/s: the best; x: all of them; default 2)')
  p.add_argument('--batch-repeats', type=cli.positive_int, default=None,
                 help='timed sweeps at batch sizes > 1, whose cells are noisier here (default: '
                 '--repeats)')
  p.add_argument('--seed', type=int, default=0, help='PRNG seed of the sampled runs (default 0)')
  p.add_argument('--quick', action='store_true', help='n-gram only, 2 prompts a kind, 32 tokens')
  p.add_argument('--out', default=os.path.join(cli.ROOT, 'runs', 'adaptive'),
                 help='output directory for the tables and JSON (default runs/adaptive)')
  p.add_argument('--render', action='store_true',
                 help="rewrite --out's adaptive.md from its adaptive.json and print it (no model "
                 'is loaded, nothing is timed)')
  args = p.parse_args(argv)
  if args.render:
    path = os.path.join(args.out, 'adaptive.json')
    if not os.path.isfile(path):
      p.error(f'--render: no {path}')
    return args
  if args.quick:
    args.drafts, args.num_prompts, args.max_new_tokens = ['ngram'], 2, 32
  args.num_prompts = args.num_prompts or 4
  args.batch_num_draft_tokens = args.batch_num_draft_tokens or args.num_draft_tokens
  args.batch_repeats = args.batch_repeats or args.repeats
  for flag in ('num_draft_tokens', 'batch_num_draft_tokens'):
    if not all(k <= args.max_draft_tokens for k in getattr(args, flag)):
      p.error(f'--{flag.replace("_", "-")} must lie in [1, --max-draft-tokens='
              f'{args.max_draft_tokens}]')
  every = [(kind, t) for kind in args.prompt_kinds for t in args.temperatures]
  args.batch_cells = args.batch_cells or every
  for kind, t in args.batch_cells:
    if (kind, t) not in every:
      p.error(f'--batch-cells: {kind}:{t:g} is not a cell of --prompt-kinds '
              f'{",".join(args.prompt_kinds)} and --temperatures '
              f'{",".join(f"{t:g}" for t in args.temperatures)}')
  return args


def _cell(text: str) -> tuple[str, float]:
  """A KIND:TEMPERATURE cell of the grid, e.g. 'chat:0'."""
  kind, sep, t = text.partition(':')
  if not sep or kind not in prompt_files.KINDS:
    raise argparse.ArgumentTypeError(f'{text!r}: must be KIND:TEMPERATURE with KIND one of '
                                     f'{", ".join(prompt_files.KINDS)}')
  return kind, cli.nonnegative_float(t)


def _batches(prompt_ids, batch_size, seed, pad_id):
  """Batch 1: one batch per prompt; else one batch of `batch_size` rows cycling the prompts."""
  width = max(len(p) for p in prompt_ids)
  bucket = -(-width // 64) * 64
  pad = lambda rows: js.pad_prompts(rows, pad_id=pad_id, bucket=bucket)
  if batch_size == 1:
    return [(*pad([p]), np.array([seed + i])) for i, p in enumerate(prompt_ids)]
  rows = [prompt_ids[i % len(prompt_ids)] for i in range(batch_size)]
  return [(*pad(rows), seed + np.arange(batch_size))]


def main():
  args = _parse()
  if args.render:
    with open(os.path.join(args.out, 'adaptive.json'), encoding='utf-8') as f:
      stored = json.load(f)
    print(_write(argparse.Namespace(**{**stored['args'], 'out': args.out}), stored['results'],
                 stored.get('floor')))
    return
  config, target_params, gguf = loading.load_model(args.model)
  floor = dict(weight_bytes=bench.nbytes(target_params),
               copy_bytes_per_s=bench.host_copy_bandwidth())
  tok = loading.tokenizer_for(gguf)
  target, eos = loading.forward_for(config), tok.chat_eos_id
  rows = prompt_files.read_rows(args.prompts_file)
  drafts = {spec: loading.load_draft(spec, config, target_params, target_tokenizer=tok)
            for spec in args.drafts}

  def decode_config(k, sampling, **kw):
    stop = eos if sampling.temperature == 0 else None  # same lengths for every method
    return js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                           sampling=sampling, eos_id=stop, pad_id=eos, **kw)

  results = []
  for kind in args.prompt_kinds:
    ids = [tok.encode_chat(r['prompt']) for r in rows if r['kind'] == kind][:args.num_prompts]
    for b in args.batch_sizes:
      batches = _batches(ids, b, args.seed, eos)
      for temperature in args.temperatures:
        if b > 1 and (kind, temperature) not in args.batch_cells:
          continue
        sampling = js.SamplingConfig(temperature=temperature)
        plain_config = decode_config(0, sampling)
        methods = {'plain': (None, None, plain_config), 'plain again': (None, None, plain_config)}
        measured = {}
        for spec, (draft, dp) in drafts.items():
          name = os.path.basename(spec)
          for k in args.num_draft_tokens if b == 1 else args.batch_num_draft_tokens:
            methods[f'{name} K={k}'] = (draft, dp, decode_config(k, sampling))
          if b == 1 and args.heuristic:
            methods[f'{name} heuristic'] = (draft, dp, decode_config(
                args.max_draft_tokens, sampling, schedule=js.Heuristic()))
          full = decode_config(args.max_draft_tokens, sampling)
          model, measure_s = bench_rounds.wall_time(lambda: js.measured_cost_model(
              target_params, dp, *batches[0], target=target, draft=draft, config=full,
              more_prompts=batches[1:]))  # one model for every prompt: its prior from all
          measured[name] = (measure_s, [1e3 * c for c in model.round_seconds], model.prior,
                            model.max_acceptance, list(model.paying()))
          methods[f'{name} auto'] = (draft, dp, decode_config(args.max_draft_tokens, sampling,
                                                              schedule=model))
        runs = bench_rounds.time_methods(target_params, batches, methods, target=target,
                                         repeats=args.repeats if b == 1 else args.batch_repeats)
        plain = runs['plain']
        speedups = bench_rounds.speedups_over_plain(runs)
        for method, r in runs.items():
          draft_name, _, how = ('plain', '', method) if method.startswith('plain') else (
              method.partition(' '))
          r['speedup'], r['speedup_se'] = speedups[method]
          r['speedup_first_plain'] = bench_rounds.sweep_speedup(r, plain)
          r['speedup_best_times'] = r['tok_s'] / plain['tok_s']
          if temperature == 0:
            r['identical'] = r['tokens'] == plain['tokens']
          if how == 'auto':
            (r['measure_s'], r['round_ms'], r['prior'], r['max_acceptance'],
             r['paying']) = measured[draft_name]
          results.append(dict(kind=kind, batch_size=b, temperature=temperature,
                              draft=draft_name, method=how, **r))
          print(f'{kind} B={b} T={temperature:g} {method}: {r["tok_s"]:.1f} tok/s '
                f'x{r["speedup"]:.2f} ±{r["speedup_se"]:.2f} (best times '
                f'x{r["speedup_best_times"]:.2f}) accept '
                f'{r["acceptance"]:.2f} K rounds {r["rounds_by_k"]}'
                + (f' round ms {[round(c, 1) for c in r["round_ms"]]} prior {r["prior"]:.2f} '
                   f'max acceptance {r["max_acceptance"]:.2f} compiled K {r["paying"]}'
                   if how == 'auto' else ''),
                flush=True)
        _write(args, results, floor)  # every finished cell, in case the run is cut short
  print(_write(args, results, floor))


def _write(args, results, floor=None):
  """Writes `<out>/adaptive.json` and `<out>/adaptive.md` (the table, returned) from the rows so
  far (their token ids left out), with the floor line (`_floor_line`) when `floor` is given."""
  os.makedirs(args.out, exist_ok=True)
  rows = [{k: v for k, v in r.items() if k != 'tokens'} for r in results]
  with open(os.path.join(args.out, 'adaptive.json'), 'w', encoding='utf-8') as f:
    json.dump({'args': vars(args), 'floor': floor, 'results': rows}, f, indent=1)
  table = _table(rows) + _floor_line(rows, floor)
  with open(os.path.join(args.out, 'adaptive.md'), 'w', encoding='utf-8') as f:
    f.write(table)
  return table


def _table(results):
  """Per (kind, batch, temperature, draft): tok/s (best times) and x plain (over all sweeps) of
  each method, the best fixed K, auto's ratio to the better of plain and the best fixed K (by the
  same ratios), auto's K per round (histogram over K = 0..), acceptance at K=1 and under auto,
  and greedy identity; 'plain again' (the same plain program timed again, x of the first) is the
  cell's noise, every other x is over both copies pooled, and '±' the standard error of the
  method's x plain over the sweeps (`bench_rounds.sweep_speedup_error`). 'auto priced' is
  `_priced`: the schedule's choices without the clock's noise. 'bars' is issue 12's: at batch 1
  `auto` >= 0.97x plain and >= 0.95 of the best fixed K; at batch > 1 `auto` >= 0.95 of the
  faster of plain and the best fixed K. A last line counts the cells that meet them."""
  methods = list(dict.fromkeys(r['method'] for r in results if r['draft'] != 'plain'))
  head = (['kind', 'B', 'T', 'draft', 'plain tok/s', 'plain again'] + methods +
          ['best fixed', 'auto / max(plain, best fixed)', 'auto rounds by K', 'accept K=1 / auto',
           'Thm 3.8 best K (x predicted)', 'auto priced (x plain)', 'identical', 'bars'])
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  cells, met_cells = {}, []
  for r in results:
    cells.setdefault((r['kind'], r['batch_size'], r['temperature']), []).append(r)
  for (kind, b, t), rs in cells.items():
    plain = next(r for r in rs if r['method'] == 'plain')
    again = next((f'x{r["speedup"]:.2f} ±{r["speedup_se"]:.2f}' for r in rs
                  if r['method'] == 'plain again'), '-')
    for draft in dict.fromkeys(r['draft'] for r in rs if r['draft'] != 'plain'):
      by = {r['method']: r for r in rs if r['draft'] == draft}
      fixed = {m: r for m, r in by.items() if m.startswith('K=')}
      best = max(fixed, key=lambda m: fixed[m]['speedup'])
      ref = max(1.0, fixed[best]['speedup'])
      same = all(r.get('identical', True) for r in by.values())
      row = [kind, str(b), f'{t:g}', draft, f'{plain["tok_s"]:.1f}', again]
      row += [f'{by[m]["tok_s"]:.1f} (x{by[m]["speedup"]:.2f})' if m in by else '-'
              for m in methods]
      auto = by['auto']['speedup']
      met = auto / ref >= 0.95 and (b > 1 or auto >= 0.97)
      met_cells += [met]
      row += [best, f'{auto / ref:.2f} ±{by["auto"]["speedup_se"]:.2f}',
              str(by['auto']['rounds_by_k']),
              f'{by["K=1"]["acceptance"]:.2f} / {by["auto"]["acceptance"]:.2f}' if 'K=1' in by
              else '-', _predicted(by), _priced(by['auto'], plain, b),
              ('yes' if same else 'NO') if t == 0 else '-',
              'yes' if met else 'NO']
      lines.append('| ' + ' | '.join(row) + ' |')
  lines.append(f'\nbars met in {sum(met_cells)} of {len(met_cells)} cells')
  return '\n'.join(lines) + '\n'


def _floor_line(results, floor) -> str:
  """Plain decoding's round against the physical floor: `floor` (weight_bytes: the target's
  parameter bytes; copy_bytes_per_s: `bench.host_copy_bandwidth`, read + written bytes) gives
  the weight-read floor, weight_bytes / copy_bytes_per_s seconds a round (every weight read
  once; bench_verify_cost.py's floor); a plain round is plain's best seconds over its rounds
  summed over the batches (prefill included), per batch size (the fastest cell). '' without
  `floor` (runs stored before it)."""
  if not floor:
    return ''
  floor_ms = 1e3 * floor['weight_bytes'] / floor['copy_bytes_per_s']
  rounds = {}
  for r in results:
    if r['method'] == 'plain':
      ms = 1e3 * sum(r['batch_seconds']) / sum(r['batch_rounds'])
      rounds[r['batch_size']] = min(ms, rounds.get(r['batch_size'], ms))
  plain = ', '.join(f'B={b} {ms:.1f} ms ({ms / floor_ms:.2f}x)' for b, ms in rounds.items())
  return (f'\nweight-read floor {floor_ms:.1f} ms a round ({floor["weight_bytes"] / 1e6:.0f} MB '
          f'of weights / {floor["copy_bytes_per_s"] / 1e9:.1f} GB/s copy bandwidth); plain '
          f'decoding\'s round: {plain}\n')


def _priced(auto, plain, batch_size):
  """At batch 1: what auto's choices cost at its own start-up prices, off the clock: plain's
  rounds x round_ms[0] over the sum of auto's rounds at each K x round_ms[K] (each K's price
  measured in the one program that compiles every K, so the switch's own cost is not in it).
  '-' at batch > 1 (rounds_by_k counts row-rounds there)."""
  if batch_size != 1 or 'round_ms' not in auto:
    return '-'
  cost = np.dot(auto['rounds_by_k'], auto['round_ms'])
  return f'x{sum(plain["rounds_by_k"]) * auto["round_ms"][0] / cost:.3f}'


def _predicted(by):
  """Leviathan et al. Theorem 3.8 with measured costs: alpha from the K=1 run's acceptance, the
  round cost of each K from auto's start-up measurement; the best K (0 = plain) and its
  predicted speedup E(alpha, K) * cost(0) / cost(K)."""
  if 'K=1' not in by or 'auto' not in by:
    return '-'
  alpha, cost = by['K=1']['acceptance'], by['auto']['round_ms']
  pred = [speedup.expected_tokens(alpha, k) * cost[0] / c for k, c in enumerate(cost)]
  k = int(np.argmax(pred))
  return f'{k} (x{pred[k]:.2f})'


if __name__ == '__main__':
  main()
