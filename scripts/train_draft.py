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
with `--unroll 2` a second pass that reads its own predicted features. Progress is shown with
tqdm; an orbax checkpoint (params, optimizer state) is written every `--save_every` steps to
`--ckpt_dir`, and a rerun resumes from the latest one; data order and init follow `--seed`. The
result is written with `models.draft_heads.save_draft` to `--out`.

  .venv/bin/python scripts/make_draft_data.py                      # the data, once
  .venv/bin/python scripts/train_draft.py --kind exit              # -> drafts/smollm2_exit
  .venv/bin/python scripts/train_draft.py --kind small --steps 150 # -> runs/smollm2_small
  .venv/bin/python scripts/train_draft.py --kind eagle ...         # -> drafts/smollm2_eagle
      (the committed draft's exact command and data are in drafts/smollm2_eagle/draft.json)
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
  p.add_argument('--kind', choices=('exit', 'small', 'eagle'), default='exit')
  p.add_argument('--data', default='runs/draft_data.npz',
                 help='comma-separated .npz files from scripts/make_draft_data.py')
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
  p.add_argument('--source_layer', type=int, default=29, help='eagle: block to start from')
  p.add_argument('--feature_weight', type=float, default=1.0,
                 help='eagle: weight of the smooth-L1 feature regression next to the KL loss')
  p.add_argument('--feature_noise', type=float, default=0.0,
                 help='eagle: uniform noise +-this added to input features while training')
  p.add_argument('--unroll', type=int, default=1,
                 help='eagle: passes per step; pass n>1 reads the draft\'s own predicted features')
  p.add_argument('--vocab_size', type=int, default=8192, help='draft vocabulary W')
  p.add_argument('--save_every', type=int, default=100)
  p.add_argument('--holdout', type=float, default=0.05, help='fraction of rows for evaluation')
  p.add_argument('--train_fraction', type=float, default=1.0,
                 help='train on this fraction of the training rows (same evaluation rows): '
                      'for measuring how agreement scales with data')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args()
  if not 0 < args.train_fraction <= 1:
    p.error(f'--train_fraction must be in (0, 1], got {args.train_fraction}')
  return args


def load_rows(path, seq_len, to_draft_idx):
  """Training windows from the data file: tokens [R,T], teacher draft-vocab indices and
  renormalized probabilities [R,T,k], and a loss mask [R,T] over generated positions."""
  d = dict(np.load(path))  # decompress each array once, not once a row
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
  d = dict(np.load(path))  # decompress each array once, not once a row
  gen = [d['tokens'][o + p:e] for o, p, e in zip(d['offsets'][:-1], d['prompt_lengths'],
                                                 d['offsets'][1:])]
  return np.bincount(np.concatenate(gen), minlength=vocab_size)


def _make_model(args, config, params, vocab_ids, key):
  """Returns (draft config, trainable params, loss_fn(trainable, *arrays) -> (loss, agreement),
  make_arrays(tokens, idx, prob, mask, eval_rows, train_rows) -> (the arrays loss_fn takes,
  their eval rows, their train rows))."""
  distill = draft_heads.distill_loss
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

    def arrays(tokens, idx, prob, mask, eval_rows, train_rows):
      x = _batched(features, tokens, args.batch_size, 'exit features')
      # The adapter is per position (no attention): keep only the generated positions, regrouped
      # into rows of seq_len, so no compute goes to prompts or padding. Evaluation and training
      # rows are regrouped apart, so no answer has positions on both sides.
      def regroup(rows):
        keep = mask[rows].reshape(-1) > 0
        n = keep.sum() // args.seq_len * args.seq_len
        return [a[rows].reshape(-1, *a.shape[2:])[keep][:n].reshape(-1, args.seq_len,
                                                                    *a.shape[2:])
                for a in (x, idx, prob)]
      held_out, train = regroup(eval_rows), regroup(train_rows)
      if not len(held_out[0]):
        raise ValueError(f'the {len(eval_rows)} evaluation rows have fewer than --seq_len '
                         f'{args.seq_len} generated positions; raise --holdout')
      x, idx, prob = (np.concatenate(pair) for pair in zip(held_out, train))
      e = len(held_out[0])
      print(f'exit adapter: {e} eval / {len(x) - e} train rows of {args.seq_len} generated '
            'positions')
      return (x, idx, prob, np.ones(x.shape[:2], np.float32)), np.arange(e), np.arange(e, len(x))

    def loss_fn(tr, x, i, p, m, noise_key=None):
      del noise_key
      return distill(fwd.adapter_logits(tr, x), i, p, m)

    return draft, trainable, loss_fn, arrays
  if args.kind == 'eagle':
    draft = draft_heads.EagleDraftConfig(source_layer=args.source_layer,
                                         draft_vocab_size=args.vocab_size)
    fwd = draft_heads.EagleDraftForward(config, draft)
    trainable = draft_heads.init_eagle_draft(config, params, draft, key)
    frozen = {'embed': params['embed']['embedding'],
              'head': draft_heads.target_head_rows(config, params, vocab_ids)}
    target = llama.LlamaForward(config)

    @jax.jit
    def features(tokens_BT):
      b, t = tokens_BT.shape
      _, _, f = target.with_features(params, tokens_BT, target.init_cache(b, t),
                                     jnp.zeros((b,), jnp.int32))
      return f.astype(jnp.float16)

    def arrays(tokens, idx, prob, mask, eval_rows, train_rows):
      feats, row = [], 0
      for path in args.data.split(','):  # cached per data file, next to it
        n = len(np.load(path)['prompt_lengths'])
        cache = f'{os.path.splitext(path)[0]}_features_{args.seq_len}.npy'
        if os.path.isfile(cache):
          feats.append(np.load(cache))
        else:
          feats.append(_batched(features, tokens[row:row + n], args.batch_size,
                                f'target features ({path})'))
          np.save(cache, feats[-1])
        row += n
      return (tokens, np.concatenate(feats), idx, prob, mask), eval_rows, train_rows

    def loss_fn(tr, tokens, feats, idx, prob, mask, noise_key=None):
      b, t = tokens.shape
      feats = feats.astype(jnp.float32)
      prev = jnp.pad(feats, ((0, 0), (1, 0), (0, 0)))[:, :t]
      if noise_key is not None and args.feature_noise > 0:
        prev = prev + jax.random.uniform(noise_key, prev.shape, jnp.float32,
                                         -args.feature_noise, args.feature_noise)
      p = {**frozen, **tr}
      losses, agreements = [], []
      for _ in range(args.unroll):
        pred, _ = fwd(p, tokens, prev, fwd.init_cache(b, t), jnp.zeros((b,), jnp.int32))
        kl, agree = distill(fwd.reduced_logits(p, pred), idx, prob, mask)
        reg = jnp.sum(optax.huber_loss(pred, feats).mean(-1) * mask) / jnp.maximum(mask.sum(), 1)
        losses.append(kl + args.feature_weight * reg)
        agreements.append(agree)
        # Next pass: every position reads the draft's own prediction for the position before,
        # as drafting steps 2..K do (a simple form of EAGLE-3's training-time test).
        prev = jax.lax.stop_gradient(jnp.pad(pred, ((0, 0), (1, 0), (0, 0)))[:, :t])
      return sum(losses), agreements[0]  # agreement of the first pass: the first draft token

    return draft, trainable, loss_fn, arrays
  layers = tuple(int(i) for i in args.source_layers.split(','))
  draft = draft_heads.SmallDraftConfig(source_layers=layers, draft_vocab_size=args.vocab_size)
  fwd = draft_heads.SmallDraftForward(config, draft)
  trainable = draft_heads.init_small_draft(config, params, draft, vocab_ids)
  embed = params['embed']['embedding']

  def loss_fn(tr, tokens_BT, i, p, m, noise_key=None):
    del noise_key
    b, t = tokens_BT.shape
    logits, _ = fwd.reduced_logits({'embed': embed, **tr}, tokens_BT, fwd.init_cache(b, t),
                                   jnp.zeros((b,), jnp.int32))
    return distill(logits, i, p, m)

  def arrays(tokens, idx, prob, mask, eval_rows, train_rows):  # the rows as they are
    return (tokens, idx, prob, mask), eval_rows, train_rows

  return draft, trainable, loss_fn, arrays


def _batched(fn, rows, batch_size, desc):
  """`fn` over rows in batches (the last one padded), concatenated on the host."""
  out = []
  for i in tqdm(range(0, len(rows), batch_size), desc=desc):
    chunk = rows[i:i + batch_size]
    pad = batch_size - len(chunk)
    out.append(np.asarray(fn(jnp.asarray(np.pad(chunk, [(0, pad)] + [(0, 0)] * (chunk.ndim - 1)))
                             ))[:len(chunk)])
  return np.concatenate(out)


def main():
  args = _parse()
  args.out = args.out or {'exit': 'drafts/smollm2_exit', 'eagle': 'drafts/smollm2_eagle',
                          'small': 'runs/smollm2_small'}[args.kind]
  args.ckpt_dir = os.path.abspath(args.ckpt_dir or f'runs/ckpt_{args.kind}')
  lr = args.lr or {'exit': 2e-3, 'eagle': 1e-3, 'small': 3e-4}[args.kind]
  t0 = time.time()
  config, params = gguf_loader.load_gguf(gguf_loader.default_model_path())
  paths = args.data.split(',')
  counts = sum(token_counts(path, config.vocab_size) for path in paths)
  vocab_ids = draft_heads.frequent_vocab(counts, args.vocab_size, always=(2,))
  coverage = counts[vocab_ids].sum() / counts.sum()
  to_draft = np.full((config.vocab_size,), -1, np.int32)
  to_draft[vocab_ids] = np.arange(len(vocab_ids))
  tokens, idx, prob, mask = (np.concatenate(a) for a in zip(
      *(load_rows(path, args.seq_len, to_draft) for path in paths)))
  r = len(tokens)
  order = np.random.default_rng(args.seed).permutation(r)
  num_eval = max(1, int(args.holdout * r))
  eval_rows, train_rows = order[:num_eval], order[num_eval:]
  print(f'{r} rows ({mask.sum():.0f} generated positions), draft vocabulary {len(vocab_ids)} '
        f'covers {coverage:.3%} of generated tokens; {len(train_rows)} train / {num_eval} eval')

  draft, trainable, loss_fn, make_arrays = _make_model(args, config, params, vocab_ids,
                                                       jax.random.key(args.seed))
  arrays, eval_rows, train_rows = make_arrays(tokens, idx, prob, mask, eval_rows, train_rows)
  r, num_eval = len(arrays[0]), len(eval_rows)
  train_rows = train_rows[:max(args.batch_size, int(args.train_fraction * len(train_rows)))]

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
              seed=args.seed, data=args.data, rows=r, train_rows=len(train_rows),
              coverage=float(coverage),
              eval_loss=eval_loss, eval_top1_agreement=eval_agree,
              train_seconds=round(time.time() - t0))
  if args.kind == 'eagle':
    info.update(feature_weight=args.feature_weight, feature_noise=args.feature_noise,
                unroll=args.unroll)
  draft_heads.save_draft(args.out, args.kind, draft, trainable, vocab_ids, info=info)
  print(f'eval loss {eval_loss:.3f}, top-1 agreement {eval_agree:.3f}; saved {args.out} '
        f'({time.time() - t0:.0f} s)')


if __name__ == '__main__':
  main()
