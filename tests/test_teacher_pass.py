"""The teacher pass (`models.teacher_pass`): the target's top-k log-probs and features of each
sequence, batched by length, equal the target run on that sequence alone, and they land where
`models.draft_training.load_rows` and the EAGLE recipe read them."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import draft_training, teacher_pass
from models.llama import LlamaConfig, LlamaForward, init_params

CONFIG = LlamaConfig.tiny()
TARGET = LlamaForward(CONFIG)
PARAMS = init_params(CONFIG, jax.random.key(0))
RNG = np.random.default_rng(0)
SEQS = [RNG.integers(1, CONFIG.vocab_size, n).astype(np.int32) for n in (5, 30, 9, 17, 70, 3)]
PLENS = [2, 10, 4, 8, 20, 1]
K, T = 4, 32


@pytest.fixture(scope='module')
def result():
  return teacher_pass.teacher_pass(TARGET, PARAMS, SEQS, PLENS, top_k=K, batch_size=4, bucket=16,
                                   features_seq_len=T)


def test_matches_the_target_on_each_sequence_alone(result):
  off = result['offsets']
  for r, seq in enumerate(SEQS):
    toks = jnp.asarray(seq[None])
    logits, _, feats = TARGET.with_features(PARAMS, toks, TARGET.init_cache(1, len(seq)),
                                            jnp.zeros((1,), jnp.int32))
    logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits[0], -1), K)
    np.testing.assert_array_equal(result['tokens'][off[r]:off[r + 1]], seq)
    np.testing.assert_array_equal(result['teacher_ids'][off[r]:off[r + 1], 0], ids[:, 0])
    np.testing.assert_allclose(result['teacher_logp'][off[r]:off[r + 1]].astype(np.float32),
                               logp, rtol=1e-3, atol=1e-4)  # float16: 2^-11 relative
    crop = max(0, len(seq) - T)  # over-long rows keep their end, as load_rows does
    np.testing.assert_allclose(result['features'][r, :len(seq) - crop].astype(np.float32),
                               feats[0, crop:], atol=2e-2, rtol=2e-3)
    assert not result['features'][r, len(seq) - crop:].any()


def test_load_rows_and_features_line_up(result, tmp_path):
  path = str(tmp_path / 'shard_00000.npz')
  teacher_pass.write(path, result, seq_len=T, sampled=np.zeros(len(SEQS), bool))
  assert sorted(p.name for p in tmp_path.iterdir()) == ['shard_00000.npz',
                                                       'shard_00000_features_32.npy']
  identity = np.arange(CONFIG.vocab_size, dtype=np.int32)
  tokens, idx, prob, mask = draft_training.load_rows(path, T, identity)
  feats = np.load(teacher_pass.features_path(path, T))
  for r, seq in enumerate(SEQS):
    n = min(len(seq), T)
    np.testing.assert_array_equal(tokens[r, :n], seq[-n:])
    assert feats[r, :n].any(axis=-1).all()
    assert mask[r].sum() == n - 1 - max(PLENS[r] - 1 - (len(seq) - n), 0)
  np.testing.assert_allclose(prob.sum(-1)[mask > 0], 1.0, rtol=1e-5)


def test_rejects_bad_prompt_lengths():
  with pytest.raises(ValueError, match='prompt'):
    teacher_pass.teacher_pass(TARGET, PARAMS, SEQS[:2], [0, 3])


def test_for_corpus_parts_make_their_shards_and_keep_prompt_ids(tmp_path):
  from models import corpus, draft_corpus  # pylint: disable=g-import-not-at-top
  shards = tmp_path / 'corpus' / 'answers'
  for i in range(3):
    corpus.write_shard(corpus.shard_path(shards, i), SEQS[2 * i:2 * i + 2], PLENS[2 * i:2 * i + 2],
                       prompt_id=np.array([2 * i, 2 * i + 1], np.int32))
  out = tmp_path / 'teacher'
  run = lambda part: teacher_pass.for_corpus(TARGET, PARAMS, str(tmp_path / 'corpus'), str(out),
                                             seq_len=T, features=False, top_k=K, part=part)
  paths = run(draft_corpus.Part(1, 2))
  assert [os.path.exists(p) for p in paths] == [False, True, False]
  run(draft_corpus.Part(0, 2))
  assert all(os.path.exists(p) for p in paths)
  assert np.load(paths[2])['prompt_id'].tolist() == [4, 5]
  alone = teacher_pass.teacher_pass(TARGET, PARAMS, SEQS[2:4], PLENS[2:4], top_k=K)
  np.testing.assert_array_equal(np.load(paths[1])['teacher_ids'], alone['teacher_ids'])


def test_for_corpus_shards_take_a_slice(tmp_path):
  from models import corpus  # pylint: disable=g-import-not-at-top
  shards = tmp_path / 'corpus' / 'answers'
  for i in range(3):
    corpus.write_shard(corpus.shard_path(shards, i), SEQS[2 * i:2 * i + 2], PLENS[2 * i:2 * i + 2])
  out = tmp_path / 'teacher'
  run = lambda r: teacher_pass.for_corpus(TARGET, PARAMS, str(tmp_path / 'corpus'), str(out),
                                          seq_len=T, features=False, top_k=K, shards=r)
  paths = run(range(1, 3))
  assert [os.path.basename(p) for p in paths] == ['shard_00001.npz', 'shard_00002.npz']
  assert sorted(os.listdir(out)) == ['shard_00001.npz', 'shard_00002.npz']
  with pytest.raises(FileNotFoundError, match='none of the 3 shards'):
    run(range(5, 9))
