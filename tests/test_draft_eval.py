"""models.draft_eval: acceptance per prompt set from one batched decode (toy target and drafts)."""

import types

import jax
import numpy as np

import jaxspec as js
from models import draft_eval
from tests import toys

V = 12
TARGET = toys.TableModel()
PARAMS = toys.random_table(jax.random.key(0), V)
OTHER = toys.random_table(jax.random.key(1), V)


class CharTokenizer:
  """A prompt's characters mod V; a fixed 'chat template' token 1 in front."""
  pad_id = 0
  chat_eos_id = V  # never sampled: answers run to the budget

  def encode_chat(self, text):
    return [1] + [2 + ord(c) % (V - 2) for c in text]


def _measure(monkeypatch, draft_params, sets, k=3):
  monkeypatch.setattr(draft_eval.loading, 'forward_for', lambda config: TARGET)
  config = types.SimpleNamespace(context_length=None)
  return draft_eval.measure(PARAMS, config, CharTokenizer(), js.ModelDraft(TARGET), draft_params,
                            sets, num_draft_tokens=k, temperature=0.0, max_new_tokens=12)


def test_a_perfect_draft_is_always_accepted(monkeypatch):
  out = _measure(monkeypatch, PARAMS, {'dev chat': ['ab', 'cde'], 'train': ['f']})
  for name in ('dev chat', 'train', 'dev'):
    assert out[name]['acceptance_rate'] == 1.0
    assert out[name]['position_acceptance'] == [1.0, 1.0, 1.0]


def test_sets_are_rows_of_one_batch(monkeypatch):
  # Each set's numbers are its rows' alone: decoded on its own, a set gives the same summary;
  # 'dev' pools the dev sets (drafted-token weighted), not the training prompts.
  sets = {'dev chat': ['ab', 'cde', 'gh'], 'dev grounded': ['ijk'], 'train': ['lm', 'n']}
  out = _measure(monkeypatch, OTHER, sets)
  assert 0 < out['dev']['acceptance_rate'] < 1
  for name in sets:
    alone = _measure(monkeypatch, OTHER, {name: sets[name]})[name]
    assert alone == out[name], name
  chat, grounded = out['dev chat'], out['dev grounded']
  pooled = (chat['accepted_tokens'] + grounded['accepted_tokens']) / (
      chat['drafted_tokens'] + grounded['drafted_tokens'])
  np.testing.assert_allclose(out['dev']['acceptance_rate'], pooled)
  md = draft_eval.table([dict(draft='toy', temperature=0.0, num_draft_tokens=3, set=n, rows=1,
                              **s) for n, s in out.items()])
  assert md.count('\n') == 2 + len(out) and '| toy |' in md
