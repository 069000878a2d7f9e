"""N-gram prompt lookup on device, in fixed shapes (Saxena 2023, "Prompt Lookup Decoding")."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _latest_match(tokens, lengths, n):
  """End position of the latest earlier occurrence of each row's last n tokens, or -1.

  tokens `[B, S]` int32, lengths `[B]` int32 -> `[B]` int32. A match must end at or before
  `lengths - 2`, so that at least one token follows it.
  """
  b, s = tokens.shape
  suffix = jnp.take_along_axis(tokens, jnp.clip(lengths[:, None] - n + jnp.arange(n), 0), axis=1)
  match = jnp.ones((b, s), bool)
  for i in range(n):  # candidate end j matches when tokens[j - (n-1) + i] == suffix[i]
    shift = n - 1 - i
    shifted = jnp.pad(tokens, ((0, 0), (shift, 0)), constant_values=-1)[:, :s]
    match &= shifted == suffix[:, i:i + 1]
  pos = jnp.arange(s)
  valid = (pos[None] >= n - 1) & (pos[None] <= lengths[:, None] - 2)
  return jnp.max(jnp.where(match & valid, pos[None], -1), axis=1)


def match_end(tokens: jax.Array, lengths: jax.Array, max_ngram: int,
              min_ngram: int = 1) -> jax.Array:
  """End position of the latest earlier occurrence of each row's last n tokens, for the longest
  n from `max_ngram` down to `min_ngram` that has one: `[B]` int32, -1 where none has.

  Args: as `lookup`.
  """
  end = jnp.full(lengths.shape, -1, jnp.int32)
  for n in range(max_ngram, min_ngram - 1, -1):
    found = _latest_match(tokens, lengths, n)
    end = jnp.where(end < 0, found, end)
  return end


def lookup(tokens: jax.Array, lengths: jax.Array, num_draft_tokens: int, max_ngram: int,
           min_ngram: int = 1) -> jax.Array:
  """Proposes `num_draft_tokens` tokens per row by prompt lookup.

  Args:
    tokens: `[B, S]` int32 buffer; row b's sequence is `tokens[b, :lengths[b]]`.
    lengths: `[B]` int32, >= 1.
    num_draft_tokens: K, static.
    max_ngram, min_ngram: the longest n tried first, down to the shortest.
  Returns:
    `[B, K]` int32: the tokens that followed the latest earlier occurrence of the row's last n
    tokens (`match_end`). A continuation that runs into the present repeats with the match's
    period (so `a b a b` proposes `a b a ...`); with no match at all, the last token is repeated
    (`NGramDraft` proposes nothing there).
  """
  return continuation(tokens, lengths, match_end(tokens, lengths, max_ngram, min_ngram),
                      num_draft_tokens)


def continuation(tokens: jax.Array, lengths: jax.Array, end: jax.Array,
                 num_draft_tokens: int) -> jax.Array:
  """`lookup`'s proposal from `match_end`'s `end` `[B]` int32: `[B, K]` int32."""
  end = jnp.where(end < 0, lengths - 2, end)  # no match: period 1 from the last token
  period = lengths - 1 - end
  idx = end[:, None] + 1 + jnp.arange(num_draft_tokens)[None] % period[:, None]
  return jnp.take_along_axis(tokens, idx, axis=1).astype(jnp.int32)
