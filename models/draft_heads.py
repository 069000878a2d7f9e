"""Trained drafts for a Llama target, as `forward(params, tokens [B,T], cache, start [B]) ->
(logits [B,T,V], cache)` callables with `init_cache`, so that `jaxspec.ModelDraft` runs them
unchanged.

- `ExitDraftForward`: a self-speculative exit (LayerSkip / Kangaroo style). The target's first
  `exit_layer` blocks (its own weights and its own KV cache: use
  `ModelDraft(..., shares_target_cache=True)`), then a small trainable adapter (a residual SwiGLU
  MLP, no attention, so it needs no cache of its own), a trainable norm and a trainable head.
  Params: `{'target': target_params, 'adapter': {...}, 'vocab_ids': [W]}`; `target` is the
  target's own pytree, referenced, not copied.
- `SmallDraftForward`: a separate small Llama (a few blocks of the target's width, initialized
  from chosen target blocks) with its own KV cache. It reads the target's input embedding by
  reference: params `{'embed': target_embedding [V,D], 'blocks': {...}, 'head': [W,D],
  'vocab_ids': [W]}`.

Both have a reduced output vocabulary (FR-Spec, Zhao et al. 2025): the head scores only the W
most frequent tokens `vocab_ids` of the target's own generations; every other token gets logit
-inf, so q is exactly zero there and exact speculative sampling stays exact (the verifier only
needs q to be the distribution the draft sampled from).

Saving, loading, and the table of kinds (config, forward, jaxspec wrapper, training recipe,
export) are in `models/registry.py`.

Shape letters: B batch, T tokens, D width, F adapter MLP width, V vocabulary, W draft vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import llama

Params = Any


def expand_vocab(logits_BTW: jax.Array, vocab_ids_W: jax.Array, vocab_size: int) -> jax.Array:
  """Draft-vocabulary logits `[B,T,W]` -> full-vocabulary logits `[B,T,V]`, -inf elsewhere."""
  full = jnp.full(logits_BTW.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return full.at[..., vocab_ids_W].set(logits_BTW.astype(jnp.float32))


def frequent_vocab(token_counts: np.ndarray, size: int, always=()) -> np.ndarray:
  """The `size` most frequent token ids (ties by id), always including `always`; sorted int32."""
  if not 0 < size <= len(token_counts):
    raise ValueError(f'draft vocabulary size must be in [1, {len(token_counts)}], got {size}')
  order = np.argsort(-np.asarray(token_counts), kind='stable')
  keep = list(dict.fromkeys([int(t) for t in always] + order.tolist()))[:size]
  return np.sort(np.asarray(keep, np.int32))


def _rms_norm(x, scale, eps):
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * scale


def _head(head_WD, x_BTD):
  # [W, D] x [B, T, D] with W leading: the layout XLA:CPU runs fastest (see Llama.head).
  return jnp.einsum('WD,BTD->WBT', head_WD, x_BTD).transpose(1, 2, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitDraftConfig:
  """exit_layer: target blocks run before the adapter; adapter_mlp_dim: F; draft_vocab_size: W."""

  exit_layer: int = 8
  adapter_mlp_dim: int = 1536
  draft_vocab_size: int = 8192


@dataclasses.dataclass(frozen=True)
class ExitDraftForward:
  """Target blocks `0..exit_layer-1`, then `x + MLP(norm(x))`, norm, reduced head."""

  target_config: llama.LlamaConfig
  draft: ExitDraftConfig = ExitDraftConfig()

  def __post_init__(self):
    if not 0 < self.draft.exit_layer < self.target_config.num_layers:
      raise ValueError(f'exit_layer must be in [1, {self.target_config.num_layers - 1}], got '
                       f'{self.draft.exit_layer}')

  def hidden(self, target_params, tokens_BT, cache, start_B):
    """The target's hidden state after `exit_layer` blocks: `[B,T,D]` and the updated cache."""
    return llama.Llama(self.target_config).apply(
        {'params': target_params}, tokens_BT, cache, start_B, num_layers=self.draft.exit_layer,
        method=llama.Llama.hidden)

  def adapter_logits(self, adapter, x_BTD):
    """Adapter and reduced head: hidden `[B,T,D]` -> draft-vocabulary logits `[B,T,W]`."""
    eps = self.target_config.norm_eps
    h = _rms_norm(x_BTD, adapter['norm'], eps)
    h = jax.nn.silu(h @ adapter['gate']) * (h @ adapter['up'])
    x = x_BTD + h @ adapter['down']
    return _head(adapter['head'], _rms_norm(x, adapter['final_norm'], eps))

  def __call__(self, params, tokens_BT, cache, start_B):
    x, cache = self.hidden(params['target'], tokens_BT, cache, start_B)
    logits = self.adapter_logits(params['adapter'], x)
    return expand_vocab(logits, params['vocab_ids'], self.target_config.vocab_size), cache

  def init_cache(self, batch_size: int, buffer_len: int):
    return llama.init_cache(self.target_config, batch_size, buffer_len)


