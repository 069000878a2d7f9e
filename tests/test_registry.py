"""The registry of trained draft kinds (models/registry.py) on a tiny Llama: every kind's recipe
builds a loss that runs on a small data file (evaluated once, nothing trained), its save/load
round trip goes through the one loader (`models.loading.load_draft`) to the kind's jaxspec
wrapper, and the export writes the kinds that can be exported and refuses EAGLE, saying why."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxspec as js
from models import draft_heads, draft_training, llama, loading, registry

SEQ_LEN, TOP_K = 16, 4


def _data(path, vocab_size, rows=6):
  rng = np.random.default_rng(0)
  lengths = rng.integers(10, 20, rows)
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  n = int(offsets[-1])
  np.savez(path, tokens=rng.integers(3, vocab_size, n).astype(np.int32), offsets=offsets,
           prompt_lengths=np.full(rows, 4, np.int32),
           teacher_ids=rng.integers(0, vocab_size, (n, TOP_K)).astype(np.int32),
           teacher_logp=np.log(np.full((n, TOP_K), 1 / TOP_K)).astype(np.float16))
  return path


@pytest.mark.parametrize('name', sorted(registry.KINDS))
def test_recipe_save_load_export(name, tmp_path):
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  kind = registry.kind(name)
  data = _data(str(tmp_path / 'data.npz'), config.vocab_size)
  vocab_ids = np.arange(0, config.vocab_size, 2, dtype=np.int32)
  to_draft = np.full((config.vocab_size,), -1, np.int32)
  to_draft[vocab_ids] = np.arange(len(vocab_ids))
  opts = draft_training.RecipeOptions(
      data=(data,), batch_size=2, seq_len=SEQ_LEN, draft_vocab_size=len(vocab_ids),
      exit_layer=1, adapter_mlp_dim=16,
      source_layers=(1,) if name == 'eagle' else kind.default_source_layers[:1] or (0,),
      unroll=3 if name == 'eagle' else 1)  # eagle: the training-time test's passes too
  recipe = kind.recipe(opts, config, params, vocab_ids, jax.random.key(1))
  tokens, idx, prob, mask = draft_training.load_rows(data, SEQ_LEN, to_draft)
  arrays, eval_rows, _ = recipe.make_arrays(tokens, idx, prob, mask, np.arange(3),
                                            np.arange(3, 6))
  loss, agree = recipe.loss_fn(recipe.trainable, *(jnp.asarray(a[eval_rows[:2]]) for a in arrays))
  assert np.isfinite(float(loss)) and 0 <= float(agree) <= 1
  if name == 'eagle':  # the losses at the selected positions only = over every position, masked
    rows = eval_rows[:2]
    p = {**recipe.trainable, 'embed': params['embed']['embedding'],
         'head': draft_heads.target_head_rows(config, params, vocab_ids)}
    fwd = draft_heads.EagleDraftForward(config, recipe.draft_config)
    t, f = jnp.asarray(tokens[rows]), jnp.asarray(arrays[1][rows], jnp.float32)
    i, pr, m = (jnp.asarray(a[rows]) for a in (idx, prob, mask))
    full = 0.0
    for pred in draft_heads.eagle_training_passes(fwd, p, t, f, 3):
      kl, _ = draft_heads.distill_loss(fwd.reduced_logits(p, pred), i, pr, m)
      reg = jnp.sum(optax.huber_loss(pred, f).mean(-1) * m) / m.sum()
      full = full + kl + reg
    np.testing.assert_allclose(float(loss), float(full), rtol=1e-5)
    mask_RT = np.zeros((2, 32), np.float32)
    mask_RT[0, 3:8], mask_RT[1, 20:22] = 1, 1
    sel, (m_sel,) = draft_training.loss_positions(mask_RT, mask_RT)
    assert sel.shape == (2, 8) and sel[0, :5].tolist() == [3, 4, 5, 6, 7]
    assert m_sel.sum(1).tolist() == [5, 2] and sel[1, :2].tolist() == [20, 21]

  directory = str(tmp_path / name)
  registry.save_draft(directory, name, recipe.draft_config, recipe.trainable, vocab_ids,
                      dtype='float32', info=recipe.info)
  assert json.load(open(os.path.join(directory, 'draft.json')))['kind'] == name
  draft, dparams = loading.load_draft(directory, config, params)
  assert type(draft) is type(kind.wrap(draft.forward))
  assert isinstance(draft, js.FeatureDraft if name == 'eagle' else js.ModelDraft)

  out = str(tmp_path / 'hf')
  if kind.export is None:
    with pytest.raises(ValueError, match='cannot be exported'):
      registry.export_hf_draft(directory, out, config, params)
  else:
    layers = registry.export_hf_draft(directory, out, config, params)
    assert layers == (2 if name == 'exit' else len(opts.source_layers))
    assert json.load(open(os.path.join(out, 'config.json')))['num_hidden_layers'] == layers


def test_unknown_kind_rejected(tmp_path):
  with pytest.raises(ValueError, match='unknown draft kind'):
    registry.kind('medusa')
  with pytest.raises(ValueError, match='expected one of exit, small, eagle'):
    registry.save_draft(str(tmp_path), 'medusa', None, {}, [0])


def test_draft_specs_through_the_one_loader():
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  draft, dparams = loading.load_draft('ngram', config, params)
  assert draft == js.NGramDraft(max_ngram=3) and dparams is None
  assert loading.load_draft('ngram:5', config, params)[0] == js.NGramDraft(max_ngram=5)
  assert loading.load_draft('ngram:3:2', config, params)[0] == js.NGramDraft(3, 2)
  draft, dparams = loading.load_draft('early-exit:1', config, params)
  assert draft.shares_target_cache and dparams is params
  for spec, match in [('early-exit:2', 'needs 1 <= N < 2'), ('ngram:0', 'integers 1 <= M <= N'),
                      ('ngram:2:3', 'integers 1 <= M <= N'), ('ngram:3:0', '1 <= M <= N'),
                      ('ngram:3:2:1', 'ngram:N:M'), ('early-exit:x', 'N must be an integer'),
                      ('/missing', 'neither ngram')]:
    with pytest.raises(ValueError, match=match):
      loading.load_draft(spec, config, params)
