"""Training recipes of the trained draft kinds (DistillSpec: forward KL against the target's own
distributions, on text the target generated; `scripts/make_draft_data.py` makes the data).

A recipe is a kind's training hook in `models.registry`: `recipe(options, target_config,
target_params, vocab_ids [W] int32, key) -> Recipe`. `scripts/train_draft.py` runs the loop
(optimizer, checkpoints, evaluation) the same way for every kind.

Shape letters: R rows, B batch, T positions (`seq_len`), k teacher top-k, D width, W draft
vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from models import draft_heads, llama


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeOptions:
  """The training settings the recipes read (the flags of scripts/train_draft.py).

  data: the `.npz` files (EAGLE caches its target features next to each); batch_size, seq_len:
  B and T; draft_vocab_size: W; exit_layer, adapter_mlp_dim: the exit draft's; source_layers:
  the target blocks a small draft copies (EAGLE: exactly one); feature_weight, feature_noise,
  unroll: EAGLE's feature regression weight, input-feature noise and passes per step.
  """

  data: tuple[str, ...]
  batch_size: int = 4
  seq_len: int = 256
  draft_vocab_size: int = 8192
  exit_layer: int = 8
  adapter_mlp_dim: int = 1536
  source_layers: tuple[int, ...] = (0, 1, 2, 28, 29)
  feature_weight: float = 1.0
  feature_noise: float = 0.0
  unroll: int = 1


class Recipe(NamedTuple):
  """draft_config: the kind's config; trainable: its params pytree; loss_fn(trainable, *arrays,
  noise_key=None) -> (loss, top-1 agreement); make_arrays(tokens, idx, prob, mask, eval_rows,
  train_rows) -> (the arrays loss_fn takes, their eval rows, their train rows); info: extra
  fields recorded in draft.json."""

  draft_config: Any
  trainable: Any
  loss_fn: Callable[..., Any]
  make_arrays: Callable[..., Any]
  info: dict


def load_rows(path: str, seq_len: int, to_draft_idx: np.ndarray):
  """Training windows from a data file: tokens `[R,T]` int32, teacher draft-vocabulary indices
  `[R,T,k]` int32 and renormalized probabilities `[R,T,k]` float32, and a loss mask `[R,T]`
  float32 over generated positions. `to_draft_idx [V]` maps a target id to its draft index (-1
  outside the draft vocabulary). Rows longer than T keep their end."""
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


def loss_positions(mask_RT: np.ndarray, *arrays_RT):
  """The positions where the loss counts, first in each row: (sel `[R,M]` int32, each of
  `arrays_RT` `[R,T,...]` taken at them `[R,M,...]`), M the most any row has, rounded up to a
  multiple of 8 (at most T); positions past a row's own are masked out in the mask taken along.
  Running the draft's head over M instead of T positions is what it saves (answers are about
  half of a training row)."""
  r, t = mask_RT.shape
  m = min(t, max(8, -(-int((mask_RT > 0).sum(1).max()) // 8) * 8))
  sel = np.argsort(mask_RT <= 0, axis=1, kind='stable')[:, :m].astype(np.int32)
  return sel, [np.take_along_axis(a, sel.reshape(r, m, *([1] * (a.ndim - 2))), axis=1)
               for a in arrays_RT]


def token_counts(path: str, vocab_size: int) -> np.ndarray:
  """How often each token occurs in the generated part of the data (not the prompts): `[V]`."""
  d = dict(np.load(path))  # decompress each array once, not once a row
  gen = [d['tokens'][o + p:e] for o, p, e in zip(d['offsets'][:-1], d['prompt_lengths'],
                                                 d['offsets'][1:])]
  return np.bincount(np.concatenate(gen), minlength=vocab_size)


def batched(fn, rows: np.ndarray, batch_size: int, desc: str) -> np.ndarray:
  """`fn` over `rows` in batches (the last one padded), concatenated on the host."""
  out = []
  for i in tqdm(range(0, len(rows), batch_size), desc=desc):
    chunk = rows[i:i + batch_size]
    pad = batch_size - len(chunk)
    padded = np.pad(chunk, [(0, pad)] + [(0, 0)] * (chunk.ndim - 1))
    out.append(np.asarray(fn(jnp.asarray(padded)))[:len(chunk)])
  return np.concatenate(out)


def exit_recipe(opts: RecipeOptions, config, params, vocab_ids, key) -> Recipe:
  """The exit draft: the frozen target blocks' features are computed once for all the data; the
  adapter is per position, so only generated positions are kept, regrouped into rows of T.
  Raises ValueError when the evaluation rows have fewer than T generated positions."""
  draft = draft_heads.ExitDraftConfig(exit_layer=opts.exit_layer,
                                      adapter_mlp_dim=opts.adapter_mlp_dim,
                                      draft_vocab_size=opts.draft_vocab_size)
  fwd = draft_heads.ExitDraftForward(config, draft)
  trainable = draft_heads.init_exit_adapter(config, params, draft, vocab_ids, key)

  @jax.jit
  def features(tokens_BT):
    b, t = tokens_BT.shape
    x, _ = fwd.hidden(params, tokens_BT, llama.init_cache(config, b, t)[:opts.exit_layer],
                      jnp.zeros((b,), jnp.int32))
    return x

  def arrays(tokens, idx, prob, mask, eval_rows, train_rows):
    x = batched(features, tokens, opts.batch_size, 'exit features')
    # Evaluation and training rows are regrouped apart, so no answer has positions on both sides.
    def regroup(rows):
      keep = mask[rows].reshape(-1) > 0
      n = keep.sum() // opts.seq_len * opts.seq_len
      return [a[rows].reshape(-1, *a.shape[2:])[keep][:n].reshape(-1, opts.seq_len, *a.shape[2:])
              for a in (x, idx, prob)]
    held_out, train = regroup(eval_rows), regroup(train_rows)
    if not len(held_out[0]):
      raise ValueError(f'the {len(eval_rows)} evaluation rows have fewer than --seq-len '
                       f'{opts.seq_len} generated positions; raise --holdout')
    x, idx, prob = (np.concatenate(pair) for pair in zip(held_out, train))
    e = len(held_out[0])
    print(f'exit adapter: {e} eval / {len(x) - e} train rows of {opts.seq_len} generated '
          'positions')
    return (x, idx, prob, np.ones(x.shape[:2], np.float32)), np.arange(e), np.arange(e, len(x))

  def loss_fn(tr, x, i, p, m, noise_key=None):
    del noise_key
    return draft_heads.distill_loss(fwd.adapter_logits(tr, x), i, p, m)

  return Recipe(draft, trainable, loss_fn, arrays, {})


def eagle_recipe(opts: RecipeOptions, config, params, vocab_ids, key) -> Recipe:
  """EAGLE: KL plus a smooth-L1 regression of the predicted features onto the target's (Li et
  al. 2024, Sec. 4), optional uniform input-feature noise, and with `unroll` J the training-time
  test of EAGLE-3 (Li et al. 2025, Sec. 3.2): passes 2..J are drafting steps 2..J, each reading
  the pass before's predicted features and attending as that step does
  (`draft_heads.eagle_training_passes`); the loss sums over the passes. The target's features
  are cached next to each data file.
  Raises ValueError unless `source_layers` names exactly one block."""
  if len(opts.source_layers) != 1:
    raise ValueError(f'an EAGLE draft starts from one target block; --source-layers gave '
                     f'{list(opts.source_layers)}')
  draft = draft_heads.EagleDraftConfig(source_layer=opts.source_layers[0],
                                       draft_vocab_size=opts.draft_vocab_size)
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
    for path in opts.data:  # cached per data file, next to it
      n = len(np.load(path)['prompt_lengths'])
      cache = f'{os.path.splitext(path)[0]}_features_{opts.seq_len}.npy'
      if os.path.isfile(cache):
        feats.append(np.load(cache))
      else:
        feats.append(batched(features, tokens[row:row + n], opts.batch_size,
                             f'target features ({path})'))
        np.save(cache, feats[-1])
      row += n
    sel, (idx, prob, mask) = loss_positions(mask, idx, prob, mask)
    return (tokens, np.concatenate(feats), sel, idx, prob, mask), eval_rows, train_rows

  def loss_fn(tr, tokens, feats, sel, idx, prob, mask, noise_key=None):
    feats = feats.astype(jnp.float32)
    inputs = feats
    if noise_key is not None and opts.feature_noise > 0:
      inputs = feats + jax.random.uniform(noise_key, feats.shape, jnp.float32,
                                          -opts.feature_noise, opts.feature_noise)
    p = {**frozen, **tr}
    at = lambda x: jnp.take_along_axis(x, sel[..., None], axis=1)  # [B,T,D] -> [B,M,D]
    target = at(feats)
    losses, agreements = [], []
    # Pass j is drafting step j (EAGLE-3's training-time test, draft_heads.eagle_training_passes).
    for pred in draft_heads.eagle_training_passes(fwd, p, tokens, inputs, opts.unroll):
      pred = at(pred)  # the head and the losses only where the loss counts
      kl, agree = draft_heads.distill_loss(fwd.reduced_logits(p, pred), idx, prob, mask)
      reg = jnp.sum(optax.huber_loss(pred, target).mean(-1) * mask) / jnp.maximum(mask.sum(), 1)
      losses.append(kl + opts.feature_weight * reg)
      agreements.append(agree)
    return sum(losses), agreements[0]  # agreement of the first pass: the first draft token

  info = dict(feature_weight=opts.feature_weight, feature_noise=opts.feature_noise,
              unroll=opts.unroll)
  return Recipe(draft, trainable, loss_fn, arrays, info)


def small_recipe(opts: RecipeOptions, config, params, vocab_ids, key) -> Recipe:
  """A small draft: its own blocks over the rows as they are."""
  del key
  draft = draft_heads.SmallDraftConfig(source_layers=tuple(opts.source_layers),
                                       draft_vocab_size=opts.draft_vocab_size)
  fwd = draft_heads.SmallDraftForward(config, draft)
  trainable = draft_heads.init_small_draft(config, params, draft, vocab_ids)
  embed = params['embed']['embedding']

  def loss_fn(tr, tokens_BT, i, p, m, noise_key=None):
    del noise_key
    b, t = tokens_BT.shape
    logits, _ = fwd.reduced_logits({'embed': embed, **tr}, tokens_BT, fwd.init_cache(b, t),
                                   jnp.zeros((b,), jnp.int32))
    return draft_heads.distill_loss(logits, i, p, m)

  def arrays(tokens, idx, prob, mask, eval_rows, train_rows):  # the rows as they are
    return (tokens, idx, prob, mask), eval_rows, train_rows

  return Recipe(draft, trainable, loss_fn, arrays, {})
