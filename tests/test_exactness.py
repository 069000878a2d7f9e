"""Exactness: speculative sampling reproduces the target's distribution (chi-square tests).

Each test draws N = 20000 independent rows from one `generate` call with a fixed key and compares
the joint distribution of the first 3 generated tokens (V = 5, so 125 cells; cells with an
expected count below 5 are pooled) with the exact target distribution computed by enumeration.
Significance: a test fails when p < 1e-3. The seeds are fixed, so the outcome is deterministic.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from tests import toys

V = 5
N = 20000
NUM_TOKENS = 3
ALPHA = 1e-3
PROMPT = [1, 3]


def _sample_rows(draft, target_params, draft_params, sampling, k, seed=0):
  prompts = np.tile(np.asarray([PROMPT], np.int32), (N, 1))
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=NUM_TOKENS, sampling=sampling)
  out = js.generate(target_params, draft_params, prompts, np.full((N,), len(PROMPT)),
                    jax.random.key(seed), target=toys.TableModel(), draft=draft, config=config)
  return out.new_tokens()


def _pvalue(rows, target_params, sampling):
  expected = toys.exact_joint(toys.TableModel(), target_params, PROMPT, NUM_TOKENS, sampling)
  return toys.chi_square_pvalue(toys.joint_counts(rows, NUM_TOKENS, V), expected)


TARGET = toys.random_table(jax.random.key(1), V)
DRAFT = toys.random_table(jax.random.key(2), V)

SAMPLINGS = [
    js.SamplingConfig(temperature=1.0),
    js.SamplingConfig(temperature=0.6),
    js.SamplingConfig(temperature=1.4, top_k=3),
    js.SamplingConfig(temperature=1.0, top_p=0.8),
]


@pytest.mark.parametrize('k', [1, 3, 6])
@pytest.mark.parametrize('sampling', SAMPLINGS, ids=lambda s: f'T{s.temperature}k{s.top_k}p{s.top_p}')
def test_model_draft_follows_target(sampling, k):
  rows = _sample_rows(js.ModelDraft(toys.TableModel()), TARGET, DRAFT, sampling, k)
  assert all(len(r) == NUM_TOKENS for r in rows)
  assert _pvalue(rows, TARGET, sampling) > ALPHA


@pytest.mark.parametrize('k', [1, 3, 6])
def test_ngram_draft_follows_target(k):
  sampling = js.SamplingConfig(temperature=0.8)
  rows = _sample_rows(js.NGramDraft(max_ngram=2), TARGET, None, sampling, k)
  assert _pvalue(rows, TARGET, sampling) > ALPHA


def test_plain_sampling_follows_target():
  sampling = js.SamplingConfig(temperature=1.0)
  rows = _sample_rows(None, TARGET, None, sampling, 0)
  assert _pvalue(rows, TARGET, sampling) > ALPHA


def _window_q(forward, params, tokens, lengths, draft_tokens, sampling):
  """The processed q at each drafted position, recomputed from the full window (table model)."""
  last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)
  window = jnp.concatenate([last, draft_tokens[:, :-1]], axis=1)
  logits, _ = forward(params, window, None, lengths - 1)
  return js.process_logits(logits, sampling)


@dataclasses.dataclass(frozen=True)
class GreedyDraftSoftmaxQ(js.ModelDraft):
  """Broken on purpose: samples greedily, but reports its softmax q to the verifier."""

  def propose(self, params, state, tokens, lengths, key, *, num_draft_tokens, sampling,
              vocab_size):
    draft_tokens, _, state = super().propose(
        params, state, tokens, lengths, key, num_draft_tokens=num_draft_tokens,
        sampling=js.SamplingConfig(temperature=0), vocab_size=vocab_size)
    q = _window_q(self.forward, params, tokens, lengths, draft_tokens, sampling)
    return draft_tokens, q, state


@dataclasses.dataclass(frozen=True)
class RawQDraft(js.ModelDraft):
  """Broken on purpose: samples from the processed q, but reports the raw softmax (no
  temperature / top-k) to the verifier."""

  def propose(self, params, state, tokens, lengths, key, *, num_draft_tokens, sampling,
              vocab_size):
    draft_tokens, _, state = super().propose(
        params, state, tokens, lengths, key, num_draft_tokens=num_draft_tokens,
        sampling=sampling, vocab_size=vocab_size)
    q = _window_q(self.forward, params, tokens, lengths, draft_tokens, js.SamplingConfig())
    return draft_tokens, q, state


@pytest.mark.parametrize('broken, sampling', [
    (GreedyDraftSoftmaxQ(toys.TableModel()), js.SamplingConfig(temperature=1.0)),
    (RawQDraft(toys.TableModel()), js.SamplingConfig(temperature=0.5, top_k=2)),
])
def test_broken_verifier_is_detected(broken, sampling):
  """The same check rejects a draft whose reported q is not the q it sampled from."""
  rows = _sample_rows(broken, TARGET, DRAFT, sampling, 3)
  assert _pvalue(rows, TARGET, sampling) < ALPHA
