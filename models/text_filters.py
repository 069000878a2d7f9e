"""Cheap text checks for made-up training prompts: words, n-grams, length, language, repetition.

Everything here works on plain strings; nothing needs a model. The language check is a
heuristic meant to drop garbage, other scripts and degenerate repetition from the target's own
writing (Magpie) and from files found on the machine, not to identify languages:

- `ascii_letter_fraction`: of the text's letters (`str.isalpha`), the share that are ASCII
  a-z/A-Z; English prose is ~1.0, French ~0.97, Korean 0.
- `stopword_fraction`: the share of words that are among the ~120 most common English function
  words (`STOPWORDS`); English prose is 0.3-0.6, a list of identifiers or another language ~0.
- `distinct_ngram_fraction`: distinct word 3-grams / all word 3-grams; a text that loops on a
  phrase falls far below 1.

`looks_english` combines them with the thresholds of `LanguageRule`.
"""

from __future__ import annotations

import dataclasses
import re

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over
own same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom
why will with would you your yours yourself yourselves
""".split())


def words(text: str) -> list[str]:
  """Lowercased word tokens: runs of ASCII letters and digits (with an apostrophe suffix, as in
  "don't"); punctuation and other scripts are dropped."""
  return _WORD.findall(text.lower())


def normalize(text: str) -> str:
  """The key exact de-duplication compares: the words, space-joined (case, punctuation and
  spacing ignored)."""
  return ' '.join(words(text))


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
  """The set of n-grams of `tokens`; a sequence shorter than n gives itself as one n-gram (so a
  short text still has a fingerprint), the empty sequence nothing."""
  if len(tokens) < n:
    return {tuple(tokens)} if tokens else set()
  return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def jaccard(a: set, b: set) -> float:
  """|a & b| / |a | b| (0 for two empty sets)."""
  return len(a & b) / len(a | b) if a or b else 0.0


def ascii_letter_fraction(text: str) -> float:
  """Of the letters of `text`, the share that are ASCII (1.0 when it has none)."""
  letters = [c for c in text if c.isalpha()]
  return sum(c.isascii() for c in letters) / len(letters) if letters else 1.0


def alpha_fraction(text: str) -> float:
  """Of the non-space characters, the share that are letters (prose ~0.8, code and tables less)."""
  chars = [c for c in text if not c.isspace()]
  return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


def stopword_fraction(tokens: list[str]) -> float:
  """The share of `tokens` (from `words`) that are English function words."""
  return sum(t in STOPWORDS for t in tokens) / len(tokens) if tokens else 0.0


def distinct_ngram_fraction(tokens: list[str], n: int = 3) -> float:
  """Distinct n-grams / n-grams (1.0 for texts with fewer than n + 1 words)."""
  total = len(tokens) - n + 1
  return len(ngrams(tokens, n)) / total if total > 1 else 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LanguageRule:
  """Thresholds of `looks_english` and `length_ok`.

  Attributes:
    min_words, max_words, min_chars, max_chars: length bounds (words as `words` counts them).
    min_ascii_letters: least `ascii_letter_fraction`.
    min_stopwords: least `stopword_fraction`, checked from `stopword_min_words` words on (short
      requests such as "Explain photosynthesis." have none).
    min_distinct_trigrams: least `distinct_ngram_fraction` (word 3-grams), from 12 words on.
    min_alpha: least `alpha_fraction` (0 = unchecked; passages use it to drop code and tables).
    max_word_share: most any one word may make of the words, from 12 words on.
  """

  min_words: int = 2
  max_words: int = 400
  min_chars: int = 12
  max_chars: int = 3000
  min_ascii_letters: float = 0.95
  min_stopwords: float = 0.12
  stopword_min_words: int = 8
  min_distinct_trigrams: float = 0.7
  min_alpha: float = 0.0
  max_word_share: float = 0.25


def length_ok(text: str, rule: LanguageRule = LanguageRule()) -> bool:
  """Whether the text's word and character counts lie in the rule's bounds."""
  n = len(words(text))
  return rule.min_words <= n <= rule.max_words and rule.min_chars <= len(text) <= rule.max_chars


def looks_english(text: str, rule: LanguageRule = LanguageRule()) -> bool:
  """Whether `text` passes the heuristic of the module docstring: mostly ASCII letters, enough
  English function words, no phrase loops, no single word dominating (and, with `min_alpha`,
  mostly letters)."""
  tokens = words(text)
  if ascii_letter_fraction(text) < rule.min_ascii_letters:
    return False
  if len(tokens) >= rule.stopword_min_words and stopword_fraction(tokens) < rule.min_stopwords:
    return False
  if rule.min_alpha and alpha_fraction(text) < rule.min_alpha:
    return False
  if len(tokens) >= 12:
    if distinct_ngram_fraction(tokens) < rule.min_distinct_trigrams:
      return False
    top = max(tokens.count(t) for t in set(tokens))
    if top / len(tokens) > rule.max_word_share:
      return False
  return True


def acceptable(text: str, rule: LanguageRule = LanguageRule()) -> bool:
  """`length_ok` and `looks_english`."""
  return length_ok(text, rule) and looks_english(text, rule)
