"""Trains a draft for SmolLM2 by distillation from the target (DistillSpec: forward KL against the
target's own distributions, on text the target generated; see scripts/make_draft_data.py).

  --kind exit   trained self-speculative exit: the target's first blocks + an adapter (default)
  --kind small  a separate small Llama initialized from chosen target blocks

The loss at each generated position is the cross-entropy of the draft's distribution over its
reduced vocabulary against the teacher's top-k distribution renormalized over that vocabulary,
i.e. forward KL(p || q) up to a constant. Progress is shown with tqdm; an orbax checkpoint
(params, optimizer state) is written every `--save_every` steps to `--ckpt_dir`, and a rerun
resumes from the latest one; data order and init follow `--seed`. The result is written with
`models.draft_heads.save_draft` to `--out`.

  .venv/bin/python scripts/make_draft_data.py                      # the data, once
  .venv/bin/python scripts/train_draft.py --kind exit              # -> drafts/smollm2_exit
  .venv/bin/python scripts/train_draft.py --kind small --steps 150 # -> runs/smollm2_small
"""

from __future__ import annotations

import argparse
import dataclasses
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
from models import draft_heads, gguf_loader, llama  # pylint: disable=g-import-not-at-top


def _parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--kind', choices=('exit', 'small'), default='exit')
  p.add_argument('--data', default='runs/draft_data.npz')
  p.add_argument('--out', default=None,
                 help='default drafts/smollm2_exit (committed) or runs/smollm2_small (too big)')
  p.add_argument('--ckpt_dir', default=None, help='default runs/ckpt_<kind>')
  p.add_argument('--steps', type=int, default=300)
  p.add_argument('--batch_size', type=int, default=4)
  p.add_argument('--seq_len', type=int, default=256)
  p.add_argument('--lr', type=float, default=None, help='default 2e-3 exit, 3e-4 small')
  p.add_argument('--warmup', type=int, default=30)
  p.add_argument('--exit_layer', type=int, default=8)
  p.add_argument('--adapter_mlp_dim', type=int, default=1536)
  p.add_argument('--source_layers', default='0,1,2,28,29')
  p.add_argument('--vocab_size', type=int, default=8192, help='draft vocabulary W')
  p.add_argument('--save_every', type=int, default=100)
  p.add_argument('--holdout', type=float, default=0.05, help='fraction of rows for evaluation')
  p.add_argument('--seed', type=int, default=0)
  return p.parse_args()


def load_rows(path, seq_len, to_draft_idx):
  """Training windows from the data file: tokens [R,T], teacher draft-vocab indices and
  renormalized probabilities [R,T,k], and a loss mask [R,T] over generated positions."""
  d = np.load(path)
  off, plen = d['offsets'], d['prompt_lengths']
  r, k = len(plen), d['teacher_ids'].shape[1]
  tokens = np.zeros((r, seq_len), np.int32)
  idx = np.zeros((r, seq_len, k), np.int32)
  prob = np.zeros((r, seq_len, k), np.float32)
  mask = np.zeros((r, seq_len), np.float32)
  for i in range(r):
    lo, hi = off[i], off[i + 1]
    crop = max(0, (hi - lo) - seq_len)  # keep the end of over-long rows
    n = hi - lo - crop
    tokens[i, :n] = d['tokens'][lo + crop:hi]
    ids = to_draft_idx[d['teacher_ids'][lo + crop:hi]]
    p = np.exp(d['teacher_logp'][lo + crop:hi].astype(np.float32)) * (ids >= 0)
    mass = p.sum(-1, keepdims=True)
    idx[i, :n], prob[i, :n] = np.maximum(ids, 0), p / np.maximum(mass, 1e-9)
    first = max(plen[i] - 1 - crop, 0)  # position predicting the first generated token
    mask[i, first:n - 1] = (mass[first:n - 1, 0] > 0)
  return tokens, idx, prob, mask


def token_counts(path, vocab_size):
  """How often each token occurs in the generated part of the data (not the prompts)."""
  d = np.load(path)
  gen = [d['tokens'][o + p:e] for o, p, e in zip(d['offsets'][:-1], d['prompt_lengths'],
                                                 d['offsets'][1:])]
  return np.bincount(np.concatenate(gen), minlength=vocab_size)


def _make_model(args, config, params, vocab_ids, key):
  """Returns (trainable params, logits_fn(trainable, tokens) -> [B,T,W], features fn or None)."""
  if args.kind == 'exit':
    draft = draft_heads.ExitDraftConfig(exit_layer=args.exit_layer,
                                        adapter_mlp_dim=args.adapter_mlp_dim,
                                        draft_vocab_size=args.vocab_size)
    fwd = draft_heads.ExitDraftForward(config, draft)
    trainable = draft_heads.init_exit_adapter(config, params, draft, vocab_ids, key)

    @jax.jit
    def features(tokens_BT):  # frozen target blocks: computed once for all the data
      b, t = tokens_BT.shape
      x, _ = fwd.hidden(params, tokens_BT, llama.init_cache(config, b, t)[:args.exit_layer],
                        jnp.zeros((b,), jnp.int32))
      return x

    return draft, trainable, fwd.adapter_logits, features
  layers = tuple(int(i) for i in args.source_layers.split(','))
  draft = draft_heads.SmallDraftConfig(source_layers=layers, draft_vocab_size=args.vocab_size)
  fwd = draft_heads.SmallDraftForward(config, draft)
  trainable = draft_heads.init_small_draft(config, params, draft, vocab_ids)
  embed = params['embed']['embedding']

  def logits_fn(tr, tokens_BT):
    b, t = tokens_BT.shape
    logits, _ = fwd.reduced_logits({'embed': embed, **tr}, tokens_BT, fwd.init_cache(b, t),
                                   jnp.zeros((b,), jnp.int32))
    return logits

  return draft, trainable, logits_fn, None


def main():
  args = _parse()
  args.out = args.out or ('drafts/smollm2_exit' if args.kind == 'exit' else 'runs/smollm2_small')
  args.ckpt_dir = os.path.abspath(args.ckpt_dir or f'runs/ckpt_{args.kind}')
  lr = args.lr or (2e-3 if args.kind == 'exit' else 3e-4)
  t0 = time.time()
  config, params = gguf_loader.load_gguf(gguf_loader.default_model_path())
  counts = token_counts(args.data, config.vocab_size)
  vocab_ids = draft_heads.frequent_vocab(counts, args.vocab_size, always=(2,))
  coverage = counts[vocab_ids].sum() / counts.sum()
  to_draft = np.full((config.vocab_size,), -1, np.int32)
  to_draft[vocab_ids] = np.arange(len(vocab_ids))
  tokens, idx, prob, mask = load_rows(args.data, args.seq_len, to_draft)
  r = len(tokens)
  order = np.random.default_rng(args.seed).permutation(r)
  num_eval = max(1, int(args.holdout * r))
  eval_rows, train_rows = order[:num_eval], order[num_eval:]
  print(f'{r} rows ({mask.sum():.0f} generated positions), draft vocabulary {len(vocab_ids)} '
        f'covers {coverage:.3%} of generated tokens; {len(train_rows)} train / {num_eval} eval')

  draft, trainable, logits_fn, features = _make_model(args, config, params, vocab_ids,
                                                      jax.random.key(args.seed))
  inputs = tokens
  if features is not None:
    inputs = np.concatenate([np.asarray(features(jnp.asarray(tokens[i:i + args.batch_size])))
                             for i in tqdm(range(0, r, args.batch_size), desc='features')])
    # The adapter is per position (no attention): keep only the generated positions, regrouped
    # into rows of seq_len, so no compute goes to prompts or padding.
    keep = mask.reshape(-1) > 0
    n = keep.sum() // args.seq_len * args.seq_len
    inputs, idx, prob = (a.reshape(-1, *a.shape[2:])[keep][:n].reshape(-1, args.seq_len,
                                                                         *a.shape[2:])
                         for a in (inputs, idx, prob))
    mask = np.ones(inputs.shape[:2], np.float32)
    r = len(inputs)
    num_eval = max(1, int(args.holdout * r))
    order = np.random.default_rng(args.seed).permutation(r)
    eval_rows, train_rows = order[:num_eval], order[num_eval:]
    print(f'exit adapter: {n} generated positions in {r} rows of {args.seq_len}')

  warmup = min(args.warmup, args.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(args.steps, warmup + 1),
                                                lr * 0.05)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
  opt_state = opt.init(trainable)

  @jax.jit
  def train_step(tr, opt_state, x, i, p, m):
    (loss, agree), grads = jax.value_and_grad(
        lambda t: draft_heads.distill_loss(logits_fn(t, x), i, p, m), has_aux=True)(tr)
    updates, opt_state = opt.update(grads, opt_state, tr)
    return optax.apply_updates(tr, updates), opt_state, loss, agree

  eval_fn = jax.jit(lambda tr, x, i, p, m: draft_heads.distill_loss(logits_fn(tr, x), i, p, m))

  def evaluate(tr):
    out = [eval_fn(tr, *(jnp.asarray(a[eval_rows[j:j + args.batch_size]])
                         for a in (inputs, idx, prob, mask)))
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
        trainable, opt_state, *(jnp.asarray(a[rows]) for a in (inputs, idx, prob, mask)))
    if step % 10 == 0:
      bar.set_postfix(loss=f'{float(loss):.3f}', agree=f'{float(agree):.3f}')
    mgr.save(step + 1, args=ocp.args.StandardSave({'params': trainable, 'opt_state': opt_state}))
  mgr.wait_until_finished()
  eval_loss, eval_agree = evaluate(trainable)
  info = dict(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=lr,
              seed=args.seed, data=args.data, rows=r, coverage=float(coverage),
              eval_loss=eval_loss, eval_top1_agreement=eval_agree,
              train_seconds=round(time.time() - t0))
  draft_heads.save_draft(args.out, args.kind, draft, trainable, vocab_ids, info=info)
  print(f'eval loss {eval_loss:.3f}, top-1 agreement {eval_agree:.3f}; saved {args.out} '
        f'({time.time() - t0:.0f} s)')


if __name__ == '__main__':
  main()
