"""EAGLE-style drafts (`jaxspec.FeatureDraft`): the loop hands the draft the target's features of
the right positions, round after round.

An oracle draft for a toy target is exact only when every feature it reads belongs to the position
before the one it predicts (`tests/toys.py`), so with correct bookkeeping every drafted token is
accepted, greedy or sampled (q = p), across rows of different prompt lengths, K and EOS stops; the
output equals plain decoding.
"""

import jax
import numpy as np
import pytest

import jaxspec as js
from tests import toys

V = 12


@pytest.mark.parametrize('k', [1, 3, 5])
@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_oracle_feature_draft_accepts_everything(k, temperature):
  target = toys.FeatureTableModel()
  params = toys.random_table(jax.random.key(0), V)
  prompts, lengths = js.pad_prompts([[3], [1, 4, 1, 5, 9, 2, 6], [2, 7]], bucket=8)
  sampling = js.SamplingConfig(temperature=temperature)
  cfg = lambda kk: js.DecodeConfig(num_draft_tokens=kk, max_new_tokens=23, sampling=sampling)
  out = js.generate(params, params, prompts, lengths, np.full(len(lengths), 1), target=target,
                    draft=js.FeatureDraft(toys.OracleFeatureDraft()), config=cfg(k))
  stats = js.summarize(out.metrics)
  assert stats['drafted_tokens'] > 0
  assert stats['acceptance_rate'] == 1.0
  assert all(len(r) == 23 for r in out.new_tokens())
  if temperature == 0:
    plain = js.generate(params, None, prompts, lengths, np.full(len(lengths), 1), target=target,
                        draft=None, config=cfg(0))
    assert out.new_tokens() == plain.new_tokens()


def test_wrong_features_are_caught():
  """The same oracle handed shifted features (a bookkeeping bug) gets tokens rejected."""
  params = toys.random_table(jax.random.key(0), V)

  class Shifted(toys.FeatureTableModel):
    def with_features(self, params, tokens, cache, start):
      logits, cache, f = super().with_features(params, tokens, cache, start)
      return logits, cache, f.at[..., -1].multiply(-1)  # parity of the wrong position

  prompts, lengths = js.pad_prompts([[1, 4, 1, 5]], bucket=8)
  out = js.generate(params, params, prompts, lengths, np.full(len(lengths), 1), target=Shifted(),
                    draft=js.FeatureDraft(toys.OracleFeatureDraft()),
                    config=js.DecodeConfig(num_draft_tokens=3, max_new_tokens=20,
                                           sampling=js.SamplingConfig(temperature=0)))
  assert js.summarize(out.metrics)['acceptance_rate'] < 0.9


def test_target_without_features_is_refused():
  params = toys.random_table(jax.random.key(0), V)
  prompts, lengths = js.pad_prompts([[1, 2]], bucket=8)
  with pytest.raises(ValueError, match='with_features'):
    js.generate(params, params, prompts, lengths, np.full(len(lengths), 1),
                target=toys.TableModel(),
                draft=js.FeatureDraft(toys.OracleFeatureDraft()),
                config=js.DecodeConfig(num_draft_tokens=2, max_new_tokens=4))
