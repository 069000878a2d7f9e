"""Trains a draft for SmolLM2 by distillation from the target (DistillSpec: forward KL against the
target's own distributions, on text the target generated; see scripts/make_draft_data.py).

  --kind exit   trained self-speculative exit: the target's first blocks + an adapter (default)
  --kind small  a separate small Llama initialized from chosen target blocks
  --kind eagle  EAGLE: one block over [token embedding; the target's previous feature], trained
                on the target's own features (computed once, cached next to the data)

The loss at each generated position is the cross-entropy of the draft's distribution over its
reduced vocabulary against the teacher's top-k distribution renormalized over that vocabulary,
i.e. forward KL(p || q) up to a constant; EAGLE adds a smooth-L1 regression of the predicted
features onto the target's (Li et al. 2024, Sec. 4), optional uniform input-feature noise, and
with `--unroll J` EAGLE-3's training-time test (passes 2..J are drafting steps 2..J). Progress is shown with
tqdm; an orbax checkpoint (params, optimizer state) is written every `--save-every` steps to
`--ckpt-dir`, and a rerun resumes from the latest one; data order and init follow `--seed`. The
result is written with `models.registry.save_draft` to `--out`. Each kind's config, init and
loss are its recipe in `models.draft_training`, named by `models.registry`.

  .venv/bin/python scripts/make_draft_data.py                      # the data, once
  .venv/bin/python scripts/train_draft.py --kind eagle --corpus data/draft_corpus
      (the corpus of scripts/make_draft_corpus.py, token ids only, once made; the teacher pass
      runs first, cached)
  .venv/bin/python scripts/train_draft.py --kind eagle --corpus data/draft_corpus --shards 22:43
      --init-from runs/eagle_0_22   # continue a draft on the next slice of shards
  .venv/bin/python scripts/train_draft.py --kind exit              # -> drafts/smollm2_exit
  .venv/bin/python scripts/train_draft.py --kind small --steps 150 # -> runs/smollm2_small
  .venv/bin/python scripts/train_draft.py --kind eagle ...         # -> drafts/smollm2_eagle
      (the committed draft's exact command and data are in drafts/smollm2_eagle/draft.json)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import (cli, draft_heads, draft_training, loading,  # pylint: disable=g-import-not-at-top
                    registry, teacher_pass)


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--kind', choices=tuple(registry.KINDS), default='exit')
  cli.add_model_flags(p, dtype=False)
  data = p.add_mutually_exclusive_group()
  data.add_argument('--data', type=cli.list_of(cli.existing_file), default=None,
                    help='comma-separated .npz files from scripts/make_draft_data.py (default '
                    'runs/draft_data.npz)')
  data.add_argument('--corpus', type=cli.list_of(cli.existing_dir), default=None,
                    help='comma-separated corpus directories of scripts/make_draft_corpus.py '
                    '(token ids only): their teacher pass (target top-k, and features for '
                    'eagle) runs once into --teacher-dir, resumable by shard')
  p.add_argument('--teacher-dir', default='runs/teacher',
                 help='where the teacher pass of --corpus is cached (one folder a corpus)')
  p.add_argument('--teacher-top-k', type=cli.positive_int, default=16,
                 help='teacher log-probs kept per position (--corpus)')
  p.add_argument('--shards', type=cli.shard_range, default=None,
                 help='--corpus: A:B, train on answer shards A..B-1 only (their teacher pass '
                 'alone runs); a slice a session can afford, continued with --init-from')
  p.add_argument('--init-from', type=cli.existing_dir, default=None,
                 help='start from this saved draft of the same kind and config (its params and '
                 'draft vocabulary; a fresh optimizer), e.g. the one trained on earlier shards')
  p.add_argument('--out', default=None, help='default: the kind\'s (drafts/smollm2_exit, '
                 'drafts/smollm2_eagle, runs/smollm2_small: too big to commit)')
  p.add_argument('--ckpt-dir', default=None, help='default runs/ckpt_<kind>')
  p.add_argument('--steps', type=cli.positive_int, default=300)
  p.add_argument('--batch-size', type=cli.positive_int, default=4)
  p.add_argument('--seq-len', type=cli.positive_int, default=256)
  p.add_argument('--lr', type=cli.nonnegative_float, default=None,
                 help='default 2e-3 exit, 1e-3 eagle, 3e-4 small')
  p.add_argument('--warmup', type=cli.nonnegative_int, default=30, help='warm-up steps')
  p.add_argument('--exit-layer', type=cli.positive_int, default=8, help='exit: target blocks')
  p.add_argument('--adapter-mlp-dim', type=cli.positive_int, default=1536)
  p.add_argument('--source-layers', type=cli.list_of(cli.nonnegative_int), default=None,
                 help='the target blocks the draft\'s blocks start from; default small '
                 '0,1,2,28,29, eagle 29 (exactly one)')
  p.add_argument('--feature-weight', type=cli.nonnegative_float, default=1.0,
                 help='eagle: weight of the smooth-L1 feature regression next to the KL loss')
  p.add_argument('--feature-noise', type=cli.nonnegative_float, default=0.0,
                 help='eagle: uniform noise +-this added to input features while training')
  p.add_argument('--unroll', type=cli.positive_int, default=1,
                 help='eagle: passes per step (EAGLE-3 training-time test): pass j is drafting step j')
  p.add_argument('--draft-vocab-size', type=cli.positive_int, default=8192,
                 help='draft vocabulary W')
  p.add_argument('--save-every', type=cli.positive_int, default=100)
  p.add_argument('--holdout', type=cli.fraction, default=0.05,
                 help='fraction of rows for evaluation')
  p.add_argument('--train-fraction', type=cli.fraction, default=1.0,
                 help='train on this fraction of the training rows (same evaluation rows): '
                      'for measuring how agreement scales with data')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args(argv)
  if args.data is None and args.corpus is None:
    if not os.path.isfile('runs/draft_data.npz'):
      p.error('no training data: give --corpus or --data (default runs/draft_data.npz, made by '
              'scripts/make_draft_data.py, is missing)')
    args.data = ['runs/draft_data.npz']
  kind = registry.kind(args.kind)
  if args.source_layers is None:
    args.source_layers = list(kind.default_source_layers)
  if args.kind == 'eagle' and len(args.source_layers) != 1:
    p.error(f'argument --source-layers: an eagle draft starts from one block, got '
            f'{args.source_layers}')
  if args.shards is not None and args.corpus is None:
    p.error('argument --shards: selects shards of --corpus, which is not given')
  if args.init_from is not None:
    _check_init_from(p, args)
  return args


def _check_init_from(p, args):
  """--init-from names a draft of --kind whose config the flags do not contradict."""
  try:
    meta = registry.read_meta(args.init_from)
  except FileNotFoundError:
    p.error(f'argument --init-from: no draft.json in {args.init_from}')
  if meta['kind'] != args.kind:
    p.error(f'argument --init-from: {args.init_from} is a {meta["kind"]} draft, not --kind '
            f'{args.kind}')
  flags = dict(vars(args), source_layer=args.source_layers[0])  # eagle's one source block
  for field, saved in meta['config'].items():
    if field in flags and list(np.atleast_1d(flags[field])) != list(np.atleast_1d(saved)):
      p.error(f'argument --init-from: {args.init_from} has {field} {saved}, the flags give '
              f'{flags[field]}')


def main(argv=None):
  args = _parse(argv)
  kind = registry.kind(args.kind)
  args.out = args.out or kind.default_out
  args.ckpt_dir = os.path.abspath(args.ckpt_dir or f'runs/ckpt_{args.kind}')
  lr = args.lr or kind.default_lr
  t0 = time.time()
  config, params, _ = loading.load_model(args.model)
  paths = args.data or [path for directory in args.corpus for path in teacher_pass.for_corpus(
      loading.forward_for(config), params, directory,
      teacher_pass.corpus_cache_dir(args.teacher_dir, directory),
      seq_len=args.seq_len, features=args.kind == 'eagle', top_k=args.teacher_top_k,
      shards=args.shards)]
  counts = sum(draft_training.token_counts(path, config.vocab_size) for path in paths)
  if args.init_from:  # its draft vocabulary: the head's rows must keep their tokens
    init_meta, init_trainable, vocab_ids = registry.read_trainable(args.init_from)
  else:
    vocab_ids = draft_heads.frequent_vocab(counts, args.draft_vocab_size, always=(2,))
  coverage = counts[vocab_ids].sum() / counts.sum()
  to_draft = np.full((config.vocab_size,), -1, np.int32)
  to_draft[vocab_ids] = np.arange(len(vocab_ids))
  tokens, idx, prob, mask = (np.concatenate(a) for a in zip(
      *(draft_training.load_rows(path, args.seq_len, to_draft) for path in paths)))
  r = len(tokens)
  order = np.random.default_rng(args.seed).permutation(r)
  num_eval = max(1, int(args.holdout * r))
  eval_rows, train_rows = order[:num_eval], order[num_eval:]
  print(f'{r} rows ({mask.sum():.0f} generated positions), draft vocabulary {len(vocab_ids)} '
        f'covers {coverage:.3%} of generated tokens; {len(train_rows)} train / {num_eval} eval')

  opts = draft_training.RecipeOptions(
      data=tuple(paths), batch_size=args.batch_size, seq_len=args.seq_len,
      draft_vocab_size=args.draft_vocab_size, exit_layer=args.exit_layer,
      adapter_mlp_dim=args.adapter_mlp_dim, source_layers=tuple(args.source_layers),
      feature_weight=args.feature_weight, feature_noise=args.feature_noise, unroll=args.unroll)
  draft, trainable, loss_fn, make_arrays, recipe_info = kind.recipe(
      opts, config, params, vocab_ids, jax.random.key(args.seed))
  if args.init_from:
    if jax.tree.structure(trainable) != jax.tree.structure(init_trainable) or any(
        a.shape != b.shape for a, b in zip(jax.tree.leaves(trainable),
                                           jax.tree.leaves(init_trainable))):
      raise ValueError(f'--init-from {args.init_from}: its params do not match the {args.kind} '
                       'draft these flags build')
    trainable = init_trainable
  arrays, eval_rows, train_rows = make_arrays(tokens, idx, prob, mask, eval_rows, train_rows)
  r, num_eval = len(arrays[0]), len(eval_rows)
  train_rows = train_rows[:max(args.batch_size, int(args.train_fraction * len(train_rows)))]
  if len(arrays[0]) == len(tokens):  # a row is still one answer (not the exit's regrouping)
    size = dict(train_prompts=len(train_rows), train_answer_tokens=int(mask[train_rows].sum()))
    if args.corpus:  # the prompts trained on, for scripts/eval_draft.py's train/held-out gap
      prompt_ids = np.concatenate([np.load(path)['prompt_id'] for path in paths])
      size['train_prompt_ids'] = [int(i) for i in prompt_ids[train_rows[:64]]]
  else:
    size = dict(train_answer_tokens=len(train_rows) * args.seq_len)
  # What the draft has been trained on, this run and the runs it continues.
  before = init_meta['info'] if args.init_from else {}
  size['total_train_answer_tokens'] = size['train_answer_tokens'] + before.get(
      'total_train_answer_tokens', before.get('train_answer_tokens', 0))

  warmup = min(args.warmup, args.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(args.steps, warmup + 1),
                                                lr * 0.05)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
  opt_state = opt.init(trainable)

  @jax.jit
  def train_step(tr, opt_state, step, batch):
    noise_key = jax.random.fold_in(jax.random.key(args.seed + 1), step)
    (loss, agree), grads = jax.value_and_grad(
        lambda t: loss_fn(t, *batch, noise_key=noise_key), has_aux=True)(tr)
    updates, opt_state = opt.update(grads, opt_state, tr)
    return optax.apply_updates(tr, updates), opt_state, loss, agree

  eval_fn = jax.jit(lambda tr, batch: loss_fn(tr, *batch))

  def evaluate(tr):
    out = [eval_fn(tr, tuple(jnp.asarray(a[eval_rows[j:j + args.batch_size]]) for a in arrays))
           for j in range(0, num_eval - args.batch_size + 1, args.batch_size) or [0]]
    return tuple(float(np.mean([o[n] for o in out])) for n in (0, 1))

  mgr = ocp.CheckpointManager(args.ckpt_dir, options=ocp.CheckpointManagerOptions(
      max_to_keep=2, save_interval_steps=args.save_every))
  start = 0
  if mgr.latest_step() is not None:
    start = mgr.latest_step()
    restored = mgr.restore(start, args=ocp.args.StandardRestore(
        {'params': trainable, 'opt_state': opt_state}))
    trainable, opt_state = restored['params'], restored['opt_state']
    print(f'resumed from {args.ckpt_dir} at step {start}')
  else:
    print(f'before training: eval loss / top-1 agreement {evaluate(trainable)}')

  per_epoch = len(train_rows) // args.batch_size
  bar = tqdm(range(start, args.steps), initial=start, total=args.steps, desc=f'train {args.kind}')
  for step in bar:
    epoch, j = divmod(step, per_epoch)
    perm = np.random.default_rng(args.seed + 1 + epoch).permutation(train_rows)
    rows = perm[j * args.batch_size:(j + 1) * args.batch_size]
    trainable, opt_state, loss, agree = train_step(
        trainable, opt_state, step, tuple(jnp.asarray(a[rows]) for a in arrays))
    if step % 10 == 0:
      bar.set_postfix(loss=f'{float(loss):.3f}', agree=f'{float(agree):.3f}')
    mgr.save(step + 1, args=ocp.args.StandardSave({'params': trainable, 'opt_state': opt_state}))
  mgr.wait_until_finished()
  eval_loss, eval_agree = evaluate(trainable)
  info = dict(command='python ' + ' '.join(sys.argv), steps=args.steps,
              batch_size=args.batch_size, seq_len=args.seq_len, lr=lr,
              seed=args.seed, data=args.data, corpus=args.corpus, rows=r, train_rows=len(train_rows),
              shards=[os.path.basename(path) for path in paths] if args.shards else None,
              init_from=args.init_from,
              coverage=float(coverage),
              eval_loss=eval_loss, eval_top1_agreement=eval_agree,
              train_seconds=round(time.time() - t0), **size)
  info.update(recipe_info)
  registry.save_draft(args.out, args.kind, draft, trainable, vocab_ids, info=info)
  print(f'eval loss {eval_loss:.3f}, top-1 agreement {eval_agree:.3f}; saved {args.out} '
        f'({time.time() - t0:.0f} s)')


if __name__ == '__main__':
  main()
