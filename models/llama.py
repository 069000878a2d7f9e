"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) in Flax linen.

One forward serves prefill, one-token decode and (K+1)-token verification: it takes new tokens
`[B, T]`, per-row start positions `[B]` and a fixed-size KV cache (one `{'k', 'v'}` dict of
`[B, S, N_kv, H]` arrays per layer), writes the new keys/values at `start .. start+T-1` of each row,
and attends causally to everything at or before each query's position. Entries past a row's
position are never read, so rolling a rejected draft back is just moving the row's length.

Shape letters: B batch, T new tokens, S cache length, D width, N heads, M kv heads, G = N // M,
H head dim, F MLP width, V vocabulary.

The dense projections (q/k/v/o, MLP, untied head) run through `models.cpu_matmul.dot_general`:
a C++ kernel that reads each weight once for all B*T rows on a single-device CPU, XLA's dot
everywhere else; the tied head (`cpu_matmul.matmul_nt`) and the two attention products over the
cache (`cpu_matmul.attention_*`) likewise.
`LlamaConfig.cpu_kernel=False` forces XLA. The params are the same either way.

`LlamaConfig.invariant=True` is the window/batch-invariant mode (docs/invariance.md): a row's
logits get the same bits whatever T and B, so a (K+1)-token verify pass equals K+1 one-token
steps bit for bit, in float32 and bfloat16. The norms' mean and softmax's normalizer become
fixed-order tree sums (`models.invariant`, any backend), and on a 1-device CPU every matmul and
both attention products go through the row-invariant kernel (one row, prefill and bfloat16
included). On GPU/TPU the matmuls stay XLA's, so there the mode is not (yet) invariant.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import cpu_matmul
from models import invariant

Params = Any
Cache = list  # list over layers of {'k': [B,S,M,H], 'v': [B,S,M,H]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
  """Hyperparameters of a Llama-family model (Python scalars only)."""

  vocab_size: int
  num_layers: int
  embed_dim: int
  mlp_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  qkv_bias: bool = False
  dtype: str = 'float32'  # weights, activations and KV cache
  context_length: int | None = None  # tokens the model was trained for; None = unchecked
  # Llama 3.1/3.2 RoPE scaling (HF `rope_type: llama3`); rope_scaling_factor 1 = none.
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_context: int = 8192
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
  # Dense projections through the C++ small-row kernel where it applies (models/cpu_matmul.py);
  # False: XLA's dot everywhere. Same params and results up to float round-off.
  cpu_kernel: bool = True
  # Window/batch-invariant numerics (module docstring; needs cpu_kernel on the CPU).
  invariant: bool = False

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}')

  @classmethod
  def smollm2_135m(cls, **overrides) -> LlamaConfig:
    """SmolLM2-135M(-Instruct): 30 layers, width 576, 9 heads / 3 KV heads, vocab 49152."""
    base = dict(vocab_size=49152, num_layers=30, embed_dim=576, mlp_dim=1536, num_heads=9,
                num_kv_heads=3, head_dim=64, rope_theta=100000.0, norm_eps=1e-5,
                tie_embeddings=True, context_length=8192)
    return cls(**{**base, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> LlamaConfig:
    """A 2-layer toy for tests."""
    base = dict(vocab_size=64, num_layers=2, embed_dim=32, mlp_dim=64, num_heads=4,
                num_kv_heads=2, head_dim=8, rope_theta=10000.0)
    return cls(**{**base, **overrides})


def _init(init_fn, names):
  return nn.with_logical_partitioning(init_fn, names)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  invariant: bool = False  # the mean as a fixed-order tree sum (models/invariant.py)

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', _init(nn.initializers.ones, ('norm',)), (x.shape[-1],),
                       jnp.float32)
    x32 = x.astype(jnp.float32)
    if self.invariant:
      y = invariant.rms_normalize(x32, self.eps)
    else:
      y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * scale).astype(self.dtype)


