"""Trained drafts (models/draft_heads.py): exactness on tiny Llama targets, and on SmolLM2 with the
committed draft when the model is installed.

- Greedy output with an exit-adapter draft (shared cache), a small reduced-vocabulary draft
  (own cache) and an EAGLE draft (reads the target's features) equals plain greedy output token
  for token.
- Sampled output with reduced-vocabulary drafts (q exactly zero outside the draft vocabulary)
  follows the target's distribution: chi-square on the joint of the first 3 tokens (V = 5, N =
  20000 rows, fixed keys), failing when p < 1e-3, as in tests/test_exactness.py.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import draft_heads, llama, registry
from tests import toys

DRAFTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'drafts')


def _random_adapter(config, params, draft, vocab_ids, key):
  adapter = draft_heads.init_exit_adapter(config, params, draft, vocab_ids, key)
  # A non-zero output projection, so the adapter really changes the exit's predictions.
  adapter['down'] = 0.5 * jax.random.normal(jax.random.key(7), adapter['down'].shape)
  return adapter


def _drafts(config, params, vocab_ids):
  """An exit-adapter draft and a small draft, both with the reduced vocabulary `vocab_ids`."""
  exit_cfg = draft_heads.ExitDraftConfig(exit_layer=1, adapter_mlp_dim=16,
                                         draft_vocab_size=len(vocab_ids))
  exit_params = {'target': params, 'vocab_ids': jnp.asarray(vocab_ids),
                 'adapter': _random_adapter(config, params, exit_cfg, vocab_ids,
                                            jax.random.key(3))}
  small_cfg = draft_heads.SmallDraftConfig(source_layers=(1,), draft_vocab_size=len(vocab_ids))
  small_params = {'embed': params['embed']['embedding'], 'vocab_ids': jnp.asarray(vocab_ids),
                  **draft_heads.init_small_draft(config, params, small_cfg, vocab_ids)}
  eagle_cfg = draft_heads.EagleDraftConfig(source_layer=1, draft_vocab_size=len(vocab_ids))
  eagle_params = {'embed': params['embed']['embedding'], 'vocab_ids': jnp.asarray(vocab_ids),
                  'head': draft_heads.target_head_rows(config, params, vocab_ids),
                  **draft_heads.init_eagle_draft(config, params, eagle_cfg, jax.random.key(4))}
  eagle_params['fc_bias'] = 0.3 * jax.random.normal(jax.random.key(5),
                                                    eagle_params['fc_bias'].shape)
  return [
      (js.ModelDraft(draft_heads.ExitDraftForward(config, exit_cfg), shares_target_cache=True),
       exit_params),
      (js.ModelDraft(draft_heads.SmallDraftForward(config, small_cfg)), small_params),
      (js.FeatureDraft(draft_heads.EagleDraftForward(config, eagle_cfg)), eagle_params),
  ]


def test_expand_vocab_puts_zero_mass_outside():
  logits = jnp.asarray([[[1.0, 2.0]]])
  full = draft_heads.expand_vocab(logits, jnp.asarray([1, 3]), 5)
  q = js.process_logits(full, js.SamplingConfig(temperature=0.7, top_p=0.9))
  assert np.all(np.asarray(q)[..., [0, 2, 4]] == 0)
  np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, rtol=1e-6)


def test_frequent_vocab_keeps_always_tokens():
  ids = draft_heads.frequent_vocab(np.asarray([5, 0, 9, 1, 7]), 2, always=(1,))
  assert ids.tolist() == [1, 2]
  with pytest.raises(ValueError, match='draft vocabulary size'):
    draft_heads.frequent_vocab(np.ones(4), 5)


@pytest.mark.parametrize('k', [3])
def test_greedy_output_equals_plain(k):
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  target = llama.LlamaForward(config)
  vocab_ids = np.arange(0, config.vocab_size, 2, dtype=np.int32)  # half the vocabulary
  prompts, lengths = js.pad_prompts([[1, 5, 9], [3, 4, 7, 8, 2, 6], [11]], bucket=8)
  plain = js.generate(params, None, prompts, lengths, np.full(len(lengths), 0),
                      target=target, draft=None,
                      config=js.DecodeConfig(num_draft_tokens=0, max_new_tokens=20,
                                             sampling=js.SamplingConfig(temperature=0)))
  for draft, draft_params in _drafts(config, params, vocab_ids):
    out = js.generate(params, draft_params, prompts, lengths, np.full(len(lengths), 0),
                      target=target,
                      draft=draft,
                      config=js.DecodeConfig(num_draft_tokens=k, max_new_tokens=20,
                                             sampling=js.SamplingConfig(temperature=0)))
    assert out.new_tokens() == plain.new_tokens(), type(draft.forward).__name__
    stats = js.summarize(out.metrics)
    assert stats['drafted_tokens'] > 0


V, N, NUM_TOKENS, ALPHA, PROMPT = 5, 20000, 3, 1e-3, [1, 3]


@pytest.mark.parametrize('which', [0, 1, 2], ids=['exit_adapter', 'small_draft', 'eagle'])
def test_reduced_vocab_sampling_follows_target(which):
  config = llama.LlamaConfig.tiny(vocab_size=V)
  params = llama.init_params(config, jax.random.key(1))
  target = llama.LlamaForward(config)
  draft, draft_params = _drafts(config, params, np.asarray([0, 2, 3], np.int32))[which]
  sampling = js.SamplingConfig(temperature=1.0)
  prompts = np.tile(np.asarray([PROMPT], np.int32), (N, 1))
  out = js.generate(params, draft_params, prompts, np.full((N,), len(PROMPT)), np.arange(N),
                    target=target, draft=draft,
                    config=js.DecodeConfig(num_draft_tokens=3, max_new_tokens=NUM_TOKENS,
                                           sampling=sampling))
  rows = out.new_tokens()
  assert all(len(r) == NUM_TOKENS for r in rows)
  stats = js.summarize(out.metrics)
  assert 0 < stats['acceptance_rate'] < 1
  expected = toys.exact_joint(target, params, PROMPT, NUM_TOKENS, sampling)
  counts = toys.joint_counts(rows, NUM_TOKENS, V)
  assert toys.chi_square_pvalue(counts, expected) > ALPHA


def test_save_load_round_trip(tmp_path):
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  vocab_ids = np.arange(10, dtype=np.int32)
  (draft, draft_params), *_ = _drafts(config, params, vocab_ids)
  registry.save_draft(str(tmp_path), 'exit', draft.forward.draft, draft_params['adapter'],
                         vocab_ids, dtype='float32')
  forward, loaded, shares = registry.load_draft(str(tmp_path), config, params)
  assert shares and forward == draft.forward
  assert loaded['target'] is params
  tokens, start = jnp.asarray([[1, 2, 3]]), jnp.zeros((1,), jnp.int32)
  a, _ = forward(loaded, tokens, forward.init_cache(1, 8), start)
  b, _ = draft.forward(draft_params, tokens, forward.init_cache(1, 8), start)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope='module')
def smollm2():
  """(GGUF path, config, params) of SmolLM2, loaded once for the module; skips without it."""
  from models import gguf_loader  # pylint: disable=g-import-not-at-top
  try:
    path = gguf_loader.default_model_path()
  except FileNotFoundError:
    pytest.skip('SmolLM2 is not installed')
  return (path, *gguf_loader.load_gguf(path))


SMOLLM2_GREEDY = js.DecodeConfig(max_new_tokens=16, eos_id=2, pad_id=2,
                                 sampling=js.SamplingConfig(temperature=0))


@pytest.fixture(scope='module')
def smollm2_prompt(smollm2):
  """A chat prompt (padded) and SmolLM2's plain greedy tokens for it, decoded once for the
  module (both committed drafts are compared with the same plain output)."""
  path, config, params = smollm2
  from models import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  prompt = tok_lib.load_tokenizer(path).encode_chat('Name three primary colors.')
  tokens, lengths = js.pad_prompts([prompt], pad_id=2, bucket=64)
  plain = js.generate(params, None, tokens, lengths, np.full(len(lengths), 0),
                      target=llama.LlamaForward(config), draft=None,
                      config=dataclasses.replace(SMOLLM2_GREEDY, num_draft_tokens=0))
  return tokens, lengths, plain.new_tokens()


@pytest.mark.parametrize('name', ['smollm2_exit', 'smollm2_eagle'])
def test_committed_draft_greedy_equals_plain_on_smollm2(name, smollm2, smollm2_prompt):
  draft_dir = os.path.join(DRAFTS, name)
  assert os.path.isfile(os.path.join(draft_dir, 'draft.json')), f'{draft_dir} is committed'
  _, config, params = smollm2
  draft, draft_params = registry.load_trained_draft(draft_dir, config, params)
  tokens, lengths, plain = smollm2_prompt
  out = js.generate(params, draft_params, tokens, lengths, np.full(len(lengths), 0),
                    target=llama.LlamaForward(config), draft=draft,
                    config=dataclasses.replace(SMOLLM2_GREEDY, num_draft_tokens=4))
  assert out.new_tokens() == plain
  assert js.summarize(out.metrics)['drafted_tokens'] > 0


def test_eagle_save_load_round_trip(tmp_path):
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  vocab_ids = np.arange(10, dtype=np.int32)
  draft, draft_params = _drafts(config, params, vocab_ids)[2]
  trainable = {k: draft_params[k] for k in ('fc', 'fc_bias', 'block', 'norm')}
  registry.save_draft(str(tmp_path), 'eagle', draft.forward.draft, trainable, vocab_ids,
                         dtype='float32')
  loaded_draft, loaded = registry.load_trained_draft(str(tmp_path), config, params)
  assert isinstance(loaded_draft, js.FeatureDraft) and loaded_draft.forward == draft.forward
  tokens, start = jnp.asarray([[1, 2, 3]]), jnp.zeros((1,), jnp.int32)
  feats = jax.random.normal(jax.random.key(2), (1, 3, config.embed_dim))
  a, _ = draft.forward(loaded, tokens, feats, draft.forward.init_cache(1, 8), start)
  b, _ = draft.forward(draft_params, tokens, feats, draft.forward.init_cache(1, 8), start)
  np.testing.assert_allclose(np.asarray(draft.forward.logits(loaded, a)),
                             np.asarray(draft.forward.logits(draft_params, b)),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('qk_norm', [False, True])
def test_eagle_training_passes_equal_drafting_steps(qk_norm):
  # Pass j at position t must be what drafting step j of a round begun at s = t-j+1 computes:
  # the inference forward over positions 0..s with the target's features (its cache), then
  # steps 2..j one token each, each reading the step before's predicted feature.
  config = llama.LlamaConfig.tiny(qk_norm=qk_norm, cpu_kernel=False)
  params = llama.init_params(config, jax.random.key(0))
  vocab_ids = np.arange(config.vocab_size // 2)
  eagle_cfg = draft_heads.EagleDraftConfig(source_layer=1, draft_vocab_size=len(vocab_ids))
  fwd = draft_heads.EagleDraftForward(config, eagle_cfg)
  p = {'embed': params['embed']['embedding'], 'vocab_ids': jnp.asarray(vocab_ids),
       'head': draft_heads.target_head_rows(config, params, vocab_ids),
       **draft_heads.init_eagle_draft(config, params, eagle_cfg, jax.random.key(4))}
  b, t, passes = 2, 12, 3
  tokens = jax.random.randint(jax.random.key(1), (b, t), 0, config.vocab_size)
  feats = jax.random.normal(jax.random.key(2), (b, t, config.embed_dim))
  preds = draft_heads.eagle_training_passes(fwd, p, tokens, feats, passes)
  prev = jnp.pad(feats, ((0, 0), (1, 0), (0, 0)))[:, :t]
  for s in (0, 4, 8):
    x, cache = fwd(p, tokens[:, :s + 1], prev[:, :s + 1], fwd.init_cache(b, t), jnp.zeros(b, int))
    np.testing.assert_allclose(preds[0][:, :s + 1], x, atol=2e-5)
    step = x[:, -1:]
    for j in range(2, passes + 1):
      pos = s + j - 1
      step, cache = fwd(p, tokens[:, pos:pos + 1], step, cache, jnp.full(b, pos))
      np.testing.assert_allclose(preds[j - 1][:, pos], step[:, 0], atol=2e-5, err_msg=f's={s} j={j}')
      # ...and not what a pass fed its own features everywhere gives (the mask matters).
  naive = fwd(p, tokens, jnp.pad(preds[0], ((0, 0), (1, 0), (0, 0)))[:, :t], fwd.init_cache(b, t),
              jnp.zeros(b, int))[0]
  assert np.abs(np.asarray(naive - preds[1])[:, 3:]).max() > 1e-3
