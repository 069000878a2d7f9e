"""The verification math against a float64 NumPy reference (Leviathan et al. 2023, Alg. 1)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from tests import toys

ALPHA = 1e-3


def reference_outcomes(p, q, drafted):
  """Exact probability of each outcome (num_accepted, next_token) for one row, float64.

  p `[K+1, V]`, q `[K, V]`, drafted `[K]` -> `[K+1, V]`."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)  # float32 round-off
  k, v = q.shape
  out = np.zeros((k + 1, v))
  reach = 1.0
  for i in range(k):
    x = drafted[i]
    accept = min(1.0, p[i, x] / q[i, x])
    residual = np.maximum(p[i] - q[i], 0.0)
    if residual.sum() > 0:
      out[i] = reach * (1 - accept) * residual / residual.sum()
    reach *= accept
  out[k] = reach * p[k]
  return out


def _rows(n, seed=0):
  """Noise for n independent rows (seeds seed*n .. seed*n + n - 1), window at position 0."""
  return js.RowNoise(js.row_keys(np.arange(n) + seed * n), jnp.zeros((n,), jnp.int32))


def _tile(n, drafted, q, p):
  return (jnp.tile(drafted, (n, 1)), jnp.tile(q, (n, 1, 1)), jnp.tile(p, (n, 1, 1)))


def _random_case(seed, k, v):
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.full(v, 0.7), size=k + 1).astype(np.float32)
  q = rng.dirichlet(np.full(v, 0.7), size=k).astype(np.float32)
  drafted = np.array([rng.choice(v, p=q[i] / q[i].sum()) for i in range(k)], np.int32)
  return p, q, drafted


@pytest.mark.parametrize('seed, k, v', [(0, 1, 4), (1, 3, 5), (2, 5, 3)])
def test_exact_outcomes_match_reference(seed, k, v):
  p, q, drafted = _random_case(seed, k, v)
  n = 100_000
  accepted, nxt = jax.jit(js.verify_exact)(_rows(n, seed), *_tile(n, drafted, q, p))
  counts = np.zeros((k + 1, v))
  np.add.at(counts, (np.asarray(accepted), np.asarray(nxt)), 1)
  expected = reference_outcomes(p, q, drafted)
  assert abs(expected.sum() - 1) < 1e-9
  assert toys.chi_square_pvalue(counts, expected) > ALPHA


def test_equal_distributions_accept_everything():
  p, q, drafted = _random_case(3, 4, 6)
  p[:4] = q
  accepted, _ = js.verify_exact(_rows(64), *_tile(64, drafted, q, p))
  assert np.all(np.asarray(accepted) == 4)


def test_impossible_draft_is_rejected_and_replaced_from_p():
  v = 4
  p = np.array([[0.0, 0.5, 0.5, 0.0], [0.25] * 4], np.float32)
  q = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)  # one-hot on a token p never produces
  accepted, nxt = js.verify_exact(_rows(4000), *_tile(4000, np.zeros(1, np.int32), q, p))
  assert np.all(np.asarray(accepted) == 0)
  counts = np.bincount(np.asarray(nxt), minlength=v)
  assert counts[0] == 0 and counts[3] == 0
  assert toys.chi_square_pvalue(counts, p[0]) > ALPHA


def test_greedy_matches_reference():
  rng = np.random.default_rng(0)
  for _ in range(50):
    k, v = rng.integers(1, 6), rng.integers(2, 6)
    logits = rng.normal(size=(1, k + 1, v)).astype(np.float32)
    target = logits[0].argmax(-1)
    drafted = np.where(rng.random(k) < 0.6, target[:k], rng.integers(0, v, k)).astype(np.int32)
    n = 0
    while n < k and drafted[n] == target[n]:
      n += 1
    accepted, nxt = js.verify_greedy(jnp.asarray(drafted[None]), jnp.asarray(logits))
    assert (int(accepted[0]), int(nxt[0])) == (n, target[n])


def test_shape_errors():
  with pytest.raises(ValueError, match=r'\[B, K\+1, V\]'):
    js.verify_greedy(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3, 5)))
  with pytest.raises(ValueError, match=r'\[B, K, V\]'):
    js.verify_exact(_rows(2), jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3, 4)),
                    jnp.zeros((2, 4, 5)))


def _full_sort_top_p(logits, config):
  """The nucleus from a sort of the whole vocabulary (the reference `process_logits` keeps)."""
  probs = js.process_logits(logits, dataclasses.replace(config, top_p=1.0))
  sorted_desc = -jnp.sort(-probs, axis=-1)
  mass_before = jnp.cumsum(sorted_desc, axis=-1) - sorted_desc
  threshold = jnp.min(jnp.where(mass_before < config.top_p, sorted_desc, jnp.inf), axis=-1,
                      keepdims=True)
  probs = jnp.where(probs >= threshold, probs, 0.0)
  return probs / jnp.sum(probs, axis=-1, keepdims=True)


@pytest.mark.parametrize('candidates', [1024, 8])
def test_top_p_equals_a_full_sort_bit_for_bit(monkeypatch, candidates):
  # Rows 0-2 peaked (their nucleus lies among the candidates), row 3 flat (it does not: the whole
  # vocabulary is sorted), for the batch at once and for the peaked rows alone.
  monkeypatch.setattr(js.sampling, 'TOP_P_CANDIDATES', candidates)
  scale = jnp.array([[8.0], [5.0], [3.0], [0.01]])
  logits = scale * jax.random.normal(jax.random.key(3), (4, 4096))
  for config in (js.SamplingConfig(top_p=0.9), js.SamplingConfig(temperature=0.7, top_p=0.5),
                 js.SamplingConfig(temperature=1.1, top_p=0.95, top_k=3000)):
    for rows in (logits, logits[:3], logits[3:]):
      got = jax.jit(lambda x: js.process_logits(x, config))(rows)
      np.testing.assert_array_equal(got, jax.jit(lambda x: _full_sort_top_p(x, config))(rows))
      assert 0 < int(jnp.sum(got[-1] > 0)) < 4096


def test_sampling_processing():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  np.testing.assert_allclose(js.process_logits(logits, js.SamplingConfig()), [[0.5, 0.3, 0.15,
                                                                               0.05]], rtol=1e-6)
  np.testing.assert_allclose(js.process_logits(logits, js.SamplingConfig(top_k=2)),
                             [[0.625, 0.375, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(js.process_logits(logits, js.SamplingConfig(top_p=0.8)),
                             [[0.625, 0.375, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(js.process_logits(logits, js.SamplingConfig(top_p=0.81)),
                             [[0.5, 0.3, 0.15, 0]] / np.float32(0.95), rtol=1e-6)
  np.testing.assert_array_equal(js.process_logits(logits, js.SamplingConfig(temperature=0)),
                                [[1, 0, 0, 0]])
  hot = js.process_logits(logits, js.SamplingConfig(temperature=0.5))
  expected = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
  np.testing.assert_allclose(hot[0], expected / expected.sum(), rtol=1e-5)