def llama3_inv_freq(inv_freq, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_context: int):
  """Llama 3.1's RoPE frequency scaling (HF `modeling_rope_utils._compute_llama3_parameters`):
  wavelengths longer than `original_context / low_freq_factor` are slowed by `factor`, those
  shorter than `original_context / high_freq_factor` kept, the band between interpolated."""
  low_wavelen = original_context / low_freq_factor
  high_wavelen = original_context / high_freq_factor
  wavelen = 2 * jnp.pi / inv_freq
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
  smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def rope(x_BTNH: jax.Array, positions_BT: jax.Array, theta: float,
         llama3_scaling: tuple[float, float, float, int] | None = None) -> jax.Array:
  """Rotary embedding in the `rotate_half` layout of Hugging Face Llama. `llama3_scaling`:
  (factor, low_freq_factor, high_freq_factor, original_context) for `llama3_inv_freq`."""
  h = x_BTNH.shape[-1]
  inv_freq = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
  if llama3_scaling is not None:
    inv_freq = llama3_inv_freq(inv_freq, *llama3_scaling)
  angles = positions_BT[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x = x_BTNH.astype(jnp.float32)
  x1, x2 = x[..., : h // 2], x[..., h // 2:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTNH.dtype)


def rope_scaling(config: LlamaConfig):
  """`rope`'s `scaling` argument for `config`: None, or Llama 3's (factor, low, high, original
  context)."""
  if config.rope_scaling_factor == 1.0:
    return None
  return (config.rope_scaling_factor, config.rope_low_freq_factor, config.rope_high_freq_factor,
          config.rope_original_context)


def _write_rows(cache_BSMH, new_BTMH, start_B):
  """Writes each row's new entries at its own start position (fixed shapes, in place)."""
  return jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice_in_dim(c, u, s, axis=0))(
      cache_BSMH, new_BTMH.astype(cache_BSMH.dtype), start_B)


def _dot_general(config: LlamaConfig):
  """The `dot_general` of every dense projection: the CPU kernel's or plain XLA's."""
  if not config.cpu_kernel:
    return jax.lax.dot_general
  return cpu_matmul.invariant_dot_general if config.invariant else cpu_matmul.dot_general


def _attention_scores(config: LlamaConfig):
  """q [B,T,M,G,H], cache k [B,S,M,H] -> scores [B,M,G,T,S] float32 (CPU kernel or XLA)."""
  if config.cpu_kernel:
    return functools.partial(cpu_matmul.attention_scores, invariant=config.invariant)
  return lambda q, k: jnp.einsum('BTMGH,BSMH->BMGTS', q, k, preferred_element_type=jnp.float32)


def _attention_mix(config: LlamaConfig):
  """probs [B,M,G,T,S], cache v [B,S,M,H] -> [B,T,M,G,H] (CPU kernel or XLA)."""
  if config.cpu_kernel:
    return functools.partial(cpu_matmul.attention_mix, invariant=config.invariant)
  return lambda p, v: jnp.einsum('BMGTS,BSMH->BTMGH', p, v)


class Attention(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x_BTD, layer_cache, positions_BT):
    c = self.config
    dt = jnp.dtype(c.dtype)
    dense = functools.partial(nn.DenseGeneral, dtype=dt, param_dtype=dt,
                              dot_general=_dot_general(c))
    q = dense((c.num_heads, c.head_dim), use_bias=c.qkv_bias, name='q',
              kernel_init=_init(nn.initializers.lecun_normal(), ('embed', 'heads', 'head_dim')),
              bias_init=_init(nn.initializers.zeros, ('heads', 'head_dim')))(x_BTD)
    kv_axes = ('embed', 'kv_heads', 'head_dim')
    k = dense((c.num_kv_heads, c.head_dim), use_bias=c.qkv_bias, name='k',
              kernel_init=_init(nn.initializers.lecun_normal(), kv_axes),
              bias_init=_init(nn.initializers.zeros, ('kv_heads', 'head_dim')))(x_BTD)
    v = dense((c.num_kv_heads, c.head_dim), use_bias=c.qkv_bias, name='v',
              kernel_init=_init(nn.initializers.lecun_normal(), kv_axes),
              bias_init=_init(nn.initializers.zeros, ('kv_heads', 'head_dim')))(x_BTD)
    if c.qk_norm:
      q = RMSNorm(c.norm_eps, dt, c.invariant, name='q_norm')(q)
      k = RMSNorm(c.norm_eps, dt, c.invariant, name='k_norm')(k)
    scaling = rope_scaling(c)
    q = rope(q, positions_BT, c.rope_theta, scaling)
    k = rope(k, positions_BT, c.rope_theta, scaling)
    start_B = positions_BT[:, 0]
    cache_k = _write_rows(layer_cache['k'], k, start_B)
    cache_v = _write_rows(layer_cache['v'], v, start_B)

    b, t = x_BTD.shape[:2]
    g = c.num_heads // c.num_kv_heads
    q = q.reshape(b, t, c.num_kv_heads, g, c.head_dim)
    scores = _attention_scores(c)(q, cache_k) * c.head_dim ** -0.5
    key_pos = jnp.arange(cache_k.shape[1])
    visible_BTS = key_pos[None, None, :] <= positions_BT[:, :, None]
    scores = jnp.where(visible_BTS[:, None, None], scores, -jnp.inf)
    softmax = invariant.softmax if c.invariant else functools.partial(jax.nn.softmax, axis=-1)
    probs = softmax(scores).astype(dt)
    out = _attention_mix(c)(probs, cache_v).reshape(b, t, c.num_heads, c.head_dim)
    out = dense(c.embed_dim, axis=(-2, -1), use_bias=False, name='o',
                kernel_init=_init(nn.initializers.lecun_normal(),
                                  ('heads', 'head_dim', 'embed')))(out)
    return out, {'k': cache_k, 'v': cache_v}


class MLP(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x_BTD):
    c = self.config
    dt = jnp.dtype(c.dtype)
    dense = functools.partial(nn.Dense, use_bias=False, dtype=dt, param_dtype=dt,
                              dot_general=_dot_general(c))
    up_init = _init(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    gate = dense(c.mlp_dim, name='gate', kernel_init=up_init)(x_BTD)
    up = dense(c.mlp_dim, name='up', kernel_init=up_init)(x_BTD)
    return dense(c.embed_dim, name='down',
                 kernel_init=_init(nn.initializers.lecun_normal(), ('mlp', 'embed')))(
                     nn.silu(gate) * up)


class Block(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x_BTD, layer_cache, positions_BT):
    c = self.config
    dt = jnp.dtype(c.dtype)
    h, layer_cache = Attention(c, name='attn')(
        RMSNorm(c.norm_eps, dt, c.invariant, name='attn_norm')(x_BTD), layer_cache, positions_BT)
    x_BTD = x_BTD + h
    x_BTD = x_BTD + MLP(c, name='mlp')(
        RMSNorm(c.norm_eps, dt, c.invariant, name='mlp_norm')(x_BTD))
    return x_BTD, layer_cache


class Llama(nn.Module):
  """Llama decoder. `__call__(tokens [B,T] int32, cache, start [B] int32, num_layers=None)`
  returns `(logits [B,T,V] float32, cache)`. `num_layers=n` runs only the first n blocks, then
  the final norm and the head (self-speculative early exit); later layers' cache is untouched.
  `return_hidden=True` returns the final hidden states `[B,T,D]` instead of logits."""

  config: LlamaConfig

  def setup(self):
    c = self.config
    dt = jnp.dtype(c.dtype)
    self.embed = nn.Embed(c.vocab_size, c.embed_dim, dtype=dt, param_dtype=dt,
                          embedding_init=_init(nn.initializers.normal(1.0), ('vocab', 'embed')))
    self.layers = [Block(c, name=f'layers_{i}') for i in range(c.num_layers)]
    self.final_norm = RMSNorm(c.norm_eps, dt, c.invariant)
    if not c.tie_embeddings:
      self.lm_head = nn.Dense(c.vocab_size, use_bias=False, dtype=dt, param_dtype=dt,
                              dot_general=_dot_general(c),
                              kernel_init=_init(nn.initializers.lecun_normal(),
                                                ('embed', 'vocab')))

  def hidden(self, tokens_BT, cache, start_B, num_layers=None):
    """Runs the first `num_layers` blocks; returns (hidden [B,T,D] before the final norm, cache)."""
    t = tokens_BT.shape[1]
    positions_BT = start_B[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)
    x = self.embed(tokens_BT)
    cache = list(cache)
    for i in range(self.config.num_layers if num_layers is None else num_layers):
      x, cache[i] = self.layers[i](x, cache[i], positions_BT)
    return x, cache

  def head(self, x_BTD):
    """Final norm and output head: hidden [B,T,D] -> logits [B,T,V] float32."""
    return self.unembed(self.final_norm(x_BTD))

  def unembed(self, features_BTD):
    """Output head on final-normed features [B,T,D] -> logits [B,T,V] float32."""
    if self.config.tie_embeddings:
      if self.config.cpu_kernel:  # the CPU kernel, or the einsum below elsewhere
        logits = cpu_matmul.matmul_nt(features_BTD, self.embed.embedding, self.config.invariant)
      else:
        # [V, D] x [B, T, D] with V leading in the output: XLA:CPU runs this 3-4x faster for
        # T > 1 than `x @ embedding.T`.
        logits = jnp.einsum('VD,BTD->VBT', self.embed.embedding, features_BTD).transpose(1, 2, 0)
    else:
      logits = self.lm_head(features_BTD)
    return logits.astype(jnp.float32)

  def with_features(self, tokens_BT, cache, start_B):
    """Like `__call__`, also returning the final-normed features [B,T,D] the head reads (what
    EAGLE-style drafts consume)."""
    x, cache = self.hidden(tokens_BT, cache, start_B)
    features = self.final_norm(x)
    return self.unembed(features), cache, features

  def __call__(self, tokens_BT, cache, start_B, num_layers=None):
    x, cache = self.hidden(tokens_BT, cache, start_B, num_layers)
    return self.head(x), cache


def init_cache(config: LlamaConfig, batch_size: int, max_len: int) -> Cache:
  """Zeroed KV cache: a list of `num_layers` dicts of `[B, S, N_kv, H]` arrays (config dtype)."""
  shape = (batch_size, max_len, config.num_kv_heads, config.head_dim)
  dt = jnp.dtype(config.dtype)
  return [{'k': jnp.zeros(shape, dt), 'v': jnp.zeros(shape, dt)}
          for _ in range(config.num_layers)]


def init_params(config: LlamaConfig, key: jax.Array) -> Params:
  """Random parameters (unboxed pytree) for tests and draft training."""
  model = Llama(config)
  cache = init_cache(config, 1, 1)
  variables = model.init(key, jnp.zeros((1, 1), jnp.int32), cache, jnp.zeros((1,), jnp.int32))
  return nn.unbox(variables['params'])


def logical_axes(config: LlamaConfig) -> Params:
  """Pytree matching the params with a tuple of logical axis names per array."""
  model = Llama(config)
  cache = init_cache(config, 1, 1)
  abstract = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), cache,
                         jnp.zeros((1,), jnp.int32)))
  return jax.tree.map(lambda p: tuple(p.names), abstract['params'],
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def cache_logical_axes(config: LlamaConfig) -> Cache:
  """Logical axis names of each cache array: ('batch', 'seq', 'kv_heads', 'head_dim')."""
  names = ('batch', 'seq', 'kv_heads', 'head_dim')
  return [{'k': names, 'v': names} for _ in range(config.num_layers)]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def apply_forward(model_cls, config, num_layers, with_features, params, tokens_BT, cache,
                  start_B):
  """One forward of `model_cls(config)` (`Llama`, `Gemma3`): `__call__` with `num_layers`, or
  `with_features`. Jitted on its own: inside a larger jitted program (the decode loop) it is a
  nested call that XLA inlines (the same matmul kernels; a few small index ops are no longer
  shared between calls), while its trace is cached by (class, config, shapes) and reused by every
  program that calls the same forward (with three test changes, the suite took 510 s instead of
  925 s on one machine the same morning; commit 1202002). Plain and n-gram decoding of SmolLM2
  timed the same with and without (within this machine's ~10% noise)."""
  model = model_cls(config)
  if with_features:
    return model.apply({'params': params}, tokens_BT, cache, start_B,
                       method=model_cls.with_features)
  return model.apply({'params': params}, tokens_BT, cache, start_B, num_layers=num_layers)


@dataclasses.dataclass(frozen=True)
class LlamaForward:
  """The callable `forward(params, tokens [B,T], cache, start [B]) -> (logits [B,T,V], cache)`
  that `jaxspec` expects. Hashable by value, so it can be a static jit argument.
  `num_layers` set to n < config.num_layers gives the early-exit draft of the same weights."""

  config: LlamaConfig
  num_layers: int | None = None

  def __call__(self, params, tokens_BT, cache, start_B):
    return apply_forward(Llama, self.config, self.num_layers, False, params, tokens_BT, cache,
                         start_B)

  def with_features(self, params, tokens_BT, cache, start_B):
    """`(logits [B,T,V] float32, cache, features [B,T,D])`: the features are the final-normed
    hidden states of the full model (the input of its head); ignores `num_layers`."""
    return apply_forward(Llama, self.config, None, True, params, tokens_BT, cache, start_B)

  def init_cache(self, batch_size: int, max_len: int) -> Cache:
    return init_cache(self.config, batch_size, max_len)
