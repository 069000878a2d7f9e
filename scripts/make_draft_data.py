"""Makes draft-training data with the target itself (DistillSpec): continuations and teacher
distributions.

1. Chat-encodes every prompt of `--prompts-file` (default `data/train_prompts.jsonl`; a file with
   any evaluation prompt of `data/dev_prompts.jsonl` is refused) and lets the target continue
   them with `jaxspec.generate` on batches of prompts: greedily, and at temperature 1
   (`--sampled-fraction` continuations a prompt on average).
2. Runs the target once over every full sequence and keeps its top-`--teacher-top-k`
   log-probabilities at every position (the teacher distributions for a forward-KL loss).

Writes one `.npz` (`--out`, default `runs/draft_data.npz`): `tokens` [N] int32 (all sequences
concatenated), `offsets` [R+1], `prompt_lengths` [R], `teacher_ids` / `teacher_logp` [N, top_k]
(position i predicts token i+1 of its row), `sampled` [R] bool.

  .venv/bin/python scripts/make_draft_data.py            # 41 min on a shared 2-core CPU
  .venv/bin/python scripts/make_draft_data.py --skip-greedy --sampled-fraction 2 --seed 1 \\
      --out runs/draft_data_2.npz                         # more: two sampled answers a prompt
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxspec as js  # pylint: disable=g-import-not-at-top
from models import cli, loading, prompts as prompt_files, teacher_pass  # pylint: disable=g-import-not-at-top


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  cli.add_prompt_flags(p, prompt_files.TRAIN_PROMPTS)
  p.add_argument('--out', default='runs/draft_data.npz')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=128)
  p.add_argument('--max-prompt-tokens', type=cli.positive_int, default=192,
                 help='longer (chat-encoded) prompts are left out')
  p.add_argument('--batch-size', type=cli.positive_int, default=32)
  p.add_argument('--sampled-fraction', type=cli.nonnegative_float, default=0.25,
                 help='sampled continuations at temperature 1 per prompt (2.5 = every prompt '
                 'twice, half of them a third time)')
  p.add_argument('--skip-greedy', action='store_true',
                 help='only sampled continuations (e.g. a second file with another --seed)')
  p.add_argument('--teacher-top-k', type=cli.positive_int, default=16,
                 help='teacher log-probs kept per position')
  p.add_argument('--teacher-batch-size', type=cli.positive_int, default=8)
  p.add_argument('--seed', type=int, default=0)
  return p.parse_args(argv)


def _generate(params, forward, prompts, tok, args, sampling, seed, desc):
  """Continues every prompt (sorted by length, batched; prompt j samples with seed
  `seed + j`); returns a list of full sequences."""
  order = np.argsort([len(p) for p in prompts])
  seqs = [None] * len(prompts)
  config = js.DecodeConfig(num_draft_tokens=0, max_new_tokens=args.max_new_tokens,
                           sampling=sampling, eos_id=tok.eos_id, pad_id=tok.pad_id)
  for i in tqdm(range(0, len(order), args.batch_size), desc=desc):
    idx = order[i:i + args.batch_size]
    batch = [prompts[j] for j in idx]
    batch += [batch[-1]] * (args.batch_size - len(batch))  # fixed batch shape
    seeds = seed + np.concatenate([idx, np.full(args.batch_size - len(idx), idx[-1])])
    toks, lens = js.pad_prompts(batch, tok.pad_id, bucket=64)
    out = js.generate(params, None, toks, lens, seeds, target=forward, draft=None, config=config)
    for j, new in zip(idx, out.new_tokens()):
      seqs[j] = prompts[j] + new
  return seqs


def main(argv=None):
  args = _parse(argv)
  rows = prompt_files.read_rows(args.prompts_file)
  try:
    prompt_files.check_not_evaluation(rows, args.prompts_file)  # before anything loads
  except ValueError as e:
    raise SystemExit(f'error: {e}') from None
  if args.num_prompts:
    rows = rows[:args.num_prompts]
  t0 = time.time()
  config, params, gguf_path = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf_path)
  forward = loading.forward_for(config)
  prompts = [tok.encode_chat(r['prompt']) for r in rows]
  prompts = [p for p in prompts if len(p) <= args.max_prompt_tokens]
  seqs, plens = [], []
  if not args.skip_greedy:
    seqs = _generate(params, forward, prompts, tok, args, js.SamplingConfig(temperature=0.0),
                     args.seed, 'greedy')
    plens = [len(p) for p in prompts]
  num_sampled = int(round(args.sampled_fraction * len(prompts)))
  if num_sampled:  # every prompt floor(fraction) times, then a random subset for the rest
    whole, rest = divmod(num_sampled, len(prompts))
    chosen = np.concatenate([np.tile(np.arange(len(prompts)), whole), np.random.default_rng(
        args.seed).choice(len(prompts), rest, replace=False)])
    sub = [prompts[j] for j in chosen]
    seqs += _generate(params, forward, sub, tok, args, js.SamplingConfig(temperature=1.0),
                      args.seed + len(prompts), 'sampled T=1')
    plens += [len(p) for p in sub]
  sampled = np.arange(len(seqs)) >= (0 if args.skip_greedy else len(prompts))
  teacher = teacher_pass.teacher_pass(forward, params, [np.asarray(s) for s in seqs], plens,
                                      top_k=args.teacher_top_k,
                                      batch_size=args.teacher_batch_size)
  offsets = teacher['offsets']
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  np.savez_compressed(args.out, **teacher, sampled=sampled)
  gen = int(offsets[-1] - sum(plens))
  print(f'{len(seqs)} sequences, {offsets[-1]} tokens ({gen} generated) -> {args.out} '
        f'in {time.time() - t0:.0f} s')


if __name__ == '__main__':
  main()
