"""Token-level intersection tables (`models.vocab_map`): toy byte-level and SentencePiece
vocabularies with a known partial overlap, and SmolLM2 <-> Gemma 3 when both are installed."""

import dataclasses

import numpy as np
import pytest

from models import gguf_loader, vocab_map
from models.tokenizer import load_tokenizer


@dataclasses.dataclass(frozen=True)
class ToyTokenizer:
  """Greedy longest-match over `tokens` after spelling the text in the vocabulary's alphabet."""

  kind: str
  tokens: tuple[str, ...]
  special_ids: frozenset = frozenset()

  def encode(self, text):
    spelled = text.replace(' ', 'Ġ' if self.kind == 'byte_level' else '\u2581')
    ids, i = [], 0
    lookup = {t: n for n, t in enumerate(self.tokens) if n not in self.special_ids}
    while i < len(spelled):
      for j in range(len(spelled), i, -1):
        if spelled[i:j] in lookup:
          ids.append(lookup[spelled[i:j]])
          i = j
          break
      else:
        raise ValueError(f'cannot encode {spelled[i:]!r}')
    return ids


# Byte-level: 'Ġ' is a space, 'Ċ' a newline, 'Ã©' the two UTF-8 bytes of 'é'.
DRAFT = ToyTokenizer('byte_level', ('<|im_end|>', 'a', 'b', 'Ġa', 'Ġthe', 'Ċ', 'Ã©', 'ab', 'z',
                                    '<s>'), frozenset({0, 9}))
# SentencePiece: '▁' is a space, '<0x0A>' the newline byte, 'é' is UTF-8 text; '<s>' special.
TARGET = ToyTokenizer('sentencepiece', ('<s>', '<0x0A>', '\u2581the', 'a', 'é', '\u2581a', 'b',
                                        'q', '\u2581\u2581', '  ', '<|im_end|>'),
                      frozenset({0}))


def test_toy_tables():
  m = vocab_map.build_vocab_map(DRAFT, TARGET)
  expected = {1: 3, 2: 6, 3: 5, 4: 2, 5: 1, 6: 4}  # a, b, ' a', ' the', '\n', 'é'
  assert m.draft_to_target.dtype == np.int32 and m.draft_to_target.shape == (10,)
  assert m.target_to_draft.shape == (11,)
  assert {d: int(t) for d, t in enumerate(m.draft_to_target) if t >= 0} == expected
  assert {int(d): t for t, d in enumerate(m.target_to_draft) if d >= 0} == expected
  assert m.size == 6
  # Control tokens stay unmapped even with equal strings ('<|im_end|>' is special in the draft
  # only; '<s>' is special on both sides, mapped only with map_special).
  assert m.draft_to_target[0] == -1 and m.draft_to_target[9] == -1
  special = vocab_map.build_vocab_map(DRAFT, TARGET, map_special=True)
  assert special.draft_to_target[9] == 0 and special.draft_to_target[0] == -1
  assert m.vocab_coverage() == {'draft': 0.6, 'target': 6 / 11}


def test_duplicate_spellings_map_one_to_one():
  """'▁▁' and '  ' both spell two spaces in the target: one pair, on the id the target's own
  tokenizer produces (the earlier one here, id 8)."""
  draft = ToyTokenizer('byte_level', ('ĠĠ', 'a'))
  m = vocab_map.build_vocab_map(draft, TARGET)
  assert m.draft_to_target.tolist() == [8, 3]
  assert m.target_to_draft[9] == -1 and m.target_to_draft[8] == 0
  mapped = m.draft_to_target[m.draft_to_target >= 0]
  assert len(set(mapped.tolist())) == len(mapped)


def test_text_coverage():
  m = vocab_map.build_vocab_map(DRAFT, TARGET)
  cov = m.text_coverage(DRAFT, TARGET, ['ab the', 'b a'])
  # Draft: 'ab' 'Ġthe' | 'b' 'Ġa': 'ab' has no counterpart. Target: 'a' 'b' '▁the' | 'b' '▁a'.
  assert cov == {'draft': 0.75, 'target': 1.0}


def test_a_broken_table_is_detected():
  """The byte normalization is what makes the tables right: without it nothing matches."""
  raw = dataclasses.replace(DRAFT, kind='sentencepiece')  # 'Ġ' read as a literal character
  m = vocab_map.build_vocab_map(raw, TARGET)
  assert m.draft_to_target[3] == -1 and m.draft_to_target[4] == -1  # 'Ġa', 'Ġthe' lost
  with pytest.raises(ValueError, match='unknown tokenizer kind'):
    vocab_map.build_vocab_map(dataclasses.replace(DRAFT, kind='wordpiece'), TARGET)


def test_smollm2_gemma3_intersection():
  """Real tokenizers: every mapped pair decodes to the same text on both sides."""
  try:
    smol = load_tokenizer(gguf_loader.default_model_path())
    gemma = load_tokenizer(gguf_loader.gemma3_270m_path())
  except FileNotFoundError as e:
    pytest.skip(f'real tokenizers unavailable: {e}')
  m = vocab_map.build_vocab_map(smol, gemma)
  assert 20000 < m.size < smol.vocab_size
  pairs = np.flatnonzero(m.draft_to_target >= 0)
  rng = np.random.default_rng(0)
  for d in rng.choice(pairs, 500, replace=False):
    t = int(m.draft_to_target[d])
    assert m.target_to_draft[t] == d
    a, b = smol.decode([int(d)]), gemma.decode([t])
    assert a == b or '\ufffd' in a, (d, t, a, b)