def init_exit_adapter(target_config, target_params, draft: ExitDraftConfig, vocab_ids,
                      key) -> Params:
  """Adapter params: MLP with a zero output projection (so it starts as the plain early exit),
  the target's final norm and the target's tied-embedding rows of the draft vocabulary."""
  d, f = target_config.embed_dim, draft.adapter_mlp_dim
  k1, k2 = jax.random.split(key)
  embedding = target_params['embed']['embedding']
  return {
      'norm': jnp.ones((d,), jnp.float32),
      'gate': jax.random.normal(k1, (d, f), jnp.float32) * d ** -0.5,
      'up': jax.random.normal(k2, (d, f), jnp.float32) * d ** -0.5,
      'down': jnp.zeros((f, d), jnp.float32),
      'final_norm': jnp.asarray(target_params['final_norm']['scale'], jnp.float32),
      'head': jnp.asarray(embedding[jnp.asarray(vocab_ids)], jnp.float32),
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class SmallDraftConfig:
  """source_layers: the target blocks the draft's blocks are initialized from (their number is
  the draft's depth); draft_vocab_size: W."""

  source_layers: tuple[int, ...] = (0, 1, 2, 28, 29)
  draft_vocab_size: int = 8192


@dataclasses.dataclass(frozen=True)
class SmallDraftForward:
  """A separate Llama of `len(source_layers)` blocks with the target's width and tokenizer."""

  target_config: llama.LlamaConfig
  draft: SmallDraftConfig = SmallDraftConfig()

  @property
  def config(self) -> llama.LlamaConfig:
    return dataclasses.replace(self.target_config, num_layers=len(self.draft.source_layers))

  def reduced_logits(self, params, tokens_BT, cache, start_B):
    """Draft-vocabulary logits `[B,T,W]` and the updated cache."""
    variables = {'params': {**params['blocks'], 'embed': {'embedding': params['embed']}}}
    model = llama.Llama(self.config)
    x, cache = model.apply(variables, tokens_BT, cache, start_B, method=llama.Llama.hidden)
    x = model.apply(variables, x, method=lambda m, h: m.final_norm(h))
    return _head(params['head'], x), cache

  def __call__(self, params, tokens_BT, cache, start_B):
    logits, cache = self.reduced_logits(params, tokens_BT, cache, start_B)
    return expand_vocab(logits, params['vocab_ids'], self.target_config.vocab_size), cache

  def init_cache(self, batch_size: int, buffer_len: int):
    return llama.init_cache(self.config, batch_size, buffer_len)


def init_small_draft(target_config, target_params, draft: SmallDraftConfig, vocab_ids) -> dict:
  """Trainable small-draft params (copies of the chosen target blocks, final norm, head rows)."""
  for i in draft.source_layers:
    if not 0 <= i < target_config.num_layers:
      raise ValueError(f'source layer {i} is not a layer of the {target_config.num_layers}-layer '
                       'target')
  copy = lambda t: jax.tree.map(lambda a: jnp.array(a, jnp.float32), t)
  blocks = {f'layers_{j}': copy(target_params[f'layers_{i}'])
            for j, i in enumerate(draft.source_layers)}
  blocks['final_norm'] = copy(target_params['final_norm'])
  head = jnp.asarray(target_params['embed']['embedding'][jnp.asarray(vocab_ids)], jnp.float32)
  return {'blocks': blocks, 'head': head}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EagleDraftConfig:
  """source_layer: the target block the draft's one block is initialized from; draft_vocab_size:
  W (the head is the target's own output head restricted to W rows, frozen)."""

  source_layer: int = 29
  draft_vocab_size: int = 8192


@dataclasses.dataclass(frozen=True)
class EagleDraftForward:
  """EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
  Uncertainty", Sec. 3): one decoder block that extrapolates the target's features.

  At position j it reads the token x_j and the target's feature f_{j-1} of the position before
  (the final-normed hidden state the target's head reads; zeros before the first position):
  `h = fc([embed(x_j); f_{j-1}])`, one Llama block with its own KV cache and an RMSNorm give
  f^_j, the predicted feature of position j, which the target's head (restricted to `vocab_ids`,
  frozen) turns into the distribution of x_{j+1}. Params: `{'embed': target embedding [V,D]
  (referenced), 'fc': [2D,D], 'fc_bias': [D], 'block': Llama block params, 'norm': [D],
  'head': [W,D], 'vocab_ids': [W]}`.
  """

  target_config: llama.LlamaConfig
  draft: EagleDraftConfig = EagleDraftConfig()

  @property
  def config(self) -> llama.LlamaConfig:
    return dataclasses.replace(self.target_config, num_layers=1)

  def __call__(self, params, tokens_BT, prev_features_BTD, cache, start_B):
    """tokens `[B,T]` int32, the target's features of the positions before `[B,T,D]`, cache, start
    `[B]` -> (predicted features `[B,T,D]`, cache)."""
    e = jnp.take(params['embed'], tokens_BT, axis=0).astype(jnp.float32)
    x = jnp.concatenate([e, prev_features_BTD.astype(jnp.float32)], -1) @ params['fc']
    x = x + params['fc_bias']
    positions_BT = start_B[:, None].astype(jnp.int32) + jnp.arange(tokens_BT.shape[1])
    x, layer_cache = llama.Block(self.config).apply({'params': params['block']}, x, cache[0],
                                                    positions_BT)
    return _rms_norm(x, params['norm'], self.target_config.norm_eps), [layer_cache]

  def reduced_logits(self, params, features_BTD):
    """Predicted features `[B,T,D]` -> draft-vocabulary logits `[B,T,W]` float32."""
    return _head(params['head'], features_BTD).astype(jnp.float32)

  def logits(self, params, features_BTD):
    """Predicted features `[B,T,D]` -> full-vocabulary logits `[B,T,V]` (-inf outside W)."""
    return expand_vocab(self.reduced_logits(params, features_BTD), params['vocab_ids'],
                        self.target_config.vocab_size)

  def init_cache(self, batch_size: int, buffer_len: int):
    return llama.init_cache(self.config, batch_size, buffer_len)


def eagle_training_passes(fwd: EagleDraftForward, params, tokens_BT, features_BTD,
                          num_passes: int) -> list[jax.Array]:
  """EAGLE-3's training-time test (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of
  Large Language Models via Training-Time Test", Sec. 3.2): the draft's predictions as drafting
  steps 1..`num_passes` of a round make them, for every position at once.

  Pass 1 is the forward over the target's features (`features_BTD [B,T,D]`, the target's
  feature of each position; position t reads that of t-1). Pass j > 1 at position t reads pass
  j-1's predicted feature of position t-1 and attends as drafting step j of a round that began
  at t-j+1 does: to pass 1's keys and values up to t-j+1 (the cache the target's features
  filled) and to pass i's at position t-j+i for i = 2..j (the draft's own earlier steps).
  Rows start at position 0, with no cache. Returns the predicted features of each pass, a list
  of `[B,T,D]` float32.
  """
  c = fwd.config
  p = params['block']
  b, t = tokens_BT.shape
  dense = functools.partial(nn.DenseGeneral, dtype=jnp.float32, param_dtype=jnp.float32,
                            dot_general=jax.lax.dot_general)
  norm = lambda name, x: llama.RMSNorm(c.norm_eps, jnp.float32).apply({'params': p[name]}, x)
  proj = lambda name, heads, x: dense((heads, c.head_dim), use_bias=c.qkv_bias).apply(
      {'params': p['attn'][name]}, x)
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  scaling = llama.rope_scaling(c)
  g = c.num_heads // c.num_kv_heads
  distance = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]  # query t minus key position
  embed = jnp.take(params['embed'], tokens_BT, axis=0).astype(jnp.float32)
  prev = jnp.pad(features_BTD.astype(jnp.float32), ((0, 0), (1, 0), (0, 0)))[:, :t]
  keys, values, preds = [], [], []
  for j in range(1, num_passes + 1):
    x = jnp.concatenate([embed, prev], -1) @ params['fc'] + params['fc_bias']
    h = norm('attn_norm', x)
    q, k, v = (proj('q', c.num_heads, h), proj('k', c.num_kv_heads, h),
               proj('v', c.num_kv_heads, h))
    if c.qk_norm:
      q = llama.RMSNorm(c.norm_eps, jnp.float32).apply({'params': p['attn']['q_norm']}, q)
      k = llama.RMSNorm(c.norm_eps, jnp.float32).apply({'params': p['attn']['k_norm']}, k)
    q = llama.rope(q, positions, c.rope_theta, scaling).reshape(b, t, c.num_kv_heads, g,
                                                                c.head_dim)
    keys.append(llama.rope(k, positions, c.rope_theta, scaling))
    values.append(v)
    # Key position p of query t comes from pass max(1, j - (t - p)); later positions are hidden.
    source = jnp.maximum(1, j - distance)
    masks = [(distance >= 0) & (source == i) for i in range(1, j + 1)]
    scores = sum(jnp.where(m, jnp.einsum('BTMGH,BSMH->BMGTS', q, kk), 0.0)
                 for m, kk in zip(masks, keys)) * c.head_dim ** -0.5
    probs = jax.nn.softmax(jnp.where(distance >= 0, scores, -jnp.inf), axis=-1)
    out = sum(jnp.einsum('BMGTS,BSMH->BTMGH', jnp.where(m, probs, 0.0), vv)
              for m, vv in zip(masks, values)).reshape(b, t, c.num_heads, c.head_dim)
    x = x + dense(c.embed_dim, axis=(-2, -1), use_bias=False).apply({'params': p['attn']['o']},
                                                                    out)
    x = x + llama.MLP(dataclasses.replace(c, cpu_kernel=False, dtype='float32')).apply(
        {'params': p['mlp']}, norm('mlp_norm', x))
    preds.append(_rms_norm(x, params['norm'], fwd.target_config.norm_eps))
    prev = jnp.pad(preds[-1], ((0, 0), (1, 0), (0, 0)))[:, :t]
  return preds


