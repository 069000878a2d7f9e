"""Random numbers that belong to a row and a position, never to a batch.

Every random number a row uses is a function of its own key (from its own seed) and of the
absolute position in its sequence it decides: `fold_in(fold_in(row_key, stream), position)`.
So the same prompt with the same seed gives the same tokens alone or at any index of any batch,
and a run is reproduced bit for bit by its seeds. Streams keep the uses apart:

  TARGET  the target's own sampling at a position (plain sampling, the replacement or bonus
          token of speculative sampling, and every token under the coupled verifier)
  ACCEPT  the uniforms of the accept/reject tests
  DRAFT   the draft's sampling (under verifiers that do not couple it to the target)

A position's noise may be drawn again in a later round (a drafted token that was not reached is
redrawn from a new q with the same noise); that is sound because a value that did not influence
anything committed is still independent of everything committed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

TARGET, ACCEPT, DRAFT = 0, 1, 2


def row_keys(seeds) -> jax.Array:
  """Per-row PRNG keys from seeds `[B]` (integers) or from typed keys `[B]` (returned as they
  are). Raises ValueError on another shape or dtype."""
  if isinstance(seeds, jax.Array) and jnp.issubdtype(seeds.dtype, jax.dtypes.prng_key):
    if seeds.ndim != 1:
      raise ValueError(f'seeds must be one key per row, shape [B]; got shape {seeds.shape}')
    return seeds
  arr = np.asarray(seeds)
  if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f'seeds must be integers, one per row (shape [B]); got dtype {arr.dtype} '
                     f'shape {arr.shape}')
  return jax.vmap(jax.random.key)(jnp.asarray(arr.astype(np.uint32)))


def _keys_at(keys_B, stream, positions_BT):
  """`[B]` keys and `[B,T]` positions -> `[B,T]` keys."""
  per_row = lambda key, pos: jax.vmap(
      lambda p: jax.random.fold_in(jax.random.fold_in(key, stream), p))(pos)
  return jax.vmap(per_row)(keys_B, positions_BT)


def uniform(keys_B: jax.Array, stream: int, positions_BT: jax.Array) -> jax.Array:
  """U(0, 1) float32 `[B,T]`, one number per (row, position)."""
  return jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32)))(
      _keys_at(keys_B, stream, positions_BT))


def gumbel_max(keys_B: jax.Array, stream: int, positions_B: jax.Array,
               probs_BV: jax.Array) -> jax.Array:
  """Samples one token per row from probs `[B,V]` float32 (Gumbel-max: the argmax of
  log probs + Gumbel noise of the row at `positions_B [B]`) -> `[B]` int32."""
  keys = _keys_at(keys_B, stream, positions_B[:, None])[:, 0]
  g = jax.vmap(lambda k: jax.random.gumbel(k, probs_BV.shape[-1:], jnp.float32))(keys)
  return jnp.argmax(jnp.log(probs_BV) + g, axis=-1).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowNoise:
  """The noise of a round: keys `[B]` and L `[B]` int32, the position of the round's first
  drafted (or sampled) token; window index j decides position L + j."""

  keys: jax.Array
  positions: jax.Array

  def uniform(self, stream: int, width: int) -> jax.Array:
    """`[B, width]` uniforms for positions L .. L + width - 1."""
    return uniform(self.keys, stream, self.positions[:, None] + jnp.arange(width))

  def gumbel_max(self, stream: int, index_B: jax.Array, probs_BV: jax.Array) -> jax.Array:
    """Samples each row's token at window index `index_B [B]` from probs `[B,V]`."""
    return gumbel_max(self.keys, stream, self.positions + index_B, probs_BV)
