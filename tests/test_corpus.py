"""The draft-training corpus: filters, de-duplication, the evaluation-overlap test, grounded
passages, shards and resuming (toy models and a word-level fake tokenizer; no real model)."""

import gzip
import os
import threading

import jax
import numpy as np
import pytest

from models import (corpus, dedupe, draft_corpus, grounded, local_text, magpie,
                    prompts as prompt_files, text_filters as tf)
from tests import toys

DEV = [r['prompt'] for r in prompt_files.read_rows(prompt_files.DEV_PROMPTS)]


class WordTokenizer:
  """Whitespace words over a fixed vocabulary (unknown words -> '?'); ChatML-like template."""

  WORDS = ('<end>', '<user>', 'what', 'is', 'the', 'name', 'of', 'a', 'cat', '<assistant>',
           '<system>', '?')
  eos_id = chat_eos_id = pad_id = 0
  special_ids = frozenset({0, 1, 9, 10})

  def apply_chat_template(self, messages, add_generation_prompt=True):
    text = ''.join(f"<{m['role']}> {m['content']} <end> " for m in messages)
    return text + ('<assistant> ' if add_generation_prompt else '')

  def encode(self, text):
    return [self.WORDS.index(w) if w in self.WORDS else 11 for w in text.split()]

  def decode(self, ids, skip_special_tokens=False):
    return ' '.join(self.WORDS[int(i)] for i in ids)

  def encode_chat(self, text):
    return self.encode(self.apply_chat_template([{'role': 'user', 'content': text}]))


def chain_table(chain, vocab_size=12, scale=30.0):
  """Logits that follow `chain` (token -> next token) almost surely, at either parity."""
  table = np.zeros((2, vocab_size, vocab_size), np.float32)
  for a, b in chain:
    table[:, a, b] = scale
  return {'table': jax.numpy.asarray(table)}


# Filters.

def test_language_filter_keeps_english_drops_other_scripts_and_loops():
  assert tf.acceptable('Can you help me plan a birthday party for my daughter?')
  assert tf.acceptable('Explain photosynthesis.')
  assert not tf.looks_english('한국의 수도는 어디인가요? 그리고 인구는 얼마인가요?')
  assert not tf.looks_english('the cat sat on the mat ' * 6)  # a phrase loop
  assert not tf.looks_english('foo_bar baz_qux spam eggs quux corge grault garply waldo fred')
  assert not tf.length_ok('Hi')
  assert not tf.length_ok('word ' * 500)


def test_normalize_and_ngrams():
  assert tf.normalize('Hello,   WORLD!') == tf.normalize('hello world')
  assert tf.ngrams(['a', 'b'], 3) == {('a', 'b')}
  assert tf.ngrams(['a', 'b', 'c', 'd'], 3) == {('a', 'b', 'c'), ('b', 'c', 'd')}


# De-duplication.

def test_deduper_drops_exact_and_near_duplicates_only():
  d = dedupe.Deduper()
  base = 'Write a short poem about the ocean at sunrise for my grandmother'
  assert d.add(base) is None
  assert d.add('write a short poem about the OCEAN at sunrise, for my grandmother!') == 'exact'
  assert d.add(base.replace('grandmother', 'grandfather')) == 'near'  # J = 8/10
  assert d.add('Explain how vaccines train the immune system') is None
  assert d.add('What are good books for learning Spanish?') is None
  assert len(d) == 3


def test_deduper_keeps_pairs_below_the_threshold():
  a = 'one two three four five six seven eight nine ten'.split()
  b = a[:5] + 'eleven twelve thirteen fourteen fifteen'.split()  # 3-grams: J = 3/13
  d = dedupe.Deduper()
  assert d.add(' '.join(a)) is None and d.add(' '.join(b)) is None


def test_minhash_is_deterministic():
  s = tf.ngrams(tf.words('the quick brown fox jumps over the lazy dog'), 3)
  assert np.array_equal(dedupe.MinHasher().signature(s), dedupe.MinHasher().signature(s))


# The evaluation prompts stay out.

def test_every_dev_prompt_and_edited_copies_are_rejected():
  check = dedupe.DevOverlap(DEV)
  assert all(check.reason(t) for t in DEV)
  grounded_dev = next(t for t in DEV if t.startswith('Summarize this text'))
  edited = grounded_dev.replace('Summarize this text in two sentences',
                                'Please sum up the passage below briefly')
  edited = edited.replace('waggle dance', 'waggle-dance').replace('closely', 'carefully')
  assert check.reason(edited) == '8-gram'
  assert check.reason("What's the capital of France?")
  assert check.reason('Why is the ocean so salty?')
  assert check.reason('Give me five tips for sleeping better at night.')
  assert check.reason('Explain in three sentences why leaves change colour in the autumn.')


def test_unrelated_prompts_pass_the_dev_check():
  check = dedupe.DevOverlap(DEV)
  for text in ('How do I repot a cactus without hurting my hands?',
               'Write a limerick about a forgetful wizard.',
               'What is the boiling point of water at high altitude?'):
    assert check.reason(text) is None, text