def target_head_rows(target_config, target_params, vocab_ids) -> jax.Array:
  """The target's output-head rows for `vocab_ids`: `[W, D]` float32."""
  if target_config.tie_embeddings:
    weight = target_params['embed']['embedding']
  else:
    weight = jnp.asarray(target_params['lm_head']['kernel']).T
  return jnp.asarray(weight[jnp.asarray(vocab_ids)], jnp.float32)


def init_eagle_draft(target_config, target_params, draft: EagleDraftConfig, key) -> Params:
  """Trainable EAGLE params: `fc` maps `[embed; feature]` to the width (the feature half starts
  as the identity, the token half small and random), the block is a copy of the target's block
  `source_layer` and the norm starts as the target's final norm."""
  if not 0 <= draft.source_layer < target_config.num_layers:
    raise ValueError(f'source layer {draft.source_layer} is not a layer of the '
                     f'{target_config.num_layers}-layer target')
  d = target_config.embed_dim
  fc = jnp.concatenate([jax.random.normal(key, (d, d), jnp.float32) * 0.1 * d ** -0.5,
                        jnp.eye(d, dtype=jnp.float32)], 0)
  block = jax.tree.map(lambda a: jnp.array(a, jnp.float32),
                       target_params[f'layers_{draft.source_layer}'])
  return {'fc': fc, 'fc_bias': jnp.zeros((d,), jnp.float32), 'block': block,
          'norm': jnp.asarray(target_params['final_norm']['scale'], jnp.float32)}


def distill_loss(logits_BTW, idx_BTk, prob_BTk, mask_BT):
  """DistillSpec forward-KL loss on the draft vocabulary.

  Args:
    logits_BTW: draft logits `[B,T,W]`.
    idx_BTk, prob_BTk: the teacher's top-k tokens as draft-vocabulary indices `[B,T,k]` int32 and
      their probabilities renormalized over the draft vocabulary `[B,T,k]` (0 for dropped ones).
    mask_BT: `[B,T]` float, 1 where the loss counts.
  Returns:
    (masked mean cross-entropy, i.e. forward KL(p || q) up to a constant; top-1 agreement rate,
    the greedy acceptance proxy).
  """
  logq = jax.nn.log_softmax(logits_BTW.astype(jnp.float32), axis=-1)
  ce = -jnp.sum(prob_BTk * jnp.take_along_axis(logq, idx_BTk, axis=-1), axis=-1)
  n = jnp.maximum(mask_BT.sum(), 1.0)
  agree = (jnp.argmax(logits_BTW, -1) == idx_BTk[..., 0]) & (prob_BTk[..., 0] > 0)
  return jnp.sum(ce * mask_BT) / n, jnp.sum(agree * mask_BT) / n
