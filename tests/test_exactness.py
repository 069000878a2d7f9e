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


def _sample_rows(draft, target_params, draft_params, sampling, k, seed=0, verifier=None):
  prompts = np.tile(np.asarray([PROMPT], np.int32), (N, 1))
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=NUM_TOKENS, sampling=sampling,
                           verifier=verifier)
  out = js.generate(target_params, draft_params, prompts, np.full((N,), len(PROMPT)),
                    np.arange(N) + N * seed, target=toys.TableModel(), draft=draft,
                    config=config)
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


VERIFIERS = {'exact': js.Exact(), 'coupled': js.Coupled()}


@pytest.mark.parametrize('verifier', list(VERIFIERS))
@pytest.mark.parametrize('k', [1, 3, 6])
@pytest.mark.parametrize('sampling', SAMPLINGS,
                         ids=lambda s: f'T{s.temperature}k{s.top_k}p{s.top_p}')
def test_model_draft_follows_target(sampling, k, verifier):
  rows = _sample_rows(js.ModelDraft(toys.TableModel()), TARGET, DRAFT, sampling, k,
                      verifier=VERIFIERS[verifier])
  assert all(len(r) == NUM_TOKENS for r in rows)
  assert _pvalue(rows, TARGET, sampling) > ALPHA


@pytest.mark.parametrize('verifier', list(VERIFIERS))
@pytest.mark.parametrize('k', [1, 3, 6])
def test_ngram_draft_follows_target(k, verifier):
  sampling = js.SamplingConfig(temperature=0.8)
  rows = _sample_rows(js.NGramDraft(max_ngram=2), TARGET, None, sampling, k,
                      verifier=VERIFIERS[verifier])
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

  def propose(self, params, state, ctx):
    proposal = super().propose(params, state,
                               dataclasses.replace(ctx, sampling=js.SamplingConfig(temperature=0)))
    q = _window_q(self.forward, params, ctx.tokens, ctx.lengths, proposal.tokens, ctx.sampling)
    return dataclasses.replace(proposal, q=q)


@dataclasses.dataclass(frozen=True)
class RawQDraft(js.ModelDraft):
  """Broken on purpose: samples from the processed q, but reports the raw softmax (no
  temperature / top-k) to the verifier."""

  def propose(self, params, state, ctx):
    proposal = super().propose(params, state, ctx)
    q = _window_q(self.forward, params, ctx.tokens, ctx.lengths, proposal.tokens,
                  js.SamplingConfig())
    return dataclasses.replace(proposal, q=q)


@dataclasses.dataclass(frozen=True)
class CoupledFreshNoise(js.Coupled):
  """Broken on purpose: the coupled rule, but the token after the accepted prefix is drawn from p
  with fresh noise (another stream) instead of the coupled noise, forgetting that a rejection
  has already ruled out the drafted token: the drafted token comes out too often."""

  def __call__(self, rows, proposal, logits, sampling):
    n, _ = super().__call__(rows, proposal, logits, sampling)
    p = js.process_logits(logits, sampling)
    dist = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
    return n, rows.gumbel_max(js.noise.DRAFT, n, dist)


@pytest.mark.parametrize('broken, sampling, verifier', [
    (GreedyDraftSoftmaxQ(toys.TableModel()), js.SamplingConfig(temperature=1.0), None),
    (RawQDraft(toys.TableModel()), js.SamplingConfig(temperature=0.5, top_k=2), None),
    (js.ModelDraft(toys.TableModel()), js.SamplingConfig(temperature=1.0),
     CoupledFreshNoise()),
], ids=['greedy_q', 'raw_q', 'coupled_fresh_noise'])
def test_broken_verifier_is_detected(broken, sampling, verifier):
  """The same check rejects a draft whose reported q is not the q it sampled from, and a
  coupled rule that resamples with fresh noise."""
  rows = _sample_rows(broken, TARGET, DRAFT, sampling, 3, verifier=verifier)
  assert _pvalue(rows, TARGET, sampling) < ALPHA
