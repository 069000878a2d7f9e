"""A schedule's decisions replayed on a real draft's acceptance, off the machine's clock.

Each prompt is decoded greedily (plain) once; after each generated token, what the n-gram draft
would propose and how many of its tokens the greedy target would accept follow from the tokens
alone (`jaxspec.simulate.ngram_trace`). Every fixed K and `auto` (`jaxspec.CostModel`, one per
--priors and --prior-weights, each without and with plain rounds' checks of the draft's first
token, as the loop runs a `DeterministicDraft`) then decide round after round on those recorded
bursts (`jaxspec.simulate.replay`), each round charged --round-ms of its K. Ratios are tokens
per unit of cost over plain decoding's; what they leave out is the clock's noise, and nothing
else that temperature 0 and batch 1 decide. The default prompts are training prompts: a setting
chosen on this table is then measured on the evaluation prompts by `scripts/bench_adaptive.py`.

  .venv/bin/python scripts/replay_schedule.py --prompt-kinds grounded,chat --num-prompts 20 \\
      --round-ms 22.0,26.1,28.5,29.0,29.6 --round-ms 19.4,25.6,28.0,28.8,29.6
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

import jaxspec as js
from jaxspec import simulate
from models import cli, loading, prompts as prompt_files


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  cli.add_prompt_flags(p, prompt_files.TRAIN_PROMPTS)
  p.add_argument('--prompt-kinds', type=cli.choices_of(prompt_files.KINDS),
                 default='grounded,chat', help=f'comma-separated, from '
                 f'{",".join(prompt_files.KINDS)}; --num-prompts is per kind')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=48,
                 help='new tokens a prompt (default 48)')
  p.add_argument('--round-ms', type=cli.list_of(cli.nonnegative_float), action='append',
                 help='comma-separated cost of a round at K = 0..K_max (K_max + 1 numbers, > 0); '
                 'repeat the flag for several cost tables (default: 22.0,26.1,28.5,29.0,29.6, '
                 "the n-gram's at batch 1 measured by bench_adaptive.py)")
  p.add_argument('--prior-weights', type=cli.list_of(cli.nonnegative_float), default=[2.0],
                 help="comma-separated CostModel prior_weight values to replay (default 2)")
  p.add_argument('--priors', type=cli.list_of(cli.nonnegative_float), default=[0.5],
                 help='comma-separated CostModel prior values to replay, each with every '
                 '--prior-weights (default 0.5; decode.py measures it at start-up)')
  p.add_argument('--ngram', default='ngram', help='the n-gram draft: ngram, ngram:N or ngram:N:M')
  args = p.parse_args(argv)
  args.num_prompts = args.num_prompts or 20
  args.round_ms = args.round_ms or [[22.0, 26.1, 28.5, 29.0, 29.6]]
  for costs in args.round_ms:
    if len(costs) != len(args.round_ms[0]) or len(costs) < 2 or min(costs) <= 0:
      p.error(f'--round-ms must each give K_max + 1 >= 2 positive costs, the same K_max, got '
              f'{args.round_ms}')
  if min(args.prior_weights) <= 0:
    p.error(f'--prior-weights must be > 0, got {args.prior_weights}')
  if max(args.priors) > 1:
    p.error(f'--priors must lie in [0, 1], got {args.priors}')
  try:
    name, ngram = loading.parse_draft_spec(args.ngram)
  except ValueError as e:
    p.error(f'--ngram: {e}')
  if name != 'ngram':
    p.error(f'--ngram must be ngram, ngram:N or ngram:N:M, got {args.ngram!r}')
  args.max_ngram, args.min_ngram = ngram
  return args


def main(argv=None):
  args = _parse(argv)
  config, target_params, gguf = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf)
  target, eos = loading.forward_for(config), tok.chat_eos_id
  rows = prompt_files.read_rows(args.prompts_file)
  k_max = len(args.round_ms[0]) - 1
  decode = js.DecodeConfig(num_draft_tokens=0, max_new_tokens=args.max_new_tokens,
                           sampling=js.SamplingConfig(temperature=0.0), eos_id=eos, pad_id=eos)
  print('| prompts | round ms, K = 0.. | ' + ' | '.join(f'K={k}' for k in range(1, k_max + 1))
        + ' | ' + ' | '.join(f'auto (prior {q:g}, prior_weight {w:g}{c}), rounds by K'
                             for q in args.priors for w in args.prior_weights
                             for c in (', no plain checks', '')) + ' |')
  print('|---' * (2 + k_max + 2 * len(args.priors) * len(args.prior_weights)) + '|')
  for kind in args.prompt_kinds:
    ids = [tok.encode_chat(r['prompt']) for r in rows if r.get('kind') == kind][:args.num_prompts]
    if not ids:
      raise SystemExit(f'--prompt-kinds: no {kind} prompt in {args.prompts_file}')
    bucket = -(-max(len(p) for p in ids) // 64) * 64
    traces = []
    for i, p in enumerate(ids):
      out = js.generate(target_params, None, *js.pad_prompts([p], pad_id=eos, bucket=bucket),
                        np.array([i]), target=target, draft=None, config=decode)
      length = int(np.asarray(out.lengths)[0])
      traces.append(simulate.ngram_trace(np.asarray(out.tokens)[0], len(p), length,
                                         num_draft_tokens=k_max, max_ngram=args.max_ngram,
                                         min_ngram=args.min_ngram) + (length - len(p),))
    width = args.max_new_tokens
    ready = np.stack([np.pad(np.asarray(r), (0, width - len(r))) for r, _, _ in traces])
    leading = np.stack([np.pad(np.asarray(a), (0, width - len(a))) for _, a, _ in traces])
    num_new = np.array([n for _, _, n in traces], np.int32)
    for costs in args.round_ms:
      fixed = [simulate.replay(simulate.Fixed(k), ready, leading, num_new, costs)
               for k in range(1, k_max + 1)]
      cells = [f'x{r["speedup"]:.3f}' for r in fixed]
      for q, w in itertools.product(args.priors, args.prior_weights):
        model = js.CostModel(ks=tuple(range(k_max + 1)), round_seconds=tuple(costs), prior=q,
                             prior_weight=w, horizon=args.max_new_tokens)
        for checks in (False, True):
          r = simulate.replay(model, ready, leading, num_new, costs, plain_checks=checks)
          cells.append(f'x{r["speedup"]:.3f}, {r["rounds_by_k"]}')
      print(f'| {len(ids)} {kind} | {", ".join(f"{c:g}" for c in costs)} | '
            + ' | '.join(cells) + ' |', flush=True)


if __name__ == '__main__':
  main()