# Grounded passages.

def test_passages_respect_bounds_and_cuts():
  para = ' '.join(f'Sentence number {i} is here and it is short.' for i in range(60))
  section = para + '\n\nAnother paragraph with a few words.\n' + local_text.CUT + '\nNext block.'
  out = list(grounded.passages_of(section, min_words=40, max_words=100))
  assert out and all(40 <= len(p.split()) <= 100 for p in out)
  assert not any('Next block' in p for p in out)


def test_markup_and_troff_are_stripped():
  md = 'Intro **bold** [link](http://x) text.\n\n```\ncode()\n```\n\nAfter.'
  text = local_text.markup_to_text(md)
  assert 'bold link text' in text and 'code()' not in text and local_text.CUT in text
  man = '.TH LS 1\n.SH NAME\nls \\- list \\fBdirectory\\fR contents\n.PP\n.B ls\nlists.'
  text = local_text.troff_to_text(man)
  assert 'ls - list directory contents' in text and 'TH' not in text and '\\f' not in text


def _prose(rng, num_words):
  vocab = ('river', 'garden', 'engine', 'window', 'letter', 'market', 'planet', 'teacher',
           'music', 'winter', 'bridge', 'forest', 'number', 'village', 'doctor', 'paper',
           'carries', 'builds', 'opens', 'follows', 'changes', 'finds', 'holds', 'turns')
  out = []
  while len(out) < num_words:
    n = int(rng.integers(8, 14))
    sentence = [str(w) for w in rng.choice(vocab, n)]
    sentence[1::2] = [str(w) for w in rng.choice(sorted(tf.STOPWORDS), len(sentence[1::2]))]
    out += [sentence[0].capitalize()] + sentence[1:-1] + [sentence[-1] + '.']
  return ' '.join(out)


def test_collect_uses_each_passage_once_and_skips_dev_text(monkeypatch):
  rng = np.random.default_rng(0)
  docs = [local_text.Document('fake', f'doc{i}', tuple(_prose(rng, 80) for _ in range(3)))
          for i in range(4)]
  docs.append(local_text.Document('fake', 'copy', docs[0].sections))
  dev_passage = next(t for t in DEV if 'municipal council' in t).split('\n\n', 1)[1]
  docs.append(local_text.Document('fake', 'dev', (dev_passage + ' ' + _prose(rng, 30),)))
  monkeypatch.setitem(local_text.SOURCES, 'fake', lambda rng: iter(docs))
  out = grounded.collect(100, seed=0, sources=['fake'], exclude=dedupe.DevOverlap(DEV))
  assert len({p['passage'] for p in out}) == len(out) == 8  # 2 a document, no copies
  assert {p['document'] for p in out} == {f'doc{i}' for i in range(4)}
  rows = grounded.make_prompts(out, seed=0)
  assert rows == grounded.make_prompts(out, seed=0)
  assert all(p['passage'] in r['prompt'] for p, r in zip(out, rows))


# Shards.

def test_shard_round_trip(tmp_path):
  seqs = [[1, 2, 3, 4], [65535, 7], [9, 9, 9]]
  corpus.write_shard(corpus.shard_path(tmp_path, 0), seqs[:2], [2, 1], flag=[True, False])
  corpus.write_shard(corpus.shard_path(tmp_path, 1), seqs[2:], [1], flag=[True])
  shard = corpus.read_shard(corpus.shard_path(tmp_path, 0))
  assert shard['tokens'].dtype == np.uint16 and shard['offsets'].tolist() == [0, 4, 6]
  data = corpus.load(tmp_path)
  assert data['offsets'].tolist() == [0, 4, 6, 9] and data['flag'].tolist() == [True, False, True]
  assert [s.tolist() for s in corpus.sequences(tmp_path)] == seqs
  assert [(p.tolist(), a.tolist()) for p, a in corpus.pairs(tmp_path)] == [
      ([1, 2], [3, 4]), ([65535], [7]), ([9], [9, 9])]
  with pytest.raises(ValueError, match='uint16'):
    corpus.write_shard(corpus.shard_path(tmp_path, 2), [[70000]], [1])
  assert corpus.missing_shards(tmp_path, 3) == [2]


# The stages resume.

def _answers(params, out, spec):
  draft_corpus.make_answers(params, toys.TableModel(), WordTokenizer(), spec, str(out),
                            batch_size=4, bucket=16)


