"""Grounded prompts: a task (summarize, rewrite, answer from, continue, translate, ...) over a
passage of real text found on the machine (`models.local_text`).

Documents are cut into passages of `min_words`..`max_words` words (`passages_of`: whole
paragraphs packed in order, a long paragraph by sentences, never across a section), filtered
as prose (`PASSAGE_RULE`, `models.text_filters`) and de-duplicated (`models.dedupe.Deduper`:
licence texts repeat across packages). `collect` takes passages from the sources in turn, at
most `per_document` from any one file, so that no source and no document dominates; every
passage is used by one prompt only. `make_prompts` puts each under one of `TEMPLATES`, chosen
with the seed. Everything is deterministic given the seed and the files present.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from models import dedupe, local_text, text_filters as tf

# 20-100 words: the evaluation set's grounded prompts have 23-75 (and a long passage makes the
# target's answer several times dearer to generate: prefill and attention over it).
PASSAGE_RULE = tf.LanguageRule(min_words=20, max_words=100, min_chars=100, max_chars=800,
                               min_ascii_letters=0.99, min_stopwords=0.2, min_alpha=0.78)

_SENTENCE_END = re.compile(r'(?<=[.!?])\s+(?=[A-Z(])')


_BULLET = re.compile(r'^\s*([-*+\u2022]|\d+[.)])\s+')


def paragraphs(section: str) -> list[str]:
  """The paragraphs of a section (split at blank lines), lines joined by single spaces except
  list items, which keep their own line. A paragraph ending in ':' is left out: what it
  introduced (code, a table) is usually what the markup stripping removed."""
  out = []
  for p in re.split(r'\n\s*\n', section):
    lines = [' '.join(line.split()) for line in p.splitlines() if line.strip()]
    text = ''
    for line in lines:
      text += ('\n' if text and _BULLET.match(line) else ' ' if text else '') + line
    if text and not text.endswith(':'):
      out.append(text)
  return out


def passages_of(section: str, min_words: int = 20, max_words: int = 100) -> Iterator[str]:
  """Passages of `min_words`..`max_words` words: consecutive paragraphs packed while they fit
  (joined by a blank line), a paragraph longer than `max_words` by its sentences; never across
  a block that markup stripping removed (`local_text.CUT`)."""
  for block in section.split(local_text.CUT):
    yield from _packed(block, min_words, max_words)


def _packed(block, min_words, max_words):
  pieces = []
  for p in paragraphs(block):
    if len(p.split()) <= max_words:
      pieces.append((p, '\n\n'))
    else:
      pieces += [(s, ' ') for s in _SENTENCE_END.split(p)]
  current, count = [], 0
  for text, sep in pieces:
    n = len(text.split())
    if current and count + n > max_words:
      if count >= min_words:
        yield ''.join(current).strip()
      current, count = [], 0
    if n <= max_words:
      current += [text, sep]
      count += n
  if count >= min_words:
    yield ''.join(current).strip()


# Passages a document may give: a module's docstrings and a package's description are longer
# and more varied than a manual page.
PER_DOCUMENT = {'python-docstrings': 6, 'package-descriptions': 4}


def collect(num: int, seed: int, sources=None, per_document: int = 2,
            exclude: dedupe.DevOverlap | None = None) -> list[dict]:
  """`num` passages (fewer when the machine has no more), taken from the sources in turn:
  dicts with `passage`, `source` and `document`; at most `per_document` from one document
  (`PER_DOCUMENT` for some sources). A passage that fails `PASSAGE_RULE`, repeats an earlier
  one (`Deduper`) or overlaps an evaluation prompt (`exclude`) is skipped."""
  names = list(sources or local_text.SOURCES)
  streams = {n: _passages(local_text.documents(n, seed), PER_DOCUMENT.get(n, per_document))
             for n in names}
  seen, out = dedupe.Deduper(), []
  while streams and len(out) < num:
    for name in list(streams):
      for passage, doc in streams[name]:
        if seen.add(passage) is None and not (exclude and exclude.reason(passage)):
          out.append({'passage': passage, 'source': name, 'document': doc})
          break
      else:
        del streams[name]  # exhausted
      if len(out) == num:
        break
  return out


def _passages(docs, per_document):
  for doc in docs:
    taken = 0
    for section in doc.sections:
      for p in passages_of(section, PASSAGE_RULE.min_words, PASSAGE_RULE.max_words):
        if taken < per_document and tf.acceptable(p, PASSAGE_RULE):
          taken += 1
          yield p, doc.name


LANGUAGES = ('French', 'Spanish', 'German', 'Italian', 'Portuguese', 'Dutch')

# (task, instruction); {lang}, {n} and {topic} are filled in per prompt.
TEMPLATES = (
    ('summarize', 'Summarize the passage below in {n}.'),
    ('summarize', 'Give a one-paragraph summary of this text.'),
    ('summarize', 'What are the key points of the following? Keep it short.'),
    ('summarize', 'Write a TL;DR of this for a busy reader.'),
    ('summarize', 'Condense the following text to about a third of its length.'),
    ('rewrite', 'Rewrite this passage so that a twelve-year-old could follow it.'),
    ('rewrite', 'Rephrase the text below in a more formal tone.'),
    ('rewrite', 'Make this text friendlier and more conversational without losing any facts.'),
    ('rewrite', 'Turn the following into a list of bullet points.'),
    ('rewrite', 'Edit this passage for clarity and concision.'),
    ('rewrite', 'Rewrite the following as a short email to a colleague.'),
    ('answer', 'Based only on the text below, what does it say about {topic}?'),
    ('answer', 'Read the passage and answer: what is its main purpose?'),
    ('answer', 'Who is the intended reader of this text, and how can you tell?'),
    ('answer', 'Using the passage, explain what "{topic}" refers to here.'),
    ('answer', 'Write three questions that this passage answers, each with its answer.'),
    ('answer', 'Is there anything in the following text that a newcomer might misread? '
               'Explain.'),
    ('answer', 'What would someone be allowed or expected to do according to this text?'),
    ('continue', 'Continue this text with a few more sentences in the same style.'),
    ('continue', 'Write the paragraph that could come right after this one.'),
    ('continue', 'Here is the start of a document. Carry on writing it.'),
    ('translate', 'Translate the following passage into {lang}.'),
    ('translate', 'Please render this text in {lang}, keeping technical terms as they are.'),
    ('translate', 'How would you say this in {lang}?'),
    ('explain', 'Explain this passage in plain language.'),
    ('explain', 'What does this mean? Walk me through it step by step.'),
    ('explain', 'I found this text and do not understand it. Can you explain it to me?'),
    ('extract', 'List the important terms in this text and define each in a few words.'),
    ('extract', 'Suggest a short, descriptive title for the following text.'),
    ('extract', 'Pull out every name, command or technical term mentioned below.'),
)

_FRAMES = ('{instruction}\n\n{passage}', '{instruction}\n\nText:\n{passage}',
           '{instruction}\n\n"""\n{passage}\n"""', '{passage}\n\n{instruction}',
           '{instruction}\n\n---\n{passage}\n---',
           'Here is a passage:\n\n{passage}\n\n{instruction}')
_LENGTHS = ('one sentence', 'two sentences', 'three sentences')


def topic_word(passage: str) -> str:
  """The passage's most frequent word of 5+ letters that is not a function word (first seen
  wins a tie): a subject for question templates."""
  counts = {}
  for w in tf.words(passage):
    if len(w) >= 5 and w.isalpha() and w not in tf.STOPWORDS:
      counts[w] = counts.get(w, 0) + 1
  return max(counts, key=counts.get) if counts else 'this'


def make_prompts(passages: list[dict], seed: int) -> list[dict]:
  """One prompt a passage: rows with `prompt`, `kind` 'grounded', `task`, `source`, `document`."""
  rng = np.random.default_rng([seed, 7])
  rows = []
  for p in passages:
    task, instruction = TEMPLATES[rng.integers(len(TEMPLATES))]
    instruction = instruction.format(lang=LANGUAGES[rng.integers(len(LANGUAGES))],
                                     n=_LENGTHS[rng.integers(3)], topic=topic_word(p['passage']))
    frame = _FRAMES[rng.integers(len(_FRAMES))]
    rows.append({'prompt': frame.format(instruction=instruction, passage=p['passage']),
                 'kind': 'grounded', 'task': task, 'source': p['source'],
                 'document': p['document']})
  return rows
