"""What a schedule's decisions gain or lose, off the machine's clock (`jaxspec.simulate`).

`auto` (`jaxspec.CostModel` given the round costs) and transformers' heuristic schedule decide
round after round against a synthetic draft whose drafted token i is accepted with probability
--acceptance[i] (given the tokens before it were), each round charged --round-ms of its K; the
fixed K are Leviathan et al.'s expected tokens over their cost. Ratios are tokens per unit of
cost over plain decoding's. Each run starts from the schedule's initial state, as a fresh
`generate` call per prompt does (48 new tokens at batch 1 are ~40 rounds).

  .venv/bin/python scripts/simulate_schedule.py --acceptance 0.2,0.15,0.1,0.1 \\
      --round-ms 35.9,47.3,57.2,69.5,82.9      # the trained exit draft's costs, docs/adaptive.md
  .venv/bin/python scripts/simulate_schedule.py --acceptance 0.1,0.1,0.1,0.1 \\
      --round-ms 1,1.19,1.3,1.32,1.35 --prior-weights 1,2   # two settings side by side
  .venv/bin/python scripts/simulate_schedule.py --acceptance 0.19,0.15,0.1,0.1 \\
      --round-ms 18.5,20.7,24,27,30 --decays 0.3,0.1,0.02   # how fast the counts forget
  .venv/bin/python scripts/simulate_schedule.py --acceptance 0.25,0.2,0.15,0.1 \\
      --round-ms 1,1.26,1.43,1.52,1.61 --min-gains 0,0.03 --drafting-excess 0.02
      # a margin for plain, where drafting rounds cost 2% more than the schedule was told

With --drafting-excess every round with K > 0 (and every fixed K) is charged that share more
than --round-ms, which stay the schedule's prices: what a schedule loses when the prices it
measured at start-up are low.
"""

from __future__ import annotations

import argparse
import itertools

import jax

import jaxspec as js
from jaxspec import simulate, speedup
from models import cli


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--acceptance', type=cli.list_of(cli.probability), required=True,
                 help='comma-separated acceptance rate of drafted position 1..K (K = their number)')
  p.add_argument('--round-ms', type=cli.list_of(cli.nonnegative_float), required=True,
                 help='comma-separated cost of a round at K = 0..K (K+1 numbers, > 0)')
  p.add_argument('--rounds', type=cli.positive_int, default=40, help='rounds a run (default 40)')
  p.add_argument('--runs', type=cli.positive_int, default=400, help='runs (default 400)')
  p.add_argument('--batch-size', type=cli.positive_int, default=1)
  p.add_argument('--prior-weights', type=cli.list_of(cli.nonnegative_float), default=None,
                 help="comma-separated CostModel prior_weight values, one 'auto' each (default: "
                 "CostModel's)")
  p.add_argument('--decays', type=cli.list_of(cli.probability), default=None,
                 help="comma-separated CostModel decay values in (0, 1], one 'auto' each per "
                 "prior weight (default: CostModel's)")
  p.add_argument('--min-gains', type=cli.list_of(cli.nonnegative_float), default=None,
                 help="comma-separated CostModel min_gain values, one 'auto' each per prior "
                 "weight and decay (default: CostModel's)")
  p.add_argument('--drafting-excess', type=cli.nonnegative_float, default=0.0,
                 help='charge rounds with K > 0 this share more than --round-ms (default 0)')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args(argv)
  if args.prior_weights is not None and min(args.prior_weights) <= 0:
    p.error(f'--prior-weights must be > 0, got {args.prior_weights}')
  if args.decays is not None and min(args.decays) <= 0:
    p.error(f'--decays must be in (0, 1], got {args.decays}')
  if len(args.round_ms) != len(args.acceptance) + 1 or min(args.round_ms) <= 0:
    p.error(f'--round-ms must give {len(args.acceptance) + 1} positive costs (K = 0..'
            f'{len(args.acceptance)}, K from --acceptance), got {args.round_ms}')
  return args


def main(argv=None):
  args = _parse(argv)
  k_max, costs = len(args.acceptance), args.round_ms
  charged = [costs[0]] + [c * (1 + args.drafting_excess) for c in costs[1:]]
  ratios = {f'K={k}': speedup.expected_tokens_by_position(args.acceptance, k) * charged[0] /
            charged[k] for k in range(1, k_max + 1)}
  schedules = {'heuristic': js.Heuristic()}
  for w, d, g in itertools.product(args.prior_weights or [None], args.decays or [None],
                                   args.min_gains or [None]):
    settings = {key: v for key, v in (('prior_weight', w), ('decay', d), ('min_gain', g))
                if v is not None}
    name = 'auto' + (f' ({", ".join(f"{key} {v:g}" for key, v in settings.items())})'
                     if settings else '')
    schedules[name] = js.CostModel(ks=tuple(range(k_max + 1)), round_seconds=tuple(costs),
                                   **settings)
  rounds = {}
  for name, schedule in schedules.items():
    out = simulate.simulate(schedule, args.acceptance, charged, num_rounds=args.rounds,
                            num_runs=args.runs, key=jax.random.key(args.seed),
                            batch_size=args.batch_size)
    ratios[name], rounds[name] = out['speedup'], out['rounds_by_k']
  best = max((m for m in ratios if m.startswith('K=')), key=ratios.get)
  print(' | '.join(f'{m} x{r:.3f}' for m, r in ratios.items()))
  for name in schedules:
    if name.startswith('auto'):
      print(f'{name} / max(plain, best fixed {best}): {ratios[name] / max(1, ratios[best]):.3f}; '
            f'rounds by K (a run): {[round(n, 1) for n in rounds[name]]}')


if __name__ == '__main__':
  main()
