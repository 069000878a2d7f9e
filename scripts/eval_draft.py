"""Acceptance of drafts on the evaluation prompts and on prompts they trained on (the gap).

Each draft decodes the chat and grounded prompts of data/dev_prompts.jsonl (`--prompt-kinds`),
and, when its draft.json records its training prompts (`train_draft.py --corpus`), a sample of
those (`--num-train-prompts`), all in one batch at each K and temperature. Reports the
acceptance rate and the per-position acceptance (of the rounds that reached drafted token i,
the share accepted) per prompt set, and for several drafts of one recipe trained on more and
more data (`train_draft.py --train-fraction`) the curve of acceptance against data size.
Writes `<out>/acceptance.json`, `<out>/acceptance.md`, and with matplotlib `<out>/curve.png`.
The measuring code is `models.draft_eval`.

  .venv/bin/python scripts/eval_draft.py --drafts drafts/smollm2_eagle,ngram
  .venv/bin/python scripts/eval_draft.py --drafts runs/curve/eagle_0.125,runs/curve/eagle_1 \\
      --num-draft-tokens 1 --out runs/curve
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import cli, draft_eval, loading  # pylint: disable=g-import-not-at-top
from models import prompts as prompt_files  # pylint: disable=g-import-not-at-top


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--drafts', type=cli.list_of(cli.parsed_by(loading.parse_draft_spec, keep_text=True)),
                 required=True,
                 help='comma-separated: ngram | ngram:N | ngram:N:M | early-exit:N | PATH')
  p.add_argument('--num-draft-tokens', type=cli.list_of(cli.positive_int), default=[1, 3],
                 help='comma-separated list of K')
  p.add_argument('--temperatures', type=cli.list_of(cli.nonnegative_float), default=[0.0])
  p.add_argument('--prompt-kinds', type=cli.choices_of(prompt_files.KINDS),
                 default='chat,grounded')
  p.add_argument('--num-prompts', type=cli.nonnegative_int, default=0,
                 help='evaluation prompts of each kind (0 = all)')
  p.add_argument('--num-train-prompts', type=cli.nonnegative_int, default=16,
                 help='training prompts a draft decodes, for the train/held-out gap')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=64)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='runs/eval_draft')
  return p.parse_args(argv)


def main(argv=None):
  args = _parse(argv)
  config, params, gguf_path = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf_path)
  results = []
  for spec in args.drafts:
    info = draft_eval.draft_info(spec) if os.path.isdir(spec) else {}
    sets = draft_eval.prompt_sets(args.prompt_kinds, args.num_prompts, info,
                                  args.num_train_prompts)
    size = {k: info[k] for k in ('train_prompts',) if k in info}
    seen = info.get('total_train_answer_tokens', info.get('train_answer_tokens'))  # --init-from
    if seen:
      size['train_answer_tokens'] = seen
    draft, draft_params = loading.load_draft(spec, config, params)
    for temperature in args.temperatures:
      for k in args.num_draft_tokens:
        try:
          measured = draft_eval.measure(params, config, tok, draft, draft_params, sets,
                                        num_draft_tokens=k, temperature=temperature,
                                        max_new_tokens=args.max_new_tokens, seed=args.seed)
        except FloatingPointError as e:
          raise FloatingPointError(f'{spec} T={temperature:g} K={k}: {e}') from None
        for name, summary in measured.items():
          rows = len(sets[name]) if name in sets else sum(
              len(v) for n, v in sets.items() if n.startswith('dev '))
          results.append(dict(draft=spec, temperature=temperature, num_draft_tokens=k,
                              set=name, rows=rows, **size, **summary))
          print(f"{spec} T={temperature:g} K={k} {name}: acceptance "
                f"{summary['acceptance_rate']:.3f}, per position "
                f"{[round(a, 3) for a in summary['position_acceptance'] if a is not None]}",
                flush=True)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'acceptance.json'), 'w', encoding='utf-8') as f:
    json.dump(dict(command='python ' + ' '.join(sys.argv), results=results), f, indent=1)
  with open(os.path.join(args.out, 'acceptance.md'), 'w', encoding='utf-8') as f:
    f.write(draft_eval.table(results))
  plotted = draft_eval.plot_curve(results, os.path.join(args.out, 'curve.png'))
  print(f'wrote {args.out}/acceptance.json, acceptance.md' + (', curve.png' if plotted else ''))


if __name__ == '__main__':
  main()
