"""Hugging Face directories of newer families: Llama 3.1/3.2 RoPE scaling (`llama3`), Qwen3
(QK-norm) and Gemma 3 (`Gemma3ForCausalLM`), each a tiny random checkpoint whose transformers
logits and greedy tokens were saved by `tests/fixtures/make_hf_families.py`.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import gemma3, hf_loader, llama
from tests.test_sharding import ROOT, run_worker

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'hf_tiny')
REF = dict(np.load(os.path.join(FIXTURES, 'families.npz')))
LOGITS_TOL = 1e-4
NAMES = ['llama31', 'qwen3', 'gemma3']


def forward_of(config):
  return (gemma3.Gemma3Forward(config) if isinstance(config, gemma3.Gemma3Config)
          else llama.LlamaForward(config))


@pytest.fixture(scope='module')
def loaded():
  return {name: hf_loader.load_hf(os.path.join(FIXTURES, name)) for name in NAMES}


def test_config_mapping(loaded):
  c = loaded['llama31'][0]
  assert (c.rope_scaling_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
          c.rope_original_context, c.rope_theta) == (4.0, 1.0, 4.0, 16, 500000.0)
  q = loaded['qwen3'][0]
  assert q.qk_norm and not q.qkv_bias and q.head_dim == 16 and not q.tie_embeddings
  assert loaded['qwen3'][1]['layers_0']['attn']['q_norm']['scale'].shape == (16,)
  g = loaded['gemma3'][0]
  assert isinstance(g, gemma3.Gemma3Config)
  assert (g.sliding_window, g.global_every, g.query_pre_attn_scalar) == (6, 2, 24.0)
  assert (g.rope_theta_local, g.rope_theta_global, g.rope_scale_global) == (1e4, 1e6, 2.0)
  assert g.final_logit_softcap == 10.0


@pytest.mark.parametrize('name', NAMES)
def test_logits_and_greedy_match_transformers(loaded, name):
  config, params = loaded[name]
  forward = forward_of(config)
  tokens = jnp.asarray(REF['tokens'][None])
  logits, _ = jax.jit(forward)(params, tokens, forward.init_cache(1, tokens.shape[1]),
                               jnp.zeros((1,), jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), REF[f'{name}_logits'], rtol=0, atol=LOGITS_TOL)
  padded, lengths = js.pad_prompts([REF['tokens'].tolist()], bucket=64)
  out = js.generate(params, None, padded, lengths, np.zeros(len(lengths), np.int32),
                    target=forward, draft=None,
                    config=js.DecodeConfig(num_draft_tokens=0, max_new_tokens=12,
                                           sampling=js.SamplingConfig(temperature=0)))
  assert out.new_tokens()[0] == REF[f'{name}_greedy'].tolist()


def test_each_feature_matters(loaded):
  """Dropping RoPE scaling, QK-norm or Gemma's window/softcap changes the logits far beyond the
  tolerance, so the parity above really exercises them."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  tokens = jnp.asarray(REF['tokens'][None])
  variants = {
      'llama31': lambda c: dataclasses.replace(c, rope_scaling_factor=1.0),
      'gemma3': lambda c: dataclasses.replace(c, sliding_window=64),
  }
  for name, change in variants.items():
    config, params = loaded[name]
    forward = forward_of(change(config))
    logits, _ = forward(params, tokens, forward.init_cache(1, 40), jnp.zeros((1,), jnp.int32))
    assert np.abs(np.asarray(logits) - REF[f'{name}_logits']).max() > 100 * LOGITS_TOL, name
  config, params = loaded['qwen3']
  unnormed = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.ones_like(x) if 'q_norm' in str(path) else x, params)
  forward = forward_of(config)
  logits, _ = forward(unnormed, tokens, forward.init_cache(1, 40), jnp.zeros((1,), jnp.int32))
  assert np.abs(np.asarray(logits) - REF['qwen3_logits']).max() > 100 * LOGITS_TOL


def test_unsupported_features_raise():
  with open(os.path.join(FIXTURES, 'llama31', 'config.json')) as f:
    base = json.load(f)
  with pytest.raises(ValueError, match="RoPE scaling 'yarn'"):
    hf_loader.config_from_hf({**base, 'rope_parameters': {'rope_type': 'yarn', 'factor': 4.0}})
  with open(os.path.join(FIXTURES, 'gemma3', 'config.json')) as f:
    g = json.load(f)
  with pytest.raises(ValueError, match='layer_types'):
    hf_loader.config_from_hf({**g, 'layer_types': ['full_attention', 'sliding_attention'] * 2})
  with pytest.raises(ValueError, match='untied'):
    hf_loader.config_from_hf({**g, 'tie_word_embeddings': False})
  with pytest.raises(ValueError, match='unsupported architecture'):
    hf_loader.config_from_hf({**g, 'architectures': ['Gemma3ForConditionalGeneration']})
  with pytest.raises(ValueError, match='Gemma 3 RoPE'):
    hf_loader.config_from_hf({**g, 'rope_parameters': {
        'full_attention': {'rope_type': 'yarn', 'rope_theta': 1e6},
        'sliding_attention': {'rope_type': 'default', 'rope_theta': 1e4}}})


def test_gemma3_sharded_load_and_decode():
  """On 8 fake devices (data=2, model=4): Gemma params are placed by their logical axes, and
  the sharded logits and greedy tokens match transformers."""
  r = run_worker(os.path.abspath(__file__))
  assert r['q_spec'] == [None, 'model', None] and r['q_shard_shape'] == [64, 1, 16]
  assert r['k_spec'] == [None, None, None]  # 2 KV heads do not divide model=4
  assert r['gate_spec'] == [None, 'model'] and r['embed_spec'] == ['model', None]
  assert r['logits_max_err'] <= LOGITS_TOL
  assert r['greedy'] == REF['gemma3_greedy'].tolist()


def _worker():
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh('data=2,model=4')
  config, params = hf_loader.load_hf(os.path.join(FIXTURES, 'gemma3'), mesh=mesh)
  target = sharding.ShardedModel.wrap(gemma3.Gemma3Forward(config),
                                      gemma3.cache_logical_axes(config), mesh)
  tokens = jnp.asarray(REF['tokens'][None])
  logits, _ = jax.jit(target)(params, tokens, target.init_cache(1, 40), jnp.zeros((1,), jnp.int32))
  err = float(np.abs(np.asarray(logits) - REF['gemma3_logits']).max())
  padded, lengths = js.pad_prompts([REF['tokens'].tolist()] * 2, bucket=64)
  out = js.generate(params, None, padded, lengths, np.zeros(len(lengths), np.int32),
                    target=target, draft=None,
                    config=js.DecodeConfig(num_draft_tokens=0, max_new_tokens=12,
                                           sampling=js.SamplingConfig(temperature=0)))
  rows = out.new_tokens()
  assert rows[0] == rows[1]
  spec = lambda x: list(tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec)))
  layer = params['layers_0']
  print(json.dumps({
      'q_spec': spec(layer['attn']['q']['kernel']), 'k_spec': spec(layer['attn']['k']['kernel']),
      'gate_spec': spec(layer['mlp']['gate']['kernel']),
      'embed_spec': spec(params['embed']['embedding']),
      'q_shard_shape': list(layer['attn']['q']['kernel'].addressable_shards[0].data.shape),
      'logits_max_err': err, 'greedy': rows[0]}))


if __name__ == '__main__':
  jax.config.update('jax_default_matmul_precision', 'highest')
  _worker()
