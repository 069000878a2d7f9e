"""Makes the draft-training corpus of `data/draft_corpus/` (`models.draft_corpus`, data/README.md).

Stage `prompts`: Magpie chat prompts written by the target, and grounded prompts over text found
on this machine, filtered, de-duplicated and kept apart from the evaluation prompts ->
OUT/prompts.jsonl.gz. Stage `answers`: the target answers every prompt (greedy, or sampled at
temperature 1), OUT/answers/shard_*.npz. `all`: both. Rerunning resumes: finished shards are
skipped; other settings on the same OUT are refused.

  .venv/bin/python scripts/make_draft_corpus.py --stage prompts
  .venv/bin/python scripts/make_draft_corpus.py --stage answers
  .venv/bin/python scripts/make_draft_corpus.py --stage all --part 0/2 &   # one process a core
  .venv/bin/python scripts/make_draft_corpus.py --stage all --part 1/2
  .venv/bin/python scripts/make_draft_corpus.py --stage teacher --part 0/2 &  # before training
  .venv/bin/python scripts/make_draft_corpus.py --stage teacher --part 1/2
      (add --shards A:B for the slice a train_draft.py --shards A:B run takes)
  .venv/bin/python scripts/make_draft_corpus.py --stage all --num-prompts 64 \\
      --out runs/corpus_smoke --work-dir runs/corpus_smoke_work     # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import cli, draft_corpus, loading, teacher_pass  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  prompts, answers = draft_corpus.PromptSpec(), draft_corpus.AnswerSpec()
  p.add_argument('--stage', choices=('prompts', 'answers', 'all', 'teacher'), default='all',
                 help='teacher: the teacher pass of train_draft.py --corpus ahead of training '
                 '(top-k log-probs and features of every answer shard, into --teacher-dir; '
                 'local, not committed), so that N processes (--part) can share it')
  cli.add_model_flags(p)
  p.add_argument('--out', default=os.path.join(ROOT, 'data', 'draft_corpus'),
                 help='corpus directory: prompts.jsonl.gz, answers/, manifest.json')
  p.add_argument('--work-dir', default=os.path.join(ROOT, 'data', 'draft_corpus', 'work'),
                 help='raw Magpie samples (token ids, kept in the repository so that a run '
                 'resumes on another machine; not read by training)')
  p.add_argument('--num-prompts', type=cli.positive_int, default=prompts.num_prompts)
  p.add_argument('--grounded-fraction', type=cli.probability, default=prompts.grounded_fraction,
                 help='share of grounded prompts; the rest are Magpie prompts')
  p.add_argument('--magpie-shard-size', type=cli.positive_int,
                 default=prompts.magpie_shard_size, help='raw Magpie samples a shard')
  p.add_argument('--magpie-max-new-tokens', type=cli.positive_int,
                 default=prompts.magpie_max_new_tokens,
                 help='token budget of a Magpie user message (cut ones are dropped)')
  p.add_argument('--max-prompt-tokens', type=cli.positive_int, default=prompts.max_prompt_tokens,
                 help='longer chat-encoded prompts are dropped')
  p.add_argument('--shard-size', type=cli.positive_int, default=answers.shard_size,
                 help='prompts an answer shard')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=answers.max_new_tokens)
  p.add_argument('--sampled-fraction', type=cli.probability, default=answers.sampled_fraction,
                 help='share of answers sampled at temperature 1 (the rest greedy)')
  p.add_argument('--batch-size', type=cli.positive_int, default=32)
  p.add_argument('--bucket', type=cli.positive_int, default=64,
                 help='answer prompts are padded to a multiple of this many tokens')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--teacher-dir', default='runs/teacher',
                 help='teacher: as train_draft.py --teacher-dir (files go to DIR/<corpus name>)')
  p.add_argument('--seq-len', type=cli.positive_int, default=256,
                 help='teacher: as train_draft.py --seq-len (the features\' layout)')
  p.add_argument('--teacher-top-k', type=cli.positive_int, default=16)
  p.add_argument('--part', type=cli.parsed_by(draft_corpus.Part.parse), default=draft_corpus.Part(),
                 help='W/N: this process is part W of N run side by side (a decode process '
                 'keeps about one core busy, so run one a core: --part 0/2 and --part 1/2); '
                 'each makes the shards numbered W mod N, part 0 writes the results')
  p.add_argument('--shards', type=cli.shard_range, default=None,
                 help='teacher: A:B, only answer shards A..B-1 (as train_draft.py --shards)')
  return p.parse_args(argv)


def main(argv=None):
  args = _parse(argv)
  config, params, gguf_path = loading.load_model(args.model, args.dtype)
  tok = loading.tokenizer_for(gguf_path)
  forward = loading.forward_for(config)
  if args.stage in ('prompts', 'all'):
    spec = draft_corpus.PromptSpec(
        num_prompts=args.num_prompts, grounded_fraction=args.grounded_fraction,
        magpie_shard_size=args.magpie_shard_size,
        magpie_max_new_tokens=args.magpie_max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, seed=args.seed)
    draft_corpus.make_prompts(params, forward, tok, spec, args.out, args.work_dir,
                              args.batch_size, config.context_length, args.part)
  if args.stage in ('answers', 'all'):
    spec = draft_corpus.AnswerSpec(shard_size=args.shard_size, max_new_tokens=args.max_new_tokens,
                                   sampled_fraction=args.sampled_fraction, seed=args.seed)
    draft_corpus.make_answers(params, forward, tok, spec, args.out, args.batch_size, args.bucket,
                              config.context_length, args.part)
  if args.stage == 'teacher':
    teacher_pass.for_corpus(forward, params, args.out,
                            teacher_pass.corpus_cache_dir(args.teacher_dir, args.out),
                            seq_len=args.seq_len, features=True, top_k=args.teacher_top_k,
                            part=args.part, shards=args.shards)


if __name__ == '__main__':
  try:
    main()
  except draft_corpus.SettingsMismatch as e:
    raise SystemExit(f'error: {e}') from None