def test_answers_resume_and_refuse_other_settings(tmp_path):
  texts = ['what is the name of a cat', 'what is a cat', 'the cat', 'a name of the cat',
           'what is what', 'name the cat', 'cat cat', 'of a cat', 'is it a cat', 'the name']
  rows = [{'id': i, 'prompt': t, 'kind': draft_corpus.KINDS[i % 2]} for i, t in enumerate(texts)]
  os.makedirs(tmp_path, exist_ok=True)
  draft_corpus.write_prompts(draft_corpus.prompts_path(tmp_path), rows)
  params = toys.random_table(jax.random.key(0), 12)
  spec = draft_corpus.AnswerSpec(shard_size=4, max_new_tokens=5, sampled_fraction=0.5)
  _answers(params, tmp_path, spec)
  shards = os.path.join(tmp_path, 'answers')
  first = corpus.load(shards)
  assert first['prompt_id'].tolist() == list(range(10))
  sampled, _ = draft_corpus.answer_plan(10, spec)
  assert first['sampled'].tolist() == sampled.tolist() == [False] * 4 + [True] * 4 + [False] * 2
  assert first['temperature'].tolist() == sampled.astype(float).tolist()
  assert first['kind'].tolist() == [i % 2 for i in range(10)]
  kept = {i: os.stat(corpus.shard_path(shards, i)).st_mtime_ns for i in (0, 2)}
  os.remove(corpus.shard_path(shards, 1))
  _answers(params, tmp_path, spec)  # makes shard 1 again, and only it
  assert {i: os.stat(corpus.shard_path(shards, i)).st_mtime_ns for i in (0, 2)} == kept
  again = corpus.load(shards)
  assert all(np.array_equal(first[k], again[k]) for k in first)
  with pytest.raises(draft_corpus.SettingsMismatch, match='max_new_tokens'):
    _answers(params, tmp_path, draft_corpus.AnswerSpec(shard_size=4, max_new_tokens=6))


def test_answers_made_by_two_parts_equal_one_run(tmp_path, monkeypatch):
  monkeypatch.setattr(draft_corpus, 'POLL_SECONDS', 0.05)
  rows = [{'id': i, 'prompt': ' '.join(['cat'] * (1 + i % 4)), 'kind': 'magpie'}
          for i in range(10)]
  params = toys.random_table(jax.random.key(1), 12)
  spec = draft_corpus.AnswerSpec(shard_size=3, max_new_tokens=4)
  made = {}
  for name in ('alone', 'parts'):
    os.makedirs(tmp_path / name)
    draft_corpus.write_prompts(draft_corpus.prompts_path(tmp_path / name), rows)
  _answers(params, tmp_path / 'alone', spec)
  part1 = threading.Thread(target=draft_corpus.make_answers, args=(
      params, toys.TableModel(), WordTokenizer(), spec, str(tmp_path / 'parts'), 4, 16, None,
      draft_corpus.Part.parse('1/2')))
  part1.start()
  draft_corpus.make_answers(params, toys.TableModel(), WordTokenizer(), spec,
                            str(tmp_path / 'parts'), 4, 16, None, draft_corpus.Part(0, 2))
  part1.join()
  for name in ('alone', 'parts'):
    made[name] = corpus.load(os.path.join(tmp_path, name, 'answers'))
  assert all(np.array_equal(made['alone'][k], made['parts'][k]) for k in made['alone'])
  assert draft_corpus.Part(1, 2).owns(3) and not draft_corpus.Part(1, 2).owns(4)
  with pytest.raises(ValueError, match='W/N'):
    draft_corpus.Part.parse('1')
  with pytest.raises(ValueError, match='0 <= index < count'):
    draft_corpus.Part.parse('2/2')


def test_magpie_prefix_and_raw_shards_resume(tmp_path, monkeypatch):
  tok = WordTokenizer()
  assert magpie.user_turn_prefix(tok) == [1]
  assert magpie.user_turn_prefix(tok, 'be nice') == [10, 11, 11, 0, 1]
  chain = [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 11), (11, 0), (0, 0)]
  params = chain_table(chain)  # every row writes "what is the name of a cat ?"
  from models import batched_decode  # pylint: disable=g-import-not-at-top
  decoder = batched_decode.Decoder(params, toys.TableModel(), batch_size=8, bucket=8,
                                   eos_id=0, pad_id=0)
  spec = draft_corpus.PromptSpec(magpie_shard_size=8, magpie_max_new_tokens=12)
  keep = draft_corpus.PromptFilter(tok, 64, DEV)
  rows = draft_corpus.magpie_rows(decoder, tok, spec, str(tmp_path), keep, 1)
  assert rows[0]['prompt'] == 'what is the name of a cat ?'
  assert keep.reasons == {'kept': 1}
  monkeypatch.setattr(decoder, 'run', lambda *a, **k: pytest.fail('shard 0 made again'))
  keep = draft_corpus.PromptFilter(tok, 64, DEV)
  assert draft_corpus.magpie_rows(decoder, tok, spec, str(tmp_path), keep, 1) == rows


def test_prompts_file_is_byte_stable(tmp_path):
  rows = [{'id': 0, 'prompt': 'héllo', 'kind': 'magpie'}]
  a, b = tmp_path / 'a.jsonl.gz', tmp_path / 'b.jsonl.gz'
  draft_corpus.write_prompts(str(a), rows)
  draft_corpus.write_prompts(str(b), rows)
  assert a.read_bytes() == b.read_bytes()
  with gzip.open(a, 'rt', encoding='utf-8') as f:
    assert 'héllo' in f.read()
