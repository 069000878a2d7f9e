"""Loop behaviour: EOS anywhere in a window, the token budget, reproducible keys, n-gram lookup,
metrics, and bad input rejected before any work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models.gguf_loader import load_gguf
from models.llama import LlamaConfig, LlamaForward, init_params
from models.tokenizer import load_tokenizer
from tests import toys

V = 50
TABLE = toys.random_table(jax.random.key(3), V, scale=3.0)
GREEDY = js.SamplingConfig(temperature=0)
PERFECT = js.ModelDraft(toys.TableModel())
PROMPT = [7, 11]
K = 4


def _run(config, draft=PERFECT, prompts=(PROMPT,), key=0):
  tokens, lengths = js.pad_prompts([list(p) for p in prompts], bucket=8)
  return js.generate(TABLE, TABLE, tokens, lengths, np.full(len(lengths), key),
                     target=toys.TableModel(),
                     draft=draft, config=config)


@pytest.fixture(scope='module')
def reference():
  out = _run(js.DecodeConfig(num_draft_tokens=0, max_new_tokens=12, sampling=GREEDY), draft=None)
  return out.new_tokens()[0]


def test_eos_at_every_position_of_a_window():
  """One batch, one compile: row j's greedy chain reaches the EOS as its j-th new token, for j
  over every position of the first two windows (a cycle table: t -> t + 1 mod V, EOS = 0)."""
  cycle = {'table': 10.0 * jax.nn.one_hot((jnp.arange(V) + 1) % V, V)[None].repeat(2, 0)}
  positions = range(2 * K + 2)
  prompts = [[3, V - 1 - j] for j in positions]
  tokens, lengths = js.pad_prompts(prompts, bucket=8)
  config = js.DecodeConfig(num_draft_tokens=K, max_new_tokens=3 * (K + 1), sampling=GREEDY,
                           eos_id=0, pad_id=V + 1)
  out = js.generate(cycle, cycle, tokens, lengths, np.full(len(lengths), 0),
                    target=toys.TableModel(),
                    draft=PERFECT, config=config)
  metrics = jax.tree.map(np.asarray, out.metrics)
  assert out.finish_reasons() == ['eos'] * len(positions)
  for j, row in zip(positions, out.new_tokens()):
    assert row == [(V - j + i) % V for i in range(j + 1)]  # ends with the EOS, nothing after
    assert np.all(np.asarray(out.tokens)[j, int(out.lengths[j]):] == V + 1)
    rounds = -(-(j + 1) // (K + 1))  # the perfect draft: full windows, then a cut one
    last = j + 1 - (rounds - 1) * (K + 1)
    assert metrics.target_forward_passes[j] == rounds
    assert metrics.new_tokens[j] == j + 1
    assert metrics.accepted[j] == (rounds - 1) * K + min(K, last)
    assert metrics.drafted[j] == metrics.accepted[j]  # counted up to the EOS only


def test_max_new_tokens_one_with_accepted_draft(reference):
  out = _run(js.DecodeConfig(num_draft_tokens=K, max_new_tokens=1, sampling=GREEDY))
  assert out.new_tokens()[0] == reference[:1]
  s = js.summarize(out.metrics)
  assert (s['new_tokens'], s['target_forward_passes']) == (1, 1)


@pytest.mark.parametrize('max_new', [6, 9])
def test_budget_never_exceeded(reference, max_new):
  out = _run(js.DecodeConfig(num_draft_tokens=K, max_new_tokens=max_new, sampling=GREEDY))
  assert out.new_tokens()[0] == reference[:max_new]
  assert out.finish_reasons() == ['length']


def test_finished_rows_stop_while_others_continue(reference):
  eos = reference[2]
  config = js.DecodeConfig(num_draft_tokens=K, max_new_tokens=12, sampling=GREEDY, eos_id=eos)
  out = _run(config, prompts=(PROMPT, [eos, 4, 9, 1, 3]))
  rows = out.new_tokens()
  assert rows[0] == reference[:reference.index(eos) + 1]
  assert len(rows[1]) == 12 or rows[1][-1] == eos
  per_row_passes = np.asarray(out.metrics.target_forward_passes)
  assert per_row_passes[0] == 1  # row 0 finished in its first round and was not counted again


def test_same_seed_same_tokens_other_seed_differs():
  cfg = LlamaConfig.tiny(tie_embeddings=False)
  params = init_params(cfg, jax.random.key(0))
  tokens, lengths = js.pad_prompts([[1, 2, 3], [4, 5, 6, 7, 8]], bucket=8)
  config = js.DecodeConfig(num_draft_tokens=3, max_new_tokens=16,
                           sampling=js.SamplingConfig(temperature=1.0))
  run = lambda seed: js.generate(params, params, tokens, lengths, np.full(len(lengths), seed),
                                 target=LlamaForward(cfg), draft=js.ModelDraft(
                                     LlamaForward(cfg, num_layers=1), shares_target_cache=True),
                                 config=config).new_tokens()
  assert run(7) == run(7)
  assert run(7) != run(8)


def test_ngram_lookup_matches_python_reference():
  rng = np.random.default_rng(0)
  for _ in range(30):
    n_len = int(rng.integers(1, 30))
    seq = rng.integers(0, 4, n_len).tolist()
    buf = np.zeros((1, 40), np.int32)
    buf[0, :n_len] = seq
    got = js.ngram.lookup(jnp.asarray(buf), jnp.array([n_len]), 5, 3, 1)[0].tolist()
    expected = toys.ngram_reference(seq, 5, 3) or [seq[-1]] * 5  # no match: the last token
    assert got == expected, (seq, got, expected)


def test_ngram_draft_proposes_only_where_a_match_exists():
  """`match_end` finds the latest occurrence for the longest n in [M, N] (-1 without one);
  `NGramDraft` is ready, and proposes K tokens, exactly where it finds one, and nothing elsewhere
  (as vLLM's and transformers' prompt lookup)."""
  buf = jnp.asarray([[5, 6, 7, 8, 9, 1, 5, 6, 0, 0, 0, 0],     # "5 6" occurred: a 2-gram match
                     [1, 2, 3, 4, 2, 0, 0, 0, 0, 0, 0, 0],     # only the 1-gram "2"
                     [1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0]])    # nothing
  lengths = jnp.array([8, 5, 5])
  np.testing.assert_array_equal(js.ngram.match_end(buf, lengths, 3, 1), [1, 1, -1])
  np.testing.assert_array_equal(js.ngram.match_end(buf, lengths, 3, 2), [1, -1, -1])
  ctx = js.DraftContext(buf, lengths, None, js.noise.row_keys([0, 1, 2]), 3,
                        js.SamplingConfig(temperature=0), 16, 0)
  for draft, ready in [(js.NGramDraft(3, 1), [True, True, False]),
                       (js.NGramDraft(3, 2), [True, False, False])]:
    np.testing.assert_array_equal(draft.ready(None, None, buf, lengths), ready)
    proposal = draft.propose(None, None, ctx)
    np.testing.assert_array_equal(proposal.num_proposed, np.where(ready, 3, 0))
    assert proposal.tokens[0].tolist() == [7, 8, 9]


def test_ngram_copies_a_repeated_phrase():
  buf = jnp.asarray([[5, 6, 7, 8, 9, 1, 5, 6, 0, 0, 0, 0]])
  assert js.ngram.lookup(buf, jnp.array([8]), 3, 2)[0].tolist() == [7, 8, 9]


# --- bad input: a clear error naming the problem, before any work ---

def test_empty_prompt_rejected():
  with pytest.raises(ValueError, match='empty prompt'):
    js.pad_prompts([[1, 2], []])
  with pytest.raises(ValueError, match='empty prompt'):
    js.generate(TABLE, None, np.zeros((1, 4), np.int32), np.array([0]), np.array([0]),
                target=toys.TableModel(), draft=None,
                config=js.DecodeConfig(num_draft_tokens=0))


@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=-0.5), 'temperature'),
    (dict(top_p=0.0), 'top_p'),
    (dict(top_p=1.5), 'top_p'),
    (dict(top_k=-1), 'top_k'),
])
def test_bad_sampling_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    js.SamplingConfig(**kwargs)


def test_num_draft_tokens_below_one_rejected():
  with pytest.raises(ValueError, match='num_draft_tokens'):
    _run(js.DecodeConfig(num_draft_tokens=0, sampling=GREEDY))
  with pytest.raises(ValueError, match='num_draft_tokens'):
    js.DecodeConfig(num_draft_tokens=-1)


def test_vocabulary_mismatch_rejected():
  target_cfg = LlamaConfig.tiny()
  draft_cfg = LlamaConfig.tiny(vocab_size=32)
  tokens, lengths = js.pad_prompts([[1, 2, 3]], bucket=8)
  with pytest.raises(ValueError, match='vocabulary mismatch'):
    js.generate(init_params(target_cfg, jax.random.key(0)),
                init_params(draft_cfg, jax.random.key(1)), tokens, lengths,
                np.full(len(lengths), 0),
                target=LlamaForward(target_cfg), draft=js.ModelDraft(LlamaForward(draft_cfg)),
                config=js.DecodeConfig(num_draft_tokens=2))


def test_prompt_that_does_not_fit_rejected():
  tokens, lengths = js.pad_prompts([list(range(1, 30))], bucket=32)
  with pytest.raises(ValueError, match='does not fit'):
    _run(js.DecodeConfig(num_draft_tokens=K, max_new_tokens=16, context_length=48), prompts=[
        list(range(1, 30))])


def test_missing_checkpoint_rejected(tmp_path):
  with pytest.raises(FileNotFoundError, match='missing.gguf'):
    load_gguf(str(tmp_path / 'missing.gguf'))
  with pytest.raises(FileNotFoundError, match='missing.gguf'):
    load_tokenizer(str(tmp_path / 'missing.gguf'))
