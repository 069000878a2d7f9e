"""What the adaptive-K switch costs: plain decoding against `auto` forced to K = 0 every round
(a cost model whose drafting rounds could pay only at rates ~1, no probes), with 5 and with 2
compiled branches and with none (a cost model that leaves no K paying: plain decoding's program,
the draft's params passed in unused), with each of --drafts compiled in (default the n-gram), on
one prompt or (--prompt-kind) on the dev prompts of a kind, each decoded alone, by --batch-size
rows together; warm runs, interleaved; plain is timed twice ('plain again', the same program: the
run's noise); and the same for drafting rounds: a fixed K = 1 against `auto` forced to K = 1 every
round (K = 1 priced as a plain round, K >= 2 just under the K + 1 bound, so all 5 branches stay
compiled and K = 1 always wins); --k0-only times plain and the K = 0 programs only.
Prints each method's best wall ms and its speed over plain two ways: by best times (over the
first copy) and over all sweeps (± its standard error, `bench_rounds.speedups_over_plain`:
over both plain copies pooled, except 'plain again', which is over the first copy).

  .venv/bin/python scripts/bench_switch.py [--batch-size 16] [--drafts drafts/smollm2_exit] \\
      [--temperature 1]
  # rounds that change K against rounds at one K (a plain round and a K = 1 round in turn)
  .venv/bin/python scripts/bench_switch.py --prompt-kind chat --num-prompts 3 --k0-only \\
      --drafts ngram,drafts/smollm2_exit,drafts/smollm2_eagle --repeats 6 --cycle 0,1
  # the switch's cost in bench_adaptive.py's batch-1 cells (docs/adaptive.md run 37)
  .venv/bin/python scripts/bench_switch.py --prompt-kind chat --num-prompts 3 --k0-only \\
      --drafts ngram,drafts/smollm2_exit,drafts/smollm2_eagle --repeats 12
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np

import jaxspec as js
from jaxspec import bench_rounds
from models import cli, loading, prompts as prompt_files

PROMPT = 'Tell me about the history of Rome in a few sentences.'


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--prompt', default=None,
                 help=f'the prompt decoded (default: {PROMPT!r}; not with --prompt-kind)')
  p.add_argument('--prompt-kind', choices=prompt_files.KINDS, default=None,
                 help='decode the first --num-prompts prompts of this kind in --prompts-file '
                 'instead, each alone (as bench_adaptive.py does at batch 1)')
  cli.add_prompt_flags(p, prompt_files.DEV_PROMPTS)
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=48)
  p.add_argument('--repeats', type=cli.positive_int, default=3)
  p.add_argument('--batch-size', type=cli.positive_int, default=1,
                 help='rows decoding each prompt together (default 1)')
  p.add_argument('--temperature', type=cli.nonnegative_float, default=0.0,
                 help='sampling temperature (default 0: greedy)')
  p.add_argument('--drafts', default=['ngram'],
                 type=cli.list_of(cli.parsed_by(loading.parse_draft_spec, keep_text=True)),
                 help='comma-separated draft specs, as decode.py --draft (default ngram)')
  p.add_argument('--k0-only', action='store_true',
                 help='time only plain and each draft\'s auto forced to K = 0 with 5 branches')
  p.add_argument('--cycle', type=cli.list_of(cli.nonnegative_int), default=None,
                 help='also time rounds whose K follows this cycle (e.g. 0,1 or '
                 '0,0,0,0,0,0,0,0,0,1; each K in 0..4; `jaxspec.Cycle`) in the 5-branch '
                 'program, beside the same program forced to K = 0 and to K = 1; with Ks of '
                 '0 and 1 only, prints its ms a round against the forced programs\'')
  args = p.parse_args(argv)
  if args.cycle and max(args.cycle) > 4:
    p.error(f'--cycle: every K must be in 0..4, got {",".join(map(str, args.cycle))}')
  if args.prompt is not None and args.prompt_kind is not None:
    p.error('--prompt and --prompt-kind: give one')
  rows = [r['prompt'] for r in prompt_files.select(prompt_files.read_rows(args.prompts_file),
                                                    [args.prompt_kind], args.num_prompts or 0)
          ] if args.prompt_kind is not None else []
  if args.prompt_kind is not None and not rows:
    p.error(f'--prompt-kind {args.prompt_kind}: no such prompts in {args.prompts_file}')
  config, params, gguf = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf)
  ids = [tok.encode_chat(text) for text in (rows if args.prompt_kind else
                                            [args.prompt or PROMPT])]
  bucket = -(-max(len(i) for i in ids) // 64) * 64  # one padded shape: one compile
  batches = [(*js.pad_prompts([i] * args.batch_size, pad_id=tok.pad_id, bucket=bucket),
              np.arange(args.batch_size)) for i in ids]
  sampling = js.SamplingConfig(temperature=args.temperature)
  # Rounds at K cost 0.99 (K + 1) plain ones, so every branch is compiled (`CostModel.paying`),
  # but K > 0 pays only at acceptance rates above 0.98 (chat prompts give the n-gram ~0.1); a
  # prior of 0 and no probes: every round is plain ('rounds by K' below shows it).
  costs = lambda k: (1.0,) + tuple(0.99 * (j + 1) for j in range(1, k + 1))
  off = lambda k: js.CostModel(ks=tuple(range(k + 1)), round_seconds=costs(k), prior=0.0,
                               probe_every=0)
  on = js.CostModel(ks=(0, 1, 2, 3, 4), round_seconds=(1.0, 1.0, 2.9, 3.9, 4.9), probe_every=0)
  cfg = lambda k, **kw: js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                                        sampling=sampling, **kw)
  methods = {'plain': (None, None, cfg(0)), 'plain again': (None, None, cfg(0))}
  cycle_label = f'cycle {",".join(map(str, args.cycle or ()))}'
  for spec in args.drafts:
    draft, draft_params = loading.load_draft(spec, config, params, target_tokenizer=tok)
    name = os.path.basename(spec)
    methods[f'{name} auto, 5 branches, K=0'] = (draft, draft_params, cfg(4, schedule=off(4)))
    # No K can pay at a first-position acceptance of at most 0: plain decoding's program.
    methods[f'{name} auto, plain only'] = (draft, draft_params, cfg(4, schedule=dataclasses.replace(
        off(4), max_acceptance=0.0)))
    if args.cycle:
      methods[f'{name} auto, 5 branches, K=1'] = (draft, draft_params, cfg(4, schedule=on))
      methods[f'{name} {cycle_label}'] = (
          draft, draft_params, cfg(4, schedule=js.Cycle(tuple(args.cycle))))
    if not args.k0_only:
      methods[f'{name} auto, 2 branches, K=0'] = (draft, draft_params, cfg(1, schedule=off(1)))
      methods[f'{name} K=1'] = (draft, draft_params, cfg(1))
      methods[f'{name} auto, 5 branches, K=1'] = (draft, draft_params, cfg(4, schedule=on))
  runs = bench_rounds.time_methods(params, batches, methods, target=loading.forward_for(config),
                                   repeats=args.repeats)
  plain = runs['plain']
  speedups = bench_rounds.speedups_over_plain(runs)
  for name, r in runs.items():
    sweeps = [round(1e3 * t) for t in r['sweep_seconds']]
    print(f'{name}: {1e3 * r["seconds"]:.0f} ms, {r["tok_s"]:.1f} tok/s, x plain: best times '
          f'{plain["seconds"] / r["seconds"]:.3f}, over all sweeps '
          f'{speedups[name][0]:.3f} ±{speedups[name][1]:.3f}; '
          f'rounds by K {r["rounds_by_k"]}; '
          f'sweeps ms {sweeps}')
  # ms per round of the cycle against its rounds priced at the forced programs' ms per round
  per_round = lambda r: 1e3 * sum(r['sweep_seconds']) / len(r['sweep_seconds']) / sum(
      r['batch_rounds'])
  for spec in args.drafts if args.cycle else ():
    name = os.path.basename(spec)
    forced = {0: per_round(runs[f'{name} auto, 5 branches, K=0']),
              1: per_round(runs[f'{name} auto, 5 branches, K=1'])}
    cycle = runs[f'{name} {cycle_label}']
    if set(args.cycle) <= {0, 1}:
      mix = np.mean([forced[k] for k in args.cycle])
      print(f'{name} cycle: {per_round(cycle):.2f} ms a round, the same rounds at the forced '
            f'programs\' ms a round (K = 0: {forced[0]:.2f}, K = 1: {forced[1]:.2f}) '
            f'{mix:.2f}: x{per_round(cycle) / mix:.3f}')


if __name__ == '__main__':
  main()
