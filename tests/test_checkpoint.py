"""GGUF / Hugging Face -> orbax -> restore round-trips bit-exactly, on one device and sharded."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from models import checkpoint, gguf_loader, llama
from tests.test_sharding import ROOT, run_worker

HF_QWEN2 = os.path.join(ROOT, 'tests', 'fixtures', 'hf_tiny', 'qwen2')
TINY = llama.LlamaConfig.tiny(vocab_size=96, num_heads=8, num_kv_heads=2, tie_embeddings=False,
                              rope_theta=20000.0, norm_eps=2.0**-16)  # exact in float32


def write_tiny_gguf(path: str, config: llama.LlamaConfig = TINY, seed: int = 0) -> None:
  """A random float32 Llama GGUF (llama.cpp layout: `(out, in)` matrices) with `gguf.GGUFWriter`."""
  import gguf  # pylint: disable=g-import-not-at-top
  c, rng = config, np.random.default_rng(seed)
  rand = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  writer = gguf.GGUFWriter(path, 'llama')
  writer.add_block_count(c.num_layers)
  writer.add_embedding_length(c.embed_dim)
  writer.add_feed_forward_length(c.mlp_dim)
  writer.add_head_count(c.num_heads)
  writer.add_head_count_kv(c.num_kv_heads)
  writer.add_key_length(c.head_dim)
  writer.add_rope_freq_base(c.rope_theta)
  writer.add_layer_norm_rms_eps(c.norm_eps)
  writer.add_vocab_size(c.vocab_size)
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  writer.add_tensor('token_embd.weight', rand(c.vocab_size, c.embed_dim))
  writer.add_tensor('output_norm.weight', 1 + 0.1 * rand(c.embed_dim))
  writer.add_tensor('output.weight', rand(c.vocab_size, c.embed_dim))
  for i in range(c.num_layers):
    for name, shape in (('attn_q', (q, c.embed_dim)), ('attn_k', (kv, c.embed_dim)),
                        ('attn_v', (kv, c.embed_dim)), ('attn_output', (c.embed_dim, q)),
                        ('ffn_gate', (c.mlp_dim, c.embed_dim)),
                        ('ffn_up', (c.mlp_dim, c.embed_dim)),
                        ('ffn_down', (c.embed_dim, c.mlp_dim)), ('attn_norm', (c.embed_dim,)),
                        ('ffn_norm', (c.embed_dim,))):
      writer.add_tensor(f'blk.{i}.{name}.weight', rand(*shape))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def assert_bit_exact(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def tiny_gguf(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('gguf') / 'tiny.gguf')
  write_tiny_gguf(path)
  return path


def test_gguf_orbax_roundtrip(tiny_gguf, tmp_path):
  config, params = gguf_loader.load_gguf(tiny_gguf)
  assert config == TINY
  checkpoint.save(str(tmp_path / 'ckpt'), config, params)
  restored_config, restored = checkpoint.restore(str(tmp_path / 'ckpt'))
  assert restored_config == config
  assert_bit_exact(restored, params)
  from models import loading  # pylint: disable=g-import-not-at-top
  loaded_config, loaded, _ = loading.load_model(str(tmp_path / 'ckpt'))  # what decode.py uses
  assert loaded_config == config
  assert_bit_exact(loaded, params)


def test_hf_orbax_roundtrip_bf16(tmp_path):
  config, params = checkpoint.load_source(HF_QWEN2, dtype='bfloat16')
  assert params['layers_0']['attn']['q']['kernel'].dtype == jax.numpy.bfloat16
  checkpoint.save(str(tmp_path / 'ckpt'), config, params)
  restored_config, restored = checkpoint.restore(str(tmp_path / 'ckpt'))
  assert restored_config == config and restored_config.dtype == 'bfloat16'
  assert_bit_exact(restored, params)


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='not a checkpoint'):
    checkpoint.restore(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='no GGUF file'):
    checkpoint.load_source(str(tmp_path / 'nothing.gguf'))


def test_convert_script_and_sharded_restore(tiny_gguf, tmp_path):
  """scripts/convert.py writes the checkpoint; 8 fake devices restore it sharded, bit-exactly."""
  out = str(tmp_path / 'ckpt')
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'convert.py'),
                         '--model', tiny_gguf, '--out', out], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = run_worker(os.path.abspath(__file__), tiny_gguf, out)
  for mesh in ('data=2,model=4', 'data=1,model=8'):
    r = result[mesh]
    assert r['bit_exact'] and r['config_equal']
    assert r['q_spec'] == [None, 'model', None] and r['q_shard_heads'] == 8 // r['model']
    assert r['embed_spec'] == [None, None] if 96 % r['model'] else ['model', None]
  assert result['data=2,model=4']['k_spec'] == [None, None, None]  # 2 KV heads, model=4
  assert result['data=1,model=8']['k_spec'] == [None, None, None]


def _worker(gguf_path, ckpt):
  import json  # pylint: disable=g-import-not-at-top
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  config, params = gguf_loader.load_gguf(gguf_path)
  result = {}
  for spec in ('data=2,model=4', 'data=1,model=8'):
    mesh = sharding.make_mesh(spec)
    restored_config, restored = checkpoint.restore(ckpt, mesh=mesh)
    exact = all(x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
                for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(params)))
    attn = restored['layers_0']['attn']
    as_list = lambda x: list(tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec)))
    result[spec] = {'bit_exact': exact, 'config_equal': restored_config == config,
                    'model': mesh.shape['model'], 'q_spec': as_list(attn['q']['kernel']),
                    'k_spec': as_list(attn['k']['kernel']),
                    'embed_spec': as_list(restored['embed']['embedding']),
                    'q_shard_heads': attn['q']['kernel'].addressable_shards[0].data.shape[1]}
  print(json.dumps(result))


if __name__ == '__main__':
  _worker(*sys.argv[1:])
