"""Gather tables between two vocabularies: the tokens both spell with the same bytes.

Token-level intersection ("TLI", Timor et al. 2025, arXiv 2502.05202, section 3.2): a draft with
another tokenizer proposes only tokens that the target's vocabulary has with the identical
string; its distribution is restricted to them and renormalized, and mapped into the target's ids
(zero elsewhere), so speculative sampling against the target stays exact. This module builds the
two host-side tables; the on-device wrapper lives in `jaxspec/`.

Strings are compared as raw bytes:
- byte-level BPE (GPT-2 / SmolLM2): every character is one byte in GPT-2's byte-to-unicode
  alphabet (`Ġ` = space, `Ċ` = newline), mapped back to that byte.
- SentencePiece (Gemma): `▁` is a space, `<0xNN>` byte-fallback tokens are the byte 0xNN, other
  tokens are their UTF-8 text.
Control tokens (`special_ids`: `<bos>`, `<|im_end|>`, `<unused0>`, ...) are not mapped by
default: equal spelling does not mean equal meaning across models, and a target's end-of-turn
has its own spelling. `map_special=True` maps control tokens whose strings are identical on both
sides (both control). Several tokens of one vocabulary can spell the same bytes (Gemma has both
`▁▁` and a two-space token); the tables are then one-to-one on one canonical id per byte string:
the id that the tokenizer itself produces for those bytes when there is one, else the lowest.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Protocol, Sequence

import numpy as np

_BYTE_TOKEN = re.compile(r'^<0x([0-9A-Fa-f]{2})>$')


class TokenizerLike(Protocol):
  """What the tables need: `models.tokenizer.Tokenizer` has it."""

  kind: str  # 'byte_level' or 'sentencepiece'
  tokens: Sequence[str]  # token string of each id, as the vocabulary spells it
  special_ids: frozenset[int]

  def encode(self, text: str) -> list[int]:
    ...


def _gpt2_byte_decoder() -> dict[str, int]:
  """Inverse of GPT-2's `bytes_to_unicode` (openai/gpt-2 `src/encoder.py`)."""
  printable = (list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1))
               + list(range(ord('®'), ord('ÿ') + 1)))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


_BYTE_DECODER = _gpt2_byte_decoder()


def token_bytes(tokenizer: TokenizerLike) -> list[bytes | None]:
  """The raw bytes each id stands for; None for control tokens and unspellable strings.

  Raises ValueError for an unknown `tokenizer.kind`.
  """
  out: list[bytes | None] = []
  for i, token in enumerate(tokenizer.tokens):
    if i in tokenizer.special_ids:
      out.append(None)
    elif tokenizer.kind == 'byte_level':
      try:
        out.append(bytes(_BYTE_DECODER[ch] for ch in token))
      except KeyError:  # a character outside the byte alphabet: an added token, not bytes
        out.append(token.encode('utf-8'))
    elif tokenizer.kind == 'sentencepiece':
      match = _BYTE_TOKEN.match(token)
      out.append(bytes([int(match.group(1), 16)]) if match else
                 token.replace('\u2581', ' ').encode('utf-8'))
    else:
      raise ValueError(f'unknown tokenizer kind {tokenizer.kind!r}; expected byte_level or '
                       'sentencepiece')
  return out


def _canonical(tokenizer: TokenizerLike, spelled: list[bytes | None]) -> dict[bytes, int]:
  """Byte string -> one id: the tokenizer's own encoding of it when that is one token, else the
  lowest id spelling it."""
  groups: dict[bytes, list[int]] = {}
  for i, b in enumerate(spelled):
    if b:
      groups.setdefault(b, []).append(i)
  canonical = {}
  for b, ids in groups.items():
    choice = ids[0]
    if len(ids) > 1:
      try:
        encoded = tokenizer.encode(b.decode('utf-8'))
      except UnicodeDecodeError:
        encoded = []
      if len(encoded) == 1 and encoded[0] in ids:
        choice = encoded[0]
    canonical[b] = choice
  return canonical


@dataclasses.dataclass(frozen=True, eq=False)
class VocabMap:
  """Gather tables between a draft and a target vocabulary (numpy int32, -1 = no counterpart).

  Attributes:
    draft_to_target: [V_draft] target id of the draft token with the same bytes, or -1.
    target_to_draft: [V_target] the inverse (the same pairs), or -1.
  The pairs are one-to-one: `target_to_draft[draft_to_target[d]] == d` wherever mapped.
  """

  draft_to_target: np.ndarray
  target_to_draft: np.ndarray

  @property
  def size(self) -> int:
    """Number of token pairs in the intersection."""
    return int((self.draft_to_target >= 0).sum())

  def vocab_coverage(self) -> dict[str, float]:
    """Fraction of each vocabulary that is in the intersection."""
    return {'draft': self.size / len(self.draft_to_target),
            'target': self.size / len(self.target_to_draft)}

  def text_coverage(self, draft: TokenizerLike, target: TokenizerLike,
                    texts: Iterable[str]) -> dict[str, float]:
    """Fraction of the tokens of `texts`, as each side tokenizes them, that the other side has
    (so could propose or accept token for token)."""
    texts = list(texts)
    draft_ids = np.asarray([i for t in texts for i in draft.encode(t)], np.int64)
    target_ids = np.asarray([i for t in texts for i in target.encode(t)], np.int64)
    return {'draft': float((self.draft_to_target[draft_ids] >= 0).mean()),
            'target': float((self.target_to_draft[target_ids] >= 0).mean())}


def build_vocab_map(draft: TokenizerLike, target: TokenizerLike, *,
                    map_special: bool = False) -> VocabMap:
  """The token-level intersection tables of `draft` and `target` (see the module docstring).

  Args:
    draft, target: tokenizers with `kind`, `tokens`, `special_ids` and `encode`.
    map_special: also pair control tokens whose strings are identical (both control).
  Returns:
    A VocabMap with `draft_to_target` int32 [len(draft.tokens)] and `target_to_draft` int32
    [len(target.tokens)].
  Raises:
    ValueError: an unknown tokenizer kind.
  """
  draft_bytes, target_bytes = token_bytes(draft), token_bytes(target)
  draft_canon, target_canon = _canonical(draft, draft_bytes), _canonical(target, target_bytes)
  d2t = np.full(len(draft.tokens), -1, np.int32)
  t2d = np.full(len(target.tokens), -1, np.int32)
  for b, d in draft_canon.items():
    t = target_canon.get(b)
    if t is not None:
      d2t[d], t2d[t] = t, d
  if map_special:
    target_special = {target.tokens[i]: i for i in sorted(target.special_ids, reverse=True)}
    for d in sorted(draft.special_ids):
      t = target_special.get(draft.tokens[d])
      if t is not None and t2d[t] < 0:
        d2t[d], t2d[t] = t, d
  return VocabMap(draft_to_target=d2t, target_to_draft=t2d)
