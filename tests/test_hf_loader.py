"""Hugging Face checkpoints: config mapping, logits against transformers, sharded placement,
decoding, the exporter round trip and clear errors.

The fixtures in `tests/fixtures/hf_tiny/` (tiny random `LlamaForCausalLM`, GQA, untied, float32;
`Qwen2ForCausalLM`, Q/K/V biases, tied, bfloat16 in 2 shards with an index) and transformers'
reference logits and greedy tokens were made by `tests/fixtures/make_hf_tiny.py`, so these tests
run without transformers.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import hf_loader, llama
from tests.test_sharding import ROOT, run_worker

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'hf_tiny')
REF = dict(np.load(os.path.join(FIXTURES, 'reference.npz')))
LOGITS_TOL = 1e-4  # max abs difference to transformers' float32 logits (logits are O(1-5))


def logits_of(config, params):
  """Our float32 logits `[1, T, V]` for the reference tokens (one jitted full forward)."""
  forward = llama.LlamaForward(config)
  tokens = jnp.asarray(REF['tokens'][None])

  @jax.jit
  def run(params):
    cache = forward.init_cache(1, tokens.shape[1])
    return forward(params, tokens, cache, jnp.zeros((1,), jnp.int32))[0]

  return np.asarray(run(params))


@pytest.fixture(scope='module')
def loaded():
  return {name: hf_loader.load_hf(os.path.join(FIXTURES, name)) for name in ('llama', 'qwen2')}


def test_config_mapping(loaded):
  c = loaded['llama'][0]
  assert (c.num_heads, c.num_kv_heads, c.head_dim, c.embed_dim) == (4, 2, 16, 48)
  assert c.rope_theta == 50000.0 and c.norm_eps == 1e-6
  assert not c.tie_embeddings and not c.qkv_bias
  q = loaded['qwen2'][0]
  assert (q.num_kv_heads, q.head_dim, q.rope_theta) == (1, 16, 1e6)
  assert q.tie_embeddings and q.qkv_bias
  assert 'lm_head' not in loaded['qwen2'][1] and 'lm_head' in loaded['llama'][1]
  assert loaded['qwen2'][1]['layers_1']['attn']['k']['bias'].shape == (1, 16)


@pytest.mark.parametrize('name', ['llama', 'qwen2'])
def test_logits_match_transformers(loaded, name):
  config, params = loaded[name]
  ours = logits_of(config, params)
  assert ours.shape == REF[f'{name}_logits'].shape == (1, 12, 128)
  np.testing.assert_allclose(ours, REF[f'{name}_logits'], rtol=0, atol=LOGITS_TOL)


def test_speculative_decode_matches_transformers(loaded):
  """The Llama checkpoint as target with the Qwen2 checkpoint as its draft (same vocabulary, a
  different family) reproduces transformers' greedy tokens of the Llama model exactly."""
  tokens, lengths = js.pad_prompts([REF['tokens'].tolist()], bucket=16)
  (config, params), (draft_config, draft_params) = loaded['llama'], loaded['qwen2']
  out = js.generate(params, draft_params, tokens, lengths, np.full(len(lengths), 0),
                    target=llama.LlamaForward(config),
                    draft=js.ModelDraft(llama.LlamaForward(draft_config)),
                    config=js.DecodeConfig(num_draft_tokens=3, max_new_tokens=16,
                                           sampling=js.SamplingConfig(temperature=0)))
  assert out.new_tokens()[0] == REF['llama_greedy'].tolist()


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_export_roundtrip(tmp_path, dtype):
  """save_hf then load_hf gives identical params (values, dtypes, tree) and config."""
  for name in ('llama', 'qwen2'):
    config, params = hf_loader.load_hf(os.path.join(FIXTURES, name), dtype=dtype)
    out = str(tmp_path / f'{name}_{dtype}')
    hf_loader.save_hf(config, params, out, eos_token_id=2)
    with open(os.path.join(out, 'config.json')) as f:
      written = json.load(f)
    assert written['architectures'] == [('Qwen2ForCausalLM' if config.qkv_bias
                                         else 'LlamaForCausalLM')]
    config2, params2 = hf_loader.load_hf(out, dtype=dtype)
    assert config2 == config
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='directory not found'):
    hf_loader.load_hf(str(tmp_path / 'nope'))
  with pytest.raises(FileNotFoundError, match='config.json is missing'):
    hf_loader.load_hf(str(tmp_path))
  broken = tmp_path / 'broken'
  shutil.copytree(os.path.join(FIXTURES, 'qwen2'), broken)
  index = json.loads((broken / 'model.safetensors.index.json').read_text())
  del index['weight_map']['model.layers.1.mlp.up_proj.weight']
  (broken / 'model.safetensors.index.json').write_text(json.dumps(index))
  with pytest.raises(ValueError, match='model.layers.1.mlp.up_proj.weight.*missing'):
    hf_loader.load_hf(str(broken))
  os.remove(broken / 'model-00002-of-00002.safetensors')
  os.remove(broken / 'model.safetensors.index.json')
  with pytest.raises(FileNotFoundError, match='no model.safetensors'):
    hf_loader.load_hf(str(broken))
  base = json.loads(open(os.path.join(FIXTURES, 'llama', 'config.json')).read())
  with pytest.raises(ValueError, match='unsupported architecture'):
    hf_loader.config_from_hf({**base, 'architectures': ['GPT2LMHeadModel']})
  with pytest.raises(ValueError, match="RoPE scaling 'dynamic' is not supported"):
    hf_loader.config_from_hf({**base, 'rope_parameters': {'rope_type': 'dynamic',
                                                          'rope_theta': 5e5, 'factor': 8.0}})
  with pytest.raises(ValueError, match='llama3 needs .*low_freq_factor'):
    hf_loader.config_from_hf({**base, 'rope_parameters': {'rope_type': 'llama3',
                                                          'rope_theta': 5e5, 'factor': 8.0}})
  wrong = tmp_path / 'wrong'
  shutil.copytree(os.path.join(FIXTURES, 'llama'), wrong)
  (wrong / 'config.json').write_text(json.dumps({**base, 'intermediate_size': 80}))
  with pytest.raises(ValueError, match=r'mlp.down_proj.weight.*shape \(48, 96\), expected '
                     r'\(48, 80\)'):
    hf_loader.load_hf(str(wrong))


