"""De-duplication of made-up prompts, and the check that keeps evaluation prompts out.

`Deduper` keeps the first of any group of prompts that are the same after `normalize` (exact)
or whose word 3-gram sets have Jaccard similarity >= `threshold` (near; default 0.5: "Write a
poem about the ocean." and "Write a poem about the sea." share 3 of 5 3-grams, 0.6). Candidates
come from MinHash signatures in LSH bands (Broder 1997; Leskovec, Rajaraman, Ullman, *Mining of
Massive Datasets* ch. 3): 42 bands of 3 rows find a pair at Jaccard 0.5 with probability 0.996;
every candidate is then compared exactly, so nothing under the threshold is ever dropped.

`DevOverlap` says whether a prompt is, or is close to, an evaluation prompt
(`data/dev_prompts.jsonl`), by any of (all on `text_filters.words`):
- the same text (lowercased, spacing collapsed, any script);
- a shared word 8-gram (a copied passage or a long instruction);
- word 3-gram Jaccard >= 0.5, or >= 0.8 of the dev prompt's 3-grams inside the prompt (a dev
  prompt with small edits, or with something added);
- content-word Jaccard >= 0.5 (words less `text_filters.STOPWORDS`: "What's the capital of
  France?" against "What is the capital of France?", "Give me five tips for sleeping better at
  night." against "Give me four tips for sleeping better.").
It errs towards rejecting: a few lost training prompts cost nothing, a leaked evaluation prompt
makes every held-out figure optimistic.
"""

from __future__ import annotations

import zlib

import numpy as np

from models import text_filters as tf

_PRIME = np.uint64(4294967311)  # the first prime above 2**32


class MinHasher:
  """MinHash signatures of word 3-gram sets: `num_perm` hashes (a x + b) mod p of each shingle's
  CRC-32, minimum over the set (fixed seed: the same text always gets the same signature)."""

  def __init__(self, num_perm: int = 126, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.a = rng.integers(1, 2**31, num_perm, dtype=np.uint64)
    self.b = rng.integers(0, 2**32, num_perm, dtype=np.uint64)

  def signature(self, shingles: set) -> np.ndarray:
    """`[num_perm]` uint64 (all-max for the empty set)."""
    if not shingles:
      return np.full(self.a.shape, np.iinfo(np.uint64).max, np.uint64)
    x = np.array(sorted(zlib.crc32(' '.join(s).encode()) for s in shingles), np.uint64)
    return ((x[:, None] * self.a[None] + self.b[None]) % _PRIME).min(axis=0)


class Deduper:
  """Accepts texts one at a time, dropping exact and near duplicates of those already accepted.

  `add(text)` returns None when the text is new (and remembers it), else 'exact' or 'near'.
  """

  def __init__(self, threshold: float = 0.5, bands: int = 42, rows: int = 3, n: int = 3):
    self.threshold, self.bands, self.rows, self.n = threshold, bands, rows, n
    self.hasher = MinHasher(bands * rows)
    self.exact: set[str] = set()
    self.shingles: list[set] = []
    self.buckets: dict[tuple, list[int]] = {}

  def __len__(self) -> int:
    return len(self.shingles)

  def add(self, text: str) -> str | None:
    key = tf.normalize(text)
    if key in self.exact:
      return 'exact'
    shingles = tf.ngrams(key.split(), self.n)
    sig = self.hasher.signature(shingles).reshape(self.bands, self.rows)
    keys = [(i, *band.tolist()) for i, band in enumerate(sig)]
    seen = set()
    for k in keys:
      for j in self.buckets.get(k, ()):
        if j not in seen:
          seen.add(j)
          if tf.jaccard(shingles, self.shingles[j]) >= self.threshold:
            return 'near'
    self.exact.add(key)
    for k in keys:
      self.buckets.setdefault(k, []).append(len(self.shingles))
    self.shingles.append(shingles)
    return None


class DevOverlap:
  """The evaluation-overlap test of the module docstring, against `dev_texts`."""

  def __init__(self, dev_texts: list[str], long_n: int = 8, jaccard3: float = 0.5,
               contained3: float = 0.8, content_jaccard: float = 0.5):
    self.long_n, self.jaccard3 = long_n, jaccard3
    self.contained3, self.content_jaccard = contained3, content_jaccard
    self.exact = {_spaced(t) for t in dev_texts}
    self.dev = [self._features(t) for t in dev_texts]
    self.long = set().union(*(d[0] for d in self.dev)) if self.dev else set()

  def _features(self, text):
    w = tf.words(text)
    long = tf.ngrams(w, self.long_n) if len(w) >= self.long_n else set()
    return long, tf.ngrams(w, 3), {t for t in w if t not in tf.STOPWORDS}

  def reason(self, text: str) -> str | None:
    """Why `text` counts as an evaluation prompt ('exact', '8-gram', '3-gram', 'contains',
    'content'), or None."""
    if _spaced(text) in self.exact:
      return 'exact'
    long, tri, content = self._features(text)
    if long & self.long:
      return f'{self.long_n}-gram'
    for _, dev_tri, dev_content in self.dev:
      if dev_tri and tf.jaccard(tri, dev_tri) >= self.jaccard3:
        return '3-gram'
      if dev_tri and len(tri & dev_tri) >= self.contained3 * len(dev_tri):
        return 'contains'
      if content and dev_content and tf.jaccard(content, dev_content) >= self.content_jaccard:
        return 'content'
    return None


def _spaced(text: str) -> str:
  return ' '.join(text.lower().split())
