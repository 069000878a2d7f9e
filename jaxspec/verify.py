"""Verification of a drafted window: modified rejection sampling and its greedy limit.

Exact mode is Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 (Section 2.3), equivalently Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling", Algorithm 2: drafted token x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)); when all K are accepted a bonus token is drawn from p_{K+1}. The output
then follows the target's distribution exactly. Greedy mode accepts while the drafted token equals
the target's argmax and emits the target's argmax at the first mismatch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check_shapes(draft_tokens, p_or_logits, q=None):
  b, k = draft_tokens.shape
  if p_or_logits.shape[:2] != (b, k + 1):
    raise ValueError(f'target distributions must be [B, K+1, V] = [{b}, {k + 1}, V], got '
                     f'{p_or_logits.shape}')
  if q is not None and q.shape != (b, k, p_or_logits.shape[-1]):
    raise ValueError(f'draft distributions must be [B, K, V] = [{b}, {k}, '
                     f'{p_or_logits.shape[-1]}], got {q.shape}')


def verify_exact(key: jax.Array, draft_tokens: jax.Array, q: jax.Array,
                 p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Modified rejection sampling over one drafted window (Leviathan et al. 2023, Alg. 1).

  Args:
    key: a PRNG key, consumed here.
    draft_tokens: `[B, K]` int32, drafted tokens; x_i must have been sampled from q_i.
    q: `[B, K, V]` float32, the processed draft distributions the tokens were sampled from.
    p: `[B, K+1, V]` float32, the processed target distributions at the K+1 window positions.
  Returns:
    (num_accepted `[B]` int32 in [0, K], next_token `[B]` int32): the replacement token at the
    first rejection, or the bonus token from p_{K+1} when all K are accepted.
  Raises:
    ValueError: on inconsistent shapes (at trace time).
  """
  _check_shapes(draft_tokens, p, q)
  k = draft_tokens.shape[1]
  key_accept, key_resample = jax.random.split(key)
  p_x = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]
  u = jax.random.uniform(key_accept, draft_tokens.shape, jnp.float32)
  accepted = u * q_x < p_x  # u < p/q without dividing; p >= q always accepts
  num_accepted = jnp.sum(jnp.cumprod(accepted, axis=1), axis=1).astype(jnp.int32)

  residual = jnp.maximum(p[:, :k] - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # A rejection implies p_i(x_i) < q_i(x_i), hence mass > 0; the fallback only guards round-off.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p[:, :k])
  candidates = jnp.concatenate([residual, p[:, k:]], axis=1)  # [B, K+1, V]
  dist = jnp.take_along_axis(candidates, num_accepted[:, None, None], axis=1)[:, 0]
  next_token = jax.random.categorical(key_resample, jnp.log(dist), axis=-1).astype(jnp.int32)
  return num_accepted, next_token


def verify_greedy(draft_tokens: jax.Array,
                  target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy verification: accept the longest prefix equal to the target's argmax.

  Args:
    draft_tokens: `[B, K]` int32.
    target_logits: `[B, K+1, V]` float (logits or probabilities; only the argmax is used).
  Returns:
    (num_accepted `[B]` int32 in [0, K], next_token `[B]` int32 = the target's argmax right after
    the accepted prefix).
  """
  _check_shapes(draft_tokens, target_logits)
  target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, K+1]
  k = draft_tokens.shape[1]
  match = draft_tokens == target_tokens[:, :k]
  num_accepted = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
  next_token = jnp.take_along_axis(target_tokens, num_accepted[:, None], axis=1)[:, 0]
  return num_accepted, next_token
