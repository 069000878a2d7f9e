"""Sampling rules: temperature, top-k and top-p turn logits into a processed distribution.

Speculative sampling needs the processed distributions themselves, not only sampled tokens: the
same processing must be applied to the target's p and the draft's q, and the draft must sample from
exactly the q that the acceptance test uses. Everything here is float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec import control


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
  """How logits become a distribution.

  Attributes:
    temperature: >= 0; 0 means greedy (argmax), and speculative decoding then reproduces the
      target's greedy output token for token. A tiny positive temperature (1e-9, 1e-40) is the
      greedy limit: the argmax, with exact ties sharing the mass.
    top_k: keep the k most likely tokens (ties at the k-th value are kept); 0 disables.
    top_p: nucleus sampling, keep the smallest set of most likely tokens whose mass is >= top_p;
      must be in (0, 1]; 1 disables.
  Raises:
    ValueError: on an out-of-range value, when the config is built.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f'temperature must be >= 0 (0 = greedy), got {self.temperature}')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'top_p must be in (0, 1], got {self.top_p}')
    if self.top_k < 0:
      raise ValueError(f'top_k must be >= 0 (0 = off), got {self.top_k}')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


TOP_P_CANDIDATES = 1024  # tokens a nucleus is first looked for among (`process_logits`)


def _nucleus_threshold(sorted_desc, top_p):
  """(threshold [..., 1], whether the nucleus ends inside `sorted_desc` [...]) for the
  descending probs `sorted_desc` [..., k] (the k most likely of a row, or all of them)."""
  mass_before = jnp.cumsum(sorted_desc, axis=-1) - sorted_desc
  kept = mass_before < top_p  # always keeps the most likely token
  threshold = jnp.min(jnp.where(kept, sorted_desc, jnp.inf), axis=-1, keepdims=True)
  return threshold, ~kept[..., -1]


def _sorted_threshold_where(redo, probs, threshold, top_p):
  """`threshold` [..., 1] with the rows where `redo` [...] recomputed from a sort of the row."""
  shape = threshold.shape
  redo_R, probs_RV, threshold_R1 = redo.reshape(-1), probs.reshape(-1, probs.shape[-1]), (
      threshold.reshape(-1, 1))

  def row(r, th_R1):
    sort_row = lambda th: th.at[r].set(_nucleus_threshold(-jnp.sort(-probs_RV[r]), top_p)[0])
    return control.run_if(redo_R[r], sort_row, th_R1)

  return jax.lax.fori_loop(0, redo_R.shape[0], row, threshold_R1).reshape(shape)


def process_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Applies temperature, then top-k, then top-p, and normalizes.

  Args:
    logits: `[..., V]` float.
    config: the sampling rule. Greedy gives a one-hot of the argmax.
  Returns:
    probs `[..., V]` float32, summing to 1 over the last axis (NaN where the logits hold NaN or
    +inf, or no finite value: the loop reports such rows, it never samples from them).
  """
  logits = logits.astype(jnp.float32)
  v = logits.shape[-1]
  if config.greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), v, dtype=jnp.float32)
  # Shift the maximum to 0 before scaling, and keep it exactly 0: any temperature > 0, however
  # small, then gives finite or -inf scaled logits and tends to the greedy limit (the argmax,
  # ties shared), never to NaN.
  top = jnp.max(logits, axis=-1, keepdims=True)
  logits = jnp.where((logits == top) & jnp.isfinite(top), 0.0,
                     (logits - top) / config.temperature)
  if 0 < config.top_k < v:
    kth = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if config.top_p < 1:
    # The nucleus is a prefix of the sorted probs; its smallest member is the threshold. It is
    # looked for among the TOP_P_CANDIDATES most likely tokens first (a partial sort: a full sort
    # of a 49k vocabulary costs ~0.6 s a step for 32 rows on a CPU, lax.top_k ~0.02 s), and a
    # row's whole vocabulary is sorted only when its nucleus is larger. Same threshold either
    # way, bit for bit: the candidates are the sorted probs' first entries and a cumulative sum's
    # first entries do not depend on what follows them (tests/test_verify.py).
    k = min(v, TOP_P_CANDIDATES)
    threshold, complete = _nucleus_threshold(jax.lax.top_k(probs, k)[0], config.top_p)
    if k < v:
      threshold = _sorted_threshold_where(~complete, probs, threshold, config.top_p)
    probs = jnp.where(probs >= threshold, probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs

