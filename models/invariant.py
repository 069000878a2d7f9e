"""Reductions whose order does not depend on the other rows (window/batch-invariant numerics).

XLA:CPU vectorizes a reduction over the last axis across several rows at once when there are
enough of them (measured: RMSNorm's mean and softmax's sum over `[3, 9, ...]` round differently
from the same rows one at a time, `[3, 1, ...]`), so a (K+1)-token verify pass and K+1 one-token
steps can give different bits. These sums are written as elementwise adds of fixed halves, a
pairwise tree over the axis zero-padded to a power of two: elementwise ops are computed per
element, and XLA does not reassociate float adds (no fast-math), so every row's result is the same
whatever the other axes' sizes, on any backend. A max is exact in any order and needs no tree.

XLA:CPU's `exp` is not elementwise-invariant either: its vectorized loop and its scalar
remainder loop round differently (measured: 455 of 4096 inputs in [-10, 10] differ between an
array of 8 and one of 1, 3 or 7), and which elements fall in the remainder depends on the shape.
`exp` below uses only correctly rounded operations (+, -, *, floor, an exponent bit shift), so
both loops give the same bits. (logistic, rsqrt, sin and cos passed the same check.)

Used by `models.llama` when `LlamaConfig.invariant` is set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tree_sum(x: jax.Array, axis: int = -1) -> jax.Array:
  """Sum over `axis` in a fixed pairwise order (the axis removed); same dtype as x."""
  x = jnp.moveaxis(x, axis, -1)
  n = x.shape[-1]
  width = 1 << max(n - 1, 0).bit_length()
  if width != n:
    x = jnp.concatenate([x, jnp.zeros((*x.shape[:-1], width - n), x.dtype)], axis=-1)
  while width > 1:
    width //= 2
    x = x[..., :width] + x[..., width:]
  return x[..., 0]


def rms_normalize(x32: jax.Array, eps: float) -> jax.Array:
  """`x * rsqrt(mean(x^2) + eps)` over the last axis of a float32 array, the mean as a tree sum."""
  mean_sq = tree_sum(x32 * x32)[..., None] / x32.shape[-1]
  return x32 * jax.lax.rsqrt(mean_sq + eps)


_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # Cody-Waite split of ln 2 (Cephes expf)
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def exp(x: jax.Array) -> jax.Array:
  """float32 `exp(x)` for x <= 88 (Cephes `expf`, within 2 ulp of the true value) from correctly
  rounded ops only, so the bits do not depend on how XLA vectorizes the loop. Results below
  2^-126 (x < -87.3) are 0; larger x saturates at exp(88)."""
  x = jnp.clip(x.astype(jnp.float32), -87.3, 88.0)
  n = jnp.floor(x * _LOG2E + 0.5)
  r = (x - n * _LN2_HI) - n * _LN2_LO
  p = jnp.float32(_EXP_POLY[0])
  for c in _EXP_POLY[1:]:
    p = p * r + c
  p = p * (r * r) + r + 1.0
  scale = jax.lax.bitcast_convert_type((n.astype(jnp.int32) + 127) << 23, jnp.float32)
  return jnp.where(x > -87.3, p * scale, 0.0)


def softmax(scores: jax.Array) -> jax.Array:
  """`jax.nn.softmax(scores, axis=-1)` (float32) with `exp` above and the normalizer as a tree
  sum. Rows that are all -inf give NaN, as jax.nn.softmax does."""
  m = jnp.max(scores, axis=-1, keepdims=True)
  e = exp(scores - jax.lax.stop_gradient(m))
  return e / tree_sum(e)[..., None]
