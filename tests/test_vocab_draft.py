"""A draft with another vocabulary (`jaxspec.vocab.VocabMappedDraft`, TLI): exact sampling.

A toy target over V_t = 5 tokens and a toy draft over V_d = 6 tokens whose vocabularies overlap
partly (target token 4 and draft tokens 2 and 5 have no counterpart). The joint distribution of
the first 3 generated tokens is compared with the target's exact one (chi-square, N = 20000
rows, fixed seeds, fails when p < 1e-3); a mapping whose q does not match its tokens is caught by
the same test. The coupled rule gives the plain tokens; greedy gives the greedy tokens.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from jaxspec import vocab
from tests import toys

VT, VD, N, NUM_TOKENS, ALPHA, PROMPT = 5, 6, 20000, 3, 1e-3, [1, 3]
DRAFT_TO_TARGET = np.array([0, 2, -1, 3, 1, -1], np.int32)
TARGET_TO_DRAFT = np.array([0, 4, 1, 3, -1], np.int32)
TARGET = toys.random_table(jax.random.key(1), VT)
DRAFT_PARAMS = {'draft': toys.random_table(jax.random.key(2), VD),
                'draft_to_target': jnp.asarray(DRAFT_TO_TARGET),
                'target_to_draft': jnp.asarray(TARGET_TO_DRAFT)}
DRAFT = vocab.VocabMappedDraft(js.ModelDraft(toys.TableModel()), fallback_id=5)


def _good_draft_params():
  """A draft table that is the target's own on the intersection (unmapped tokens unlikely)."""
  t = np.asarray(TARGET['table'])
  table = np.full((2, VD, VD), -3.0, np.float32)
  mapped = np.flatnonzero(DRAFT_TO_TARGET >= 0)
  for a in mapped:
    table[:, a, mapped] = t[:, DRAFT_TO_TARGET[a]][:, DRAFT_TO_TARGET[mapped]]
  return {**DRAFT_PARAMS, 'draft': {'table': jnp.asarray(table)}}


@dataclasses.dataclass(frozen=True)
class SmoothedMap(vocab.VocabMappedDraft):
  """Broken on purpose: reports a q with mass on every target token (as if the restriction to
  the intersection were skipped), not the q its tokens were drawn from."""

  def propose(self, params, state, ctx):
    proposal = super().propose(params, state, ctx)
    return dataclasses.replace(proposal, q=0.7 * proposal.q + 0.3 / ctx.vocab_size)


def _rows(draft, sampling, k, verifier=None):
  prompts = np.tile(np.asarray([PROMPT], np.int32), (N, 1))
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=NUM_TOKENS, sampling=sampling,
                           verifier=verifier)
  out = js.generate(TARGET, DRAFT_PARAMS, prompts, np.full((N,), 2), np.arange(N),
                    target=toys.TableModel(), draft=draft, config=config)
  return out


def _pvalue(out, sampling):
  expected = toys.exact_joint(toys.TableModel(), TARGET, PROMPT, NUM_TOKENS, sampling)
  return toys.chi_square_pvalue(toys.joint_counts(out.new_tokens(), NUM_TOKENS, VT), expected)


def test_restriction_renormalizes_and_maps():
  q_d = jnp.asarray([[0.1, 0.2, 0.3, 0.1, 0.2, 0.1]])
  q_t, mass = vocab.restrict_to_target(q_d, jnp.asarray(DRAFT_TO_TARGET), VT)
  np.testing.assert_allclose(mass, [0.6], rtol=1e-6)
  np.testing.assert_allclose(q_t, [[0.1, 0.2, 0.2, 0.1, 0.0]] / np.float32(0.6), rtol=1e-6)


@pytest.mark.parametrize('k', [1, 3])
@pytest.mark.parametrize('sampling', [js.SamplingConfig(temperature=1.0),
                                      js.SamplingConfig(temperature=0.6),
                                      js.SamplingConfig(temperature=1.3, top_k=3)],
                         ids=['T1', 'T0.6', 'T1.3k3'])
def test_other_vocabulary_draft_follows_target(sampling, k):
  out = _rows(DRAFT, sampling, k)
  stats = js.summarize(out.metrics)
  assert 0 < stats['acceptance_rate'] < 1
  assert all(0 <= t < VT for r in out.new_tokens() for t in r)
  assert _pvalue(out, sampling) > ALPHA


def test_broken_mapping_is_detected():
  sampling = js.SamplingConfig(temperature=1.0)
  assert _pvalue(_rows(SmoothedMap(js.ModelDraft(toys.TableModel()), 5), sampling, 3),
                 sampling) < ALPHA


@pytest.mark.parametrize('sampling, verifier', [
    (js.SamplingConfig(temperature=0), None), (js.SamplingConfig(temperature=0.9), js.Coupled())],
    ids=['greedy', 'coupled'])
def test_other_vocabulary_draft_gives_plain_tokens(sampling, verifier):
  prompts, lengths = js.pad_prompts([[1, 3], [0, 2, 4], [3], [4, 4, 1]], bucket=4)
  run = lambda draft, k: js.generate(
      TARGET, _good_draft_params(), prompts, lengths, np.arange(4), target=toys.TableModel(),
      draft=draft, config=js.DecodeConfig(num_draft_tokens=k, max_new_tokens=16,
                                          sampling=sampling, verifier=verifier))
  plain = run(None, 0).new_tokens()
  for k in (1, 4):
    out = run(DRAFT, k)
    assert out.new_tokens() == plain
    assert js.summarize(out.metrics)['accepted_tokens'] > 0


def test_feature_or_shared_cache_drafts_refused():
  with pytest.raises(ValueError, match='another vocabulary'):
    vocab.VocabMappedDraft(js.ModelDraft(toys.TableModel(), shares_target_cache=True))


def test_readiness_is_the_inner_drafts():
  """A wrapped n-gram draft is ready where the n-gram draft finds a match in the mapped ids
  (the last token seen before), not on every row as a model draft is."""
  mapped = vocab.VocabMappedDraft(js.NGramDraft())
  tokens = jnp.asarray([[1, 3, 1, 0], [1, 3, 2, 0]], jnp.int32)
  lengths = jnp.asarray([3, 3], jnp.int32)
  ready = mapped.ready(DRAFT_PARAMS, None, tokens, lengths)
  assert ready.tolist() == [True, False]
  assert ready.tolist() == js.NGramDraft().ready(None, None, tokens, lengths).tolist()