def test_sharded_load_and_decode():
  """On 8 fake devices: each tensor is placed with its sharding, logits and greedy tokens match."""
  r = run_worker(os.path.abspath(__file__))
  assert r['q_spec'] == [None, 'model', None] and r['q_shard_shape'] == [48, 1, 16]
  assert r['o_spec'] == ['model', None, None] and r['down_spec'] == ['model', None]
  assert r['k_spec'] == [None, None, None]  # 2 KV heads do not divide model=4
  assert r['lm_head_spec'] == [None, 'model'] and r['lm_head_shard_shape'] == [48, 32]
  assert r['logits_max_err'] <= LOGITS_TOL
  assert r['greedy'] == REF['llama_greedy'].tolist()


def _worker():
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh('data=2,model=4')
  config, params = hf_loader.load_hf(os.path.join(FIXTURES, 'llama'), mesh=mesh)
  err = float(np.abs(logits_of(config, params) - REF['llama_logits']).max())
  target = sharding.ShardedModel.wrap(llama.LlamaForward(config),
                                      llama.cache_logical_axes(config), mesh)
  tokens, lengths = js.pad_prompts([REF['tokens'].tolist()] * 2, bucket=16)
  out = js.generate(params, None, tokens, lengths, np.full(len(lengths), 0),
                    target=target, draft=None,
                    config=js.DecodeConfig(num_draft_tokens=0, max_new_tokens=16,
                                           sampling=js.SamplingConfig(temperature=0)))
  rows = out.new_tokens()
  assert rows[0] == rows[1]
  spec = lambda x: list(tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec)))
  attn = params['layers_0']['attn']
  print(json.dumps({
      'q_spec': spec(attn['q']['kernel']), 'k_spec': spec(attn['k']['kernel']),
      'o_spec': spec(attn['o']['kernel']),
      'down_spec': spec(params['layers_0']['mlp']['down']['kernel']),
      'lm_head_spec': spec(params['lm_head']['kernel']),
      'q_shard_shape': list(attn['q']['kernel'].addressable_shards[0].data.shape),
      'lm_head_shard_shape': list(params['lm_head']['kernel'].addressable_shards[0].data.shape),
      'logits_max_err': err, 'greedy': rows[0]}))


if __name__ == '__main__':
  jax.config.update('jax_default_matmul_precision', 'highest')
  _worker()
