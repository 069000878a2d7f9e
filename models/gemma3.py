"""Gemma 3 text decoder (local sliding-window and global attention, QK-norm, sandwich norms).

Follows Hugging Face `transformers/models/gemma3/modeling_gemma3.py` (`Gemma3ForCausalLM`) and
the Gemma 3 technical report (arXiv 2503.19786, section 2): every `global_every`-th layer attends
to the whole context with RoPE base `rope_theta_global`, the others to the last `sliding_window`
positions with base `rope_theta_local`; queries and keys are RMS-normed per head before RoPE;
attention and MLP outputs are RMS-normed again before the residual add; the embedding is scaled
by sqrt(D); the MLP is GELU (tanh approximation) gated; the head is the tied embedding.

Norm scales here are the multiplicative factor itself, `y = rms_norm(x) * scale`. Hugging Face
stores `w` and multiplies by `1 + w`; llama.cpp's GGUF stores `1 + w`. The loaders convert.

Same interface as `models.llama`: new tokens `[B, T]`, per-row start positions `[B]`, a
fixed-size KV cache (one `{'k', 'v'}` dict of `[B, S, M, H]` arrays per layer, local layers
included) written at `start .. start+T-1`. The sliding window is a mask on positions
(`key_pos > query_pos - sliding_window`), so the cache never rolls and rollback is moving a length.

Shape letters: B batch, T new tokens, S cache length, D width, N heads, M kv heads, G = N // M,
H head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.llama import (RMSNorm, _init, _write_rows,  # pylint: disable=unused-import
                          apply_forward, cache_logical_axes, rope)

Params = Any
Cache = list  # list over layers of {'k': [B,S,M,H], 'v': [B,S,M,H]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config:
  """Hyperparameters of a Gemma 3 text model (Python scalars only).

  `global_every=6` makes layers 5, 11, 17, ... global (HF `sliding_window_pattern`, layer i is
  global iff (i + 1) % 6 == 0). `query_pre_attn_scalar`: scores are scaled by its -1/2 power.
  `rope_scale_global`: linear RoPE scaling factor of the global layers (HF `rope_type: linear`,
  positions divided by it); 1 = none. Softcaps: None = off.
  """

  vocab_size: int
  num_layers: int
  embed_dim: int
  mlp_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  query_pre_attn_scalar: float
  sliding_window: int = 512
  global_every: int = 6
  rope_theta_local: float = 10000.0
  rope_theta_global: float = 1000000.0
  rope_scale_global: float = 1.0
  norm_eps: float = 1e-6
  final_logit_softcap: float | None = None
  attn_logit_softcap: float | None = None
  dtype: str = 'float32'
  context_length: int | None = None

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}')
    if self.sliding_window < 1 or self.global_every < 1:
      raise ValueError('sliding_window and global_every must be >= 1')

  def is_global(self, layer: int) -> bool:
    """Whether layer `layer` (0-based) attends to the full context."""
    return (layer + 1) % self.global_every == 0

  @classmethod
  def gemma3_270m(cls, **overrides) -> Gemma3Config:
    """Gemma 3 270M: 18 layers, width 640, 4 heads / 1 KV head of 256, vocab 262144."""
    base = dict(vocab_size=262144, num_layers=18, embed_dim=640, mlp_dim=2048, num_heads=4,
                num_kv_heads=1, head_dim=256, query_pre_attn_scalar=256.0, sliding_window=512,
                global_every=6, rope_theta_local=10000.0, rope_theta_global=1000000.0,
                norm_eps=1e-6, context_length=32768)
    return cls(**{**base, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> Gemma3Config:
    """A 4-layer toy for tests: window 4, layers 1 and 3 global."""
    base = dict(vocab_size=64, num_layers=4, embed_dim=32, mlp_dim=64, num_heads=4,
                num_kv_heads=2, head_dim=8, query_pre_attn_scalar=8.0, sliding_window=4,
                global_every=2)
    return cls(**{**base, **overrides})


def _softcap(x, cap):
  return x if cap is None else jnp.tanh(x / cap) * cap


class Attention(nn.Module):
  config: Gemma3Config
  is_global: bool

  @nn.compact
  def __call__(self, x_BTD, layer_cache, positions_BT):
    c = self.config
    dt = jnp.dtype(c.dtype)
    dense = functools.partial(nn.DenseGeneral, dtype=dt, param_dtype=dt, use_bias=False)
    kv_axes = ('embed', 'kv_heads', 'head_dim')
    q = dense((c.num_heads, c.head_dim), name='q', kernel_init=_init(
        nn.initializers.lecun_normal(), ('embed', 'heads', 'head_dim')))(x_BTD)
    k = dense((c.num_kv_heads, c.head_dim), name='k',
              kernel_init=_init(nn.initializers.lecun_normal(), kv_axes))(x_BTD)
    v = dense((c.num_kv_heads, c.head_dim), name='v',
              kernel_init=_init(nn.initializers.lecun_normal(), kv_axes))(x_BTD)
    q = RMSNorm(c.norm_eps, dt, name='q_norm')(q)
    k = RMSNorm(c.norm_eps, dt, name='k_norm')(k)
    if self.is_global:
      theta, rope_positions = c.rope_theta_global, positions_BT / c.rope_scale_global
    else:
      theta, rope_positions = c.rope_theta_local, positions_BT
    q, k = rope(q, rope_positions, theta), rope(k, rope_positions, theta)
    start_B = positions_BT[:, 0]
    cache_k = _write_rows(layer_cache['k'], k, start_B)
    cache_v = _write_rows(layer_cache['v'], v, start_B)

    b, t = x_BTD.shape[:2]
    g = c.num_heads // c.num_kv_heads
    q = q.reshape(b, t, c.num_kv_heads, g, c.head_dim)
    scores = jnp.einsum('BTMGH,BSMH->BMGTS', q, cache_k,
                        preferred_element_type=jnp.float32) * c.query_pre_attn_scalar ** -0.5
    scores = _softcap(scores, c.attn_logit_softcap)
    key_pos_S = jnp.arange(cache_k.shape[1])
    query_pos_BT1 = positions_BT[:, :, None]
    visible_BTS = key_pos_S[None, None, :] <= query_pos_BT1
    if not self.is_global:
      visible_BTS &= key_pos_S[None, None, :] > query_pos_BT1 - c.sliding_window
    scores = jnp.where(visible_BTS[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum('BMGTS,BSMH->BTMGH', probs, cache_v).reshape(b, t, c.num_heads, c.head_dim)
    out = dense(c.embed_dim, axis=(-2, -1), name='o', kernel_init=_init(
        nn.initializers.lecun_normal(), ('heads', 'head_dim', 'embed')))(out)
    return out, {'k': cache_k, 'v': cache_v}


class MLP(nn.Module):
  config: Gemma3Config

  @nn.compact
  def __call__(self, x_BTD):
    c = self.config
    dt = jnp.dtype(c.dtype)
    dense = functools.partial(nn.Dense, use_bias=False, dtype=dt, param_dtype=dt)
    up_init = _init(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    gate = dense(c.mlp_dim, name='gate', kernel_init=up_init)(x_BTD)
    up = dense(c.mlp_dim, name='up', kernel_init=up_init)(x_BTD)
    return dense(c.embed_dim, name='down',
                 kernel_init=_init(nn.initializers.lecun_normal(), ('mlp', 'embed')))(
                     jax.nn.gelu(gate, approximate=True) * up)


class Block(nn.Module):
  config: Gemma3Config
  is_global: bool

  @nn.compact
  def __call__(self, x_BTD, layer_cache, positions_BT):
    c = self.config
    norm = lambda name: RMSNorm(c.norm_eps, jnp.dtype(c.dtype), name=name)
    h, layer_cache = Attention(c, self.is_global, name='attn')(
        norm('attn_norm')(x_BTD), layer_cache, positions_BT)
    x_BTD = x_BTD + norm('post_attn_norm')(h)
    h = MLP(c, name='mlp')(norm('mlp_norm')(x_BTD))
    return x_BTD + norm('post_mlp_norm')(h), layer_cache


class Gemma3(nn.Module):
  """Gemma 3 decoder. `__call__(tokens [B,T] int32, cache, start [B] int32, num_layers=None)`
  returns `(logits [B,T,V] float32, cache)`; `num_layers=n` runs only the first n blocks
  (early exit), then the final norm and the head."""

  config: Gemma3Config

  def setup(self):
    c = self.config
    dt = jnp.dtype(c.dtype)
    self.embed = nn.Embed(c.vocab_size, c.embed_dim, dtype=dt, param_dtype=dt,
                          embedding_init=_init(nn.initializers.normal(1.0), ('vocab', 'embed')))
    self.layers = [Block(c, c.is_global(i), name=f'layers_{i}') for i in range(c.num_layers)]
    self.final_norm = RMSNorm(c.norm_eps, dt)

  def hidden(self, tokens_BT, cache, start_B, num_layers=None):
    """Runs the first `num_layers` blocks; returns (hidden [B,T,D] before the final norm, cache)."""
    c = self.config
    t = tokens_BT.shape[1]
    positions_BT = start_B[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)
    # HF casts sqrt(D) to the weight dtype before multiplying (Gemma3TextScaledWordEmbedding).
    x = self.embed(tokens_BT) * jnp.asarray(c.embed_dim ** 0.5, jnp.dtype(c.dtype))
    cache = list(cache)
    for i in range(c.num_layers if num_layers is None else num_layers):
      x, cache[i] = self.layers[i](x, cache[i], positions_BT)
    return x, cache

  def unembed(self, features_BTD):
    """Tied head on final-normed features [B,T,D] -> logits [B,T,V] float32 (softcapped)."""
    logits = jnp.einsum('VD,BTD->VBT', self.embed.embedding, features_BTD).transpose(1, 2, 0)
    return _softcap(logits.astype(jnp.float32), self.config.final_logit_softcap)

  def with_features(self, tokens_BT, cache, start_B):
    """`(logits, cache, features [B,T,D])`, features being the final-normed hidden states."""
    x, cache = self.hidden(tokens_BT, cache, start_B)
    features = self.final_norm(x)
    return self.unembed(features), cache, features

  def __call__(self, tokens_BT, cache, start_B, num_layers=None):
    x, cache = self.hidden(tokens_BT, cache, start_B, num_layers)
    return self.unembed(self.final_norm(x)), cache


def init_cache(config: Gemma3Config, batch_size: int, buffer_len: int) -> Cache:
  """Zeroed KV cache: a list of `num_layers` dicts of `[B, S, M, H]` arrays (config dtype)."""
  shape = (batch_size, buffer_len, config.num_kv_heads, config.head_dim)
  dt = jnp.dtype(config.dtype)
  return [{'k': jnp.zeros(shape, dt), 'v': jnp.zeros(shape, dt)}
          for _ in range(config.num_layers)]


def _init_variables(config: Gemma3Config, key):
  return Gemma3(config).init(key, jnp.zeros((1, 1), jnp.int32), init_cache(config, 1, 1),
                             jnp.zeros((1,), jnp.int32))


def init_params(config: Gemma3Config, key: jax.Array) -> Params:
  """Random parameters (unboxed pytree) for tests."""
  return nn.unbox(_init_variables(config, key)['params'])


def logical_axes(config: Gemma3Config) -> Params:
  """Pytree matching the params with a tuple of logical axis names per array."""
  abstract = jax.eval_shape(lambda: _init_variables(config, jax.random.key(0)))
  return jax.tree.map(lambda p: tuple(p.names), abstract['params'],
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


@dataclasses.dataclass(frozen=True)
class Gemma3Forward:
  """The callable `forward(params, tokens [B,T] int32, cache, start [B] int32) ->
  (logits [B,T,V] float32, cache)` that `jaxspec` expects; hashable by value (a static jit
  argument). `num_layers` < config.num_layers gives the early-exit draft of the same weights."""

  config: Gemma3Config
  num_layers: int | None = None

  def __call__(self, params, tokens_BT, cache, start_B):
    return apply_forward(Gemma3, self.config, self.num_layers, False, params, tokens_BT, cache,
                         start_B)

  def with_features(self, params, tokens_BT, cache, start_B):
    """`(logits [B,T,V] float32, cache, features [B,T,D])`; ignores `num_layers`."""
    return apply_forward(Gemma3, self.config, None, True, params, tokens_BT, cache, start_B)

  def init_cache(self, batch_size: int, buffer_len: int) -> Cache:
    return init_cache(self.config, batch_size, buffer_len)
