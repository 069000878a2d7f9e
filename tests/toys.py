"""Toy models for tests: the same `forward(params, tokens, cache, start)` interface as real ones."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.sampling import SamplingConfig, process_logits


@dataclasses.dataclass(frozen=True)
class TableModel:
  """A fixed probability table: the next token depends on the current token and on the parity of
  its position, `logits = params['table'][position % 2, token]` (`table` `[2, V, V]`). It keeps a
  (unused) cache array so that it exercises the same plumbing as a real model."""

  def __call__(self, params, tokens, cache, start):
    positions = start[:, None] + jnp.arange(tokens.shape[1])
    return params['table'][positions % 2, tokens], cache

  def init_cache(self, batch_size, buffer_len):
    return jnp.zeros((batch_size, buffer_len), jnp.float32)


def random_table(key, vocab_size, scale=1.5):
  return {'table': scale * jax.random.normal(key, (2, vocab_size, vocab_size))}


def exact_joint(forward, params, prompt, num_tokens, sampling: SamplingConfig) -> np.ndarray:
  """The target's exact distribution over its first `num_tokens` generated tokens (float64),
  by enumerating every sequence and running full forward passes: shape `[V] * num_tokens`."""
  prompt = list(prompt)
  v = None
  probs = {(): 1.0}
  for step in range(num_tokens):
    seqs = list(probs)
    toks = jnp.asarray([prompt + list(s) for s in seqs], jnp.int32)
    cache = forward.init_cache(len(seqs), toks.shape[1])
    logits, _ = forward(params, toks, cache, jnp.zeros((len(seqs),), jnp.int32))
    p = np.asarray(process_logits(logits[:, -1], sampling), np.float64)
    v = p.shape[-1]
    probs = {s + (y,): probs[s] * p[i, y] for i, s in enumerate(seqs) for y in range(v)}
  out = np.zeros([v] * num_tokens)
  for s, pr in probs.items():
    out[s] = pr
  return out / out.sum()


def chi_square_pvalue(counts: np.ndarray, expected_probs: np.ndarray, min_expected=5.0) -> float:
  """Pearson chi-square goodness of fit; cells with expected count < min_expected are pooled."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  counts, expected = counts.ravel().astype(np.float64), expected_probs.ravel() * counts.sum()
  small = expected < min_expected
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  if np.any(obs[~keep] > 0):
    return 0.0  # a sample the target can never produce
  obs, exp = obs[keep], exp[keep]
  return float(stats.chisquare(obs, exp).pvalue)


def joint_counts(tokens_rows: list[list[int]], num_tokens: int, vocab_size: int) -> np.ndarray:
  counts = np.zeros([vocab_size] * num_tokens)
  for row in tokens_rows:
    counts[tuple(row[:num_tokens])] += 1
  return counts


@dataclasses.dataclass(frozen=True)
class FeatureTableModel(TableModel):
  """`TableModel` whose features (for EAGLE-style drafts) are `[one_hot(token), s]`, with s = +1
  at even positions and -1 at odd ones: shape `[B, T, V + 1]`."""

  def with_features(self, params, tokens, cache, start):
    logits, cache = self(params, tokens, cache, start)
    positions = start[:, None] + jnp.arange(tokens.shape[1])
    return logits, cache, _table_features(tokens, positions % 2 == 0, logits.shape[-1])


def _table_features(tokens, even, vocab_size):
  sign = jnp.where(even, 1.0, -1.0)[..., None]
  return jnp.concatenate([jax.nn.one_hot(tokens, vocab_size), sign], axis=-1)


@dataclasses.dataclass(frozen=True)
class OracleFeatureDraft:
  """A `FeatureDraft` forward that is exact for `FeatureTableModel` only if it is handed the right
  features: it never sees positions, and learns the parity of position j from the sign in the
  previous position's feature f_{j-1} (zeros before the first position count as odd). Wrong
  feature bookkeeping gives the wrong parity, hence rejected draft tokens."""

  def __call__(self, params, tokens, prev_features, cache, start):
    del params, start
    even = ~(prev_features[..., -1] > 0)
    return _table_features(tokens, even, prev_features.shape[-1] - 1), cache

  def logits(self, params, features):
    v = features.shape[-1] - 1
    token = jnp.argmax(features[..., :v], axis=-1)
    return params['table'][jnp.where(features[..., -1] > 0, 0, 1), token]

  def init_cache(self, batch_size, buffer_len):
    return jnp.zeros((batch_size, buffer_len), jnp.float32)


def ngram_reference(seq: list[int], num_draft_tokens: int, max_ngram: int,
                    min_ngram: int = 1) -> list[int] | None:
  """Prompt lookup in plain Python: what followed the latest earlier occurrence of the last n
  tokens, n from max_ngram down to min_ngram, repeated with the match's period; None without a
  match."""
  for n in range(max_ngram, min_ngram - 1, -1):
    if len(seq) < n + 1:
      continue
    ends = [j for j in range(n - 1, len(seq) - 1) if seq[j - n + 1:j + 1] == seq[len(seq) - n:]]
    if ends:
      j = ends[-1]
      period = len(seq) - 1 - j
      return [seq[j + 1 + i % period] for i in range(num_draft_tokens)]
  return None
