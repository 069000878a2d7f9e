"""How steady `auto`'s start-up prices are: the round costs `measured_cost_model` takes at
start-up (`jaxspec.schedule.measure_round_sweeps`: 8 rounds at each K, 5 to 20 sweeps), taken
--trials times in a row on the first prompt of --prompt-kind (as bench_adaptive.py's `auto`
does), each draft in turn, and priced three ways from the same sweeps: `round_costs` (each K's
mean over the sweeps), the plain round's median times each K's median ratio to it within a
sweep, and the best time. Prints, per draft and K, the price
of a K-round in plain rounds: its mean, standard deviation and range over the trials, for each
estimator, and its root-mean-square distance from the prices of every trial's sweeps pooled.
`auto` compares these ratios, so their spread is how far one decode's choices can be off.

  .venv/bin/python scripts/bench_prices.py --prompt-kind grounded \\
      --drafts ngram,drafts/smollm2_exit,drafts/smollm2_eagle --trials 8 --max-repeats 5
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import jaxspec as js
from jaxspec import schedule
from models import cli, loading, prompts as prompt_files

ROUNDS = schedule.STARTUP_ROUNDS  # measured_cost_model's


def _costs_by(statistic, sweeps: dict, ks) -> np.ndarray:
  """Each K's `statistic` over its sweeps (the minimum: a best time), made non-decreasing in K."""
  return np.maximum.accumulate([statistic(sweeps[k]) / ROUNDS for k in ks])


def _paired_median_costs(sweeps: dict, ks) -> np.ndarray:
  """The plain round's median over sweeps times each K's median ratio to the plain round of the
  same sweep (a slow sweep of one K moves neither), made non-decreasing in K."""
  times = np.asarray([sweeps[k] for k in ks], dtype=np.float64)  # [K, sweeps], ks from 0
  return np.maximum.accumulate(np.median(times[0]) / ROUNDS * np.median(times / times[0], axis=1))


ESTIMATORS = {'mean (round_costs)': lambda sweeps, ks: schedule.round_costs(sweeps, ks, ROUNDS),
              'median of paired ratios': _paired_median_costs,
              'best time': lambda sweeps, ks: _costs_by(np.min, sweeps, ks)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--prompt-kind', choices=prompt_files.KINDS, default='chat',
                 help='price on the first prompt of this kind in --prompts-file (default chat)')
  cli.add_prompt_flags(p, prompt_files.DEV_PROMPTS)
  p.add_argument('--drafts', default=['ngram'],
                 type=cli.list_of(cli.parsed_by(loading.parse_draft_spec, keep_text=True)),
                 help='comma-separated draft specs, as decode.py --draft (default ngram)')
  p.add_argument('--max-draft-tokens', type=cli.positive_int, default=4)
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=48)
  p.add_argument('--batch-size', type=cli.positive_int, default=1)
  p.add_argument('--temperature', type=cli.nonnegative_float, default=0.0)
  p.add_argument('--trials', type=cli.positive_int, default=8,
                 help='start-up measurements per draft (default 8)')
  p.add_argument('--repeats', type=cli.positive_int, default=5,
                 help='sweeps per measurement, at least (default 5, measured_cost_model\'s)')
  p.add_argument('--max-repeats', type=cli.positive_int, default=20,
                 help='sweeps per measurement, at most (default 20, measured_cost_model\'s)')
  p.add_argument('--budget-s', type=cli.nonnegative_float, default=20.0,
                 help='more sweeps while the sweeps so far took less than this (default 20 s, '
                 'measured_cost_model\'s)')
  args = p.parse_args(argv)
  if args.max_repeats < args.repeats:
    p.error(f'--max-repeats {args.max_repeats} is below --repeats {args.repeats}')
  rows = prompt_files.select(prompt_files.read_rows(args.prompts_file), [args.prompt_kind], 1)
  if not rows:
    p.error(f'--prompt-kind {args.prompt_kind}: no such prompts in {args.prompts_file}')
  config, params, gguf = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf)
  tokens, lengths = js.pad_prompts([tok.encode_chat(rows[0]['prompt'])] * args.batch_size,
                                   pad_id=tok.pad_id, bucket=64)
  seeds = np.arange(args.batch_size)
  decode = js.DecodeConfig(num_draft_tokens=args.max_draft_tokens,
                           max_new_tokens=args.max_new_tokens,
                           sampling=js.SamplingConfig(temperature=args.temperature))
  ks = tuple(range(args.max_draft_tokens + 1))
  target = loading.forward_for(config)
  print(f'{args.prompt_kind} prompt 1, batch {args.batch_size}, T={args.temperature:g}: a '
        f'K-round in plain rounds over {args.trials} start-ups (mean ±sd [min, max])')
  for spec in args.drafts:
    draft, draft_params = loading.load_draft(spec, config, params, target_tokenizer=tok)
    prices, every = {name: [] for name in ESTIMATORS}, {k: [] for k in ks}
    for trial in range(args.trials):
      sweeps = schedule.measure_round_sweeps(params, draft_params, tokens, lengths, seeds,
                                             target=target, draft=draft,
                                             config=decode, ks=ks, rounds=ROUNDS,
                                             repeats=args.repeats, max_repeats=args.max_repeats,
                                             budget_s=args.budget_s)[0]
      for name, estimate in ESTIMATORS.items():
        costs = estimate(sweeps, ks)
        prices[name].append(np.asarray(costs) / costs[0])
      for k in ks:
        every[k] += sweeps[k]
      print(f'  {os.path.basename(spec)} trial {trial + 1}, {len(sweeps[0])} sweeps: plain round '
            f'{1e3 * np.median(sweeps[0]) / ROUNDS:.1f} ms (median), sweeps ms '
            f'{ {k: [round(1e3 * t / ROUNDS, 1) for t in v] for k, v in sweeps.items()} }',
            flush=True)
    pooled = _paired_median_costs(every, ks)
    pooled /= pooled[0]
    print(f'{os.path.basename(spec)} every sweep of every trial, median of paired ratios: '
          + ', '.join(f'K={k}: {pooled[k]:.2f}' for k in ks[1:]))
    for name, ratios in prices.items():
      r = np.asarray(ratios)
      sd = r.std(axis=0, ddof=1) if len(r) > 1 else np.zeros(len(ks))
      cells = ', '.join(f'K={k}: {r[:, k].mean():.2f} ±{sd[k]:.2f} '
                        f'[{r[:, k].min():.2f}, {r[:, k].max():.2f}]' for k in ks[1:])
      rms = np.sqrt(np.mean((r[:, 1:] - pooled[1:]) ** 2))
      print(f'{os.path.basename(spec)} {name}: {cells}; rms off the pooled prices {rms:.3f}',
            flush=True)


if __name__ == '__main__':
  main()
