"""Hugging Face Llama-family checkpoints (safetensors) in and out of `models.llama` params.

Supported: `LlamaForCausalLM` (Llama 2/3, Llama 3.1/3.2 with `rope_type: llama3`, SmolLM,
TinyLlama), `MistralForCausalLM`, `Qwen2ForCausalLM` (Q/K/V biases), `Qwen3ForCausalLM` (QK-norm)
into `models.llama`, and `Gemma3ForCausalLM` (`gemma3_text`) into `models.gemma3`. Hugging Face
stores linear weights as `(out, in)`; ours are `(in, out)`, with Q/K/V kernels `[D, N, H]` and the
output kernel `[N, H, D]`. Both use the `rotate_half` RoPE, so no row permutation is needed
(unlike GGUF). Gemma's RMSNorm weights `w` act as `1 + w`; we store the scale `1 + w`.

Loading reads each tensor with `safetensors.safe_open(...).get_slice` inside
`jax.make_array_from_callback`: every device asks for its own slice of the target sharding, and
only that slice is read from the (memory-mapped) file, so a large model never has a full host
copy. On several hosts each process reads only the slices of its own devices.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import jax
import numpy as np

from jaxspec import sharding as sh
from models import gemma3, llama
from models.gemma3 import Gemma3Config
from models.llama import LlamaConfig

ARCHITECTURES = {'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'mistral',
                 'Qwen2ForCausalLM': 'qwen2', 'Qwen3ForCausalLM': 'qwen3',
                 'Gemma3ForCausalLM': 'gemma3'}


def _family(config):
  """The model module (`models.llama` or `models.gemma3`) of a config."""
  return gemma3 if isinstance(config, Gemma3Config) else llama


def init_params(config, key):
  return _family(config).init_params(config, key)


def logical_axes(config):
  return _family(config).logical_axes(config)


def read_config(directory: str) -> dict:
  """The parsed `config.json` of a checkpoint directory. Raises FileNotFoundError."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'checkpoint directory not found: {directory}')
  path = os.path.join(directory, 'config.json')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} is missing: not a Hugging Face checkpoint directory')
  with open(path) as f:
    return json.load(f)


def config_from_hf(hf: dict, dtype: str = 'float32') -> LlamaConfig | Gemma3Config:
  """Maps a Hugging Face `config.json` dict to a LlamaConfig (or a Gemma3Config).

  Raises:
    ValueError: an unsupported architecture or feature (RoPE scaling other than `llama3`,
      biases on the output or MLP projections, an activation other than SiLU).
  """
  archs = hf.get('architectures') or []
  arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
  if arch is None:
    raise ValueError(f'unsupported architecture {archs or hf.get("model_type")!r}; supported: '
                     f'{sorted(ARCHITECTURES)}')
  if arch == 'gemma3':
    return gemma3_config_from_hf(hf, dtype)
  rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
  rope_type = rope.get('rope_type', rope.get('type', 'default'))
  if rope_type not in ('default', 'llama3'):
    raise ValueError(f'RoPE scaling {rope_type!r} is not supported (only default RoPE and '
                     f'llama3)')
  scaling = {}
  if rope_type == 'llama3':
    missing = [k for k in ('factor', 'low_freq_factor', 'high_freq_factor',
                           'original_max_position_embeddings') if k not in rope]
    if missing:
      raise ValueError(f'RoPE scaling llama3 needs {missing} in rope_parameters/rope_scaling')
    scaling = dict(rope_scaling_factor=float(rope['factor']),
                   rope_low_freq_factor=float(rope['low_freq_factor']),
                   rope_high_freq_factor=float(rope['high_freq_factor']),
                   rope_original_context=int(rope['original_max_position_embeddings']))
  if hf.get('attention_bias') or hf.get('mlp_bias'):
    raise ValueError('attention_bias / mlp_bias (biases on every projection) are not supported; '
                     'only the Q/K/V biases of Qwen2')
  if hf.get('hidden_act', 'silu') != 'silu':
    raise ValueError(f'activation {hf["hidden_act"]!r} is not supported (SiLU only)')
  window = hf.get('sliding_window')
  if window and (arch == 'mistral' or hf.get('use_sliding_window')):
    warnings.warn(f'sliding-window attention ({window}) is not implemented: outputs are exact '
                  f'only while the context stays within {window} tokens')
  n = hf['num_attention_heads']
  return LlamaConfig(
      vocab_size=hf['vocab_size'], num_layers=hf['num_hidden_layers'],
      embed_dim=hf['hidden_size'], mlp_dim=hf['intermediate_size'], num_heads=n,
      num_kv_heads=hf.get('num_key_value_heads') or n,
      head_dim=hf.get('head_dim') or hf['hidden_size'] // n,
      rope_theta=float(rope.get('rope_theta', hf.get('rope_theta', 10000.0))),
      norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
      qkv_bias=arch == 'qwen2', qk_norm=arch == 'qwen3', dtype=dtype,
      context_length=hf.get('max_position_embeddings'), **scaling)


def _gemma3_rope(hf: dict) -> tuple[float, float, float]:
  """(local theta, global theta, global linear factor) from either config layout:
  transformers 5's `rope_parameters` per layer type, or 4.x's `rope_theta`,
  `rope_local_base_freq` and `rope_scaling`."""
  params = hf.get('rope_parameters') or {}
  if 'full_attention' in params:
    local, full = params.get('sliding_attention') or {}, params['full_attention']
  else:
    local = {'rope_theta': hf.get('rope_local_base_freq', 10000.0)}
    full = dict(hf.get('rope_scaling') or {}, rope_theta=hf.get('rope_theta', 1e6))
  kinds = (local.get('rope_type', local.get('type', 'default')),
           full.get('rope_type', full.get('type', 'default')))
  if kinds[0] != 'default' or kinds[1] not in ('default', 'linear'):
    raise ValueError(f'Gemma 3 RoPE (local, global) = {kinds} is not supported; only default '
                     'local and default or linear global RoPE')
  factor = float(full.get('factor', 1.0)) if kinds[1] == 'linear' else 1.0
  return float(local.get('rope_theta', 10000.0)), float(full.get('rope_theta', 1e6)), factor


def gemma3_config_from_hf(hf: dict, dtype: str = 'float32') -> Gemma3Config:
  """Maps a `Gemma3ForCausalLM` (`gemma3_text`) `config.json` dict to a Gemma3Config.

  Raises:
    ValueError: untied embeddings, biases, bidirectional attention, an activation other than
      GELU-tanh, or `layer_types` that are not one global layer every k-th.
  """
  if hf.get('attention_bias') or hf.get('use_bidirectional_attention'):
    raise ValueError('Gemma 3 with attention_bias or bidirectional attention is not supported')
  if not hf.get('tie_word_embeddings', True):
    raise ValueError('Gemma 3 with untied embeddings is not supported')
  act = hf.get('hidden_activation') or hf.get('hidden_act') or 'gelu_pytorch_tanh'
  if act != 'gelu_pytorch_tanh':
    raise ValueError(f'activation {act!r} is not supported (gelu_pytorch_tanh only)')
  n_layers = hf['num_hidden_layers']
  every = int(hf.get('sliding_window_pattern') or hf.get('_sliding_window_pattern') or 6)
  types = hf.get('layer_types')
  if types:
    every = types.index('full_attention') + 1 if 'full_attention' in types else n_layers + 1
  expected = ['full_attention' if (i + 1) % every == 0 else 'sliding_attention'
              for i in range(n_layers)]
  if types and list(types) != expected:
    raise ValueError(f'layer_types {types} are not one full_attention layer every {every}')
  local, full, factor = _gemma3_rope(hf)
  n = hf['num_attention_heads']
  return Gemma3Config(
      vocab_size=hf['vocab_size'], num_layers=n_layers, embed_dim=hf['hidden_size'],
      mlp_dim=hf['intermediate_size'], num_heads=n, num_kv_heads=hf.get('num_key_value_heads') or n,
      head_dim=hf.get('head_dim') or hf['hidden_size'] // n,
      query_pre_attn_scalar=float(hf.get('query_pre_attn_scalar', 256)),
      sliding_window=int(hf.get('sliding_window') or 4096), global_every=every,
      rope_theta_local=local, rope_theta_global=full, rope_scale_global=factor,
      norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      final_logit_softcap=hf.get('final_logit_softcapping'),
      attn_logit_softcap=hf.get('attn_logit_softcapping'), dtype=dtype,
      context_length=hf.get('max_position_embeddings'))


def _tensor_files(directory: str) -> dict[str, str]:
  """Tensor name -> safetensors file, from the index or the single `model.safetensors`."""
  index = os.path.join(directory, 'model.safetensors.index.json')
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)['weight_map']
    return {name: os.path.join(directory, file) for name, file in weight_map.items()}
  single = os.path.join(directory, 'model.safetensors')
  if not os.path.isfile(single):
    raise FileNotFoundError(f'no model.safetensors or model.safetensors.index.json in {directory}')
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(single, 'numpy') as f:
    return {name: single for name in f.keys()}


def _gemma3_names(config: Gemma3Config) -> dict[tuple[str, ...], tuple[str, str]]:
  """Our Gemma 3 param path -> (Hugging Face tensor name, layout); norms are `plus_one`."""
  names = {('embed', 'embedding'): ('model.embed_tokens.weight', 'copy'),
           ('final_norm', 'scale'): ('model.norm.weight', 'plus_one')}
  norms = {'attn_norm': 'input_layernorm', 'post_attn_norm': 'post_attention_layernorm',
           'mlp_norm': 'pre_feedforward_layernorm', 'post_mlp_norm': 'post_feedforward_layernorm'}
  for i in range(config.num_layers):
    ours, hf = f'layers_{i}', f'model.layers.{i}.'
    for our_norm, hf_norm in norms.items():
      names[(ours, our_norm, 'scale')] = (hf + f'{hf_norm}.weight', 'plus_one')
    for p in 'qkv':
      names[(ours, 'attn', p, 'kernel')] = (hf + f'self_attn.{p}_proj.weight', 'heads_in')
    names[(ours, 'attn', 'o', 'kernel')] = (hf + 'self_attn.o_proj.weight', 'heads_out')
    for p in 'qk':
      names[(ours, 'attn', f'{p}_norm', 'scale')] = (hf + f'self_attn.{p}_norm.weight', 'plus_one')
    for p in ('gate', 'up', 'down'):
      names[(ours, 'mlp', p, 'kernel')] = (hf + f'mlp.{p}_proj.weight', 'T')
  return names


def _hf_names(config) -> dict[tuple[str, ...], tuple[str, str]]:
  """Our param path -> (Hugging Face tensor name, layout)."""
  if isinstance(config, Gemma3Config):
    return _gemma3_names(config)
  names = {('embed', 'embedding'): ('model.embed_tokens.weight', 'copy'),
           ('final_norm', 'scale'): ('model.norm.weight', 'copy')}
  if not config.tie_embeddings:
    names[('lm_head', 'kernel')] = ('lm_head.weight', 'T')
  for i in range(config.num_layers):
    ours, hf = f'layers_{i}', f'model.layers.{i}.'
    names[(ours, 'attn_norm', 'scale')] = (hf + 'input_layernorm.weight', 'copy')
    names[(ours, 'mlp_norm', 'scale')] = (hf + 'post_attention_layernorm.weight', 'copy')
    for p in 'qkv':
      names[(ours, 'attn', p, 'kernel')] = (hf + f'self_attn.{p}_proj.weight', 'heads_in')
      if config.qkv_bias:
        names[(ours, 'attn', p, 'bias')] = (hf + f'self_attn.{p}_proj.bias', 'heads')
    if config.qk_norm:
      for p in 'qk':
        names[(ours, 'attn', f'{p}_norm', 'scale')] = (hf + f'self_attn.{p}_norm.weight', 'copy')
    names[(ours, 'attn', 'o', 'kernel')] = (hf + 'self_attn.o_proj.weight', 'heads_out')
    for p in ('gate', 'up', 'down'):
      names[(ours, 'mlp', p, 'kernel')] = (hf + f'mlp.{p}_proj.weight', 'T')
  return names


def _hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if layout in ('copy', 'plus_one'):
    return shape
  if layout == 'T':
    return shape[::-1]
  if layout == 'heads_in':  # ours [D, N, H], theirs [N*H, D]
    return (shape[1] * shape[2], shape[0])
  if layout == 'heads_out':  # ours [N, H, D], theirs [D, N*H]
    return (shape[2], shape[0] * shape[1])
  return (shape[0] * shape[1],)  # 'heads': ours [N, H], theirs [N*H]


def _read(tensor, layout: str, shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
  """Reads the slice `index` of our array from a safetensors slice `tensor` (their layout)."""
  r = [range(*s.indices(n)) for s, n in zip(index, shape)]
  if layout in ('copy', 'plus_one'):
    part = tensor[tuple(slice(x.start, x.stop) for x in r)]
    return part.astype(np.float32) + 1 if layout == 'plus_one' else part
  if layout == 'T':
    return tensor[r[1].start:r[1].stop, r[0].start:r[0].stop].T
  h = shape[2] if layout == 'heads_in' else shape[1]  # head_dim
  if layout == 'heads_in':
    rows = tensor[r[1].start * h:r[1].stop * h, r[0].start:r[0].stop]
    out = rows.reshape(len(r[1]), h, len(r[0])).transpose(2, 0, 1)
    return out[:, :, r[2].start:r[2].stop]
  if layout == 'heads_out':
    cols = tensor[r[2].start:r[2].stop, r[0].start * h:r[0].stop * h]
    out = cols.reshape(len(r[2]), len(r[0]), h).transpose(1, 2, 0)
    return out[:, r[1].start:r[1].stop]
  return tensor[r[0].start * h:r[0].stop * h].reshape(len(r[0]), h)[:, r[1].start:r[1].stop]


def abstract_params(config) -> Any:
  """`jax.ShapeDtypeStruct` pytree of `init_params(config)` (no memory allocated)."""
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def _to_hf(x: np.ndarray, layout: str) -> np.ndarray:
  """Our array -> Hugging Face layout (the inverse of `_read` on the whole array)."""
  if layout == 'T':
    x = x.T
  elif layout == 'plus_one':
    x = x - 1
  elif layout == 'heads_in':
    x = x.transpose(1, 2, 0).reshape(-1, x.shape[0])
  elif layout == 'heads_out':
    x = x.transpose(2, 0, 1).reshape(x.shape[2], -1)
  elif layout == 'heads':
    x = x.reshape(-1)
  return np.ascontiguousarray(x)


def _path(keys) -> tuple[str, ...]:
  return tuple(getattr(k, 'key', getattr(k, 'name', k)) for k in keys)


def load_hf(directory: str, *, dtype: str = 'float32', mesh: jax.sharding.Mesh | None = None,
            rules: sh.Rules = sh.DEFAULT_RULES) -> tuple[LlamaConfig, Any]:
  """Loads a Hugging Face Llama-family checkpoint directory, each tensor straight onto devices.

  Args:
    directory: holds `config.json` and `model.safetensors`, or several safetensors files with
      `model.safetensors.index.json`.
    dtype: our parameter dtype ('float32' on CPU, 'bfloat16' on accelerators); norm scales stay
      float32. Values are cast from the file's dtype.
    mesh: place every param with its `rules` sharding on this mesh (each device reads only its
      slice). None: everything on the first local device.
  Returns:
    (config, params) with params matching `models.llama.init_params(config)`.
  Raises:
    FileNotFoundError: a missing directory, config.json or safetensors file.
    ValueError: an unsupported architecture, a missing tensor, or a tensor of the wrong shape.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  config = config_from_hf(read_config(directory), dtype)
  files = _tensor_files(directory)
  names = _hf_names(config)
  abstract = abstract_params(config)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
  else:
    shardings = sh.named_shardings(logical_axes(config), abstract, mesh, rules)
  handles = {}
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  out = []
  for (keys, leaf), sharding in zip(leaves, jax.tree.leaves(shardings)):
    name, layout = names[_path(keys)]
    if name not in files:
      raise ValueError(f'tensor {name!r} is missing from the checkpoint in {directory}')
    if not os.path.isfile(files[name]):
      raise FileNotFoundError(f'{files[name]} (listed in the index) is missing')
    if files[name] not in handles:
      handles[files[name]] = safe_open(files[name], 'numpy')
    tensor = handles[files[name]].get_slice(name)
    want = _hf_shape(layout, leaf.shape)
    if tuple(tensor.get_shape()) != want:
      raise ValueError(f'tensor {name!r} has shape {tuple(tensor.get_shape())}, expected {want} '
                       f'for this config.json')
    out.append(_place(tensor, layout, leaf, sharding))
  return config, jax.tree.unflatten(treedef, out)


def _place(tensor, layout, leaf, sharding) -> jax.Array:
  """One param as a global array; each distinct device slice is read from the file once."""
  read = {}

  def callback(index):
    key = tuple(s.indices(n) for s, n in zip(index, leaf.shape))
    if key not in read:
      read[key] = _read(tensor, layout, leaf.shape, index).astype(leaf.dtype)
    return read[key]

  return jax.make_array_from_callback(leaf.shape, sharding, callback)


def save_hf(config: LlamaConfig, params: Any, directory: str, *,
            max_position_embeddings: int | None = None, bos_token_id: int | None = None,
            eos_token_id: int | None = None) -> None:
  """Writes a Hugging Face checkpoint directory (config.json + model.safetensors).

  `LlamaForCausalLM` (or `Qwen2ForCausalLM` when the config has Q/K/V biases), loadable with
  `transformers.AutoModelForCausalLM.from_pretrained(directory)`, e.g. as `assistant_model`.
  Tensors keep their dtypes (kernels in `config.dtype`, norm scales float32); a tied head is not
  written (transformers ties it). Gathers each param to the host, one at a time.

  Raises:
    ValueError: params do not match `config`, or a Gemma 3 / Qwen3 / RoPE-scaled config (not
      written yet).
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  if (isinstance(config, Gemma3Config) or config.qk_norm
      or config.rope_scaling_factor != 1.0):
    raise ValueError('save_hf writes Llama and Qwen2 configs only (no Gemma 3, QK-norm or RoPE '
                     'scaling)')
  abstract = abstract_params(config)
  if jax.tree.structure(abstract) != jax.tree.structure(params):
    raise ValueError('params do not match the config (different parameter tree)')
  names = _hf_names(config)
  tensors = {}
  for keys, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    name, layout = names[_path(keys)]
    tensors[name] = _to_hf(np.asarray(jax.device_get(x)), layout)
  arch = 'Qwen2ForCausalLM' if config.qkv_bias else 'LlamaForCausalLM'
  hf = {
      'architectures': [arch], 'model_type': 'qwen2' if config.qkv_bias else 'llama',
      'vocab_size': config.vocab_size, 'hidden_size': config.embed_dim,
      'intermediate_size': config.mlp_dim, 'num_hidden_layers': config.num_layers,
      'num_attention_heads': config.num_heads, 'num_key_value_heads': config.num_kv_heads,
      'head_dim': config.head_dim, 'hidden_act': 'silu', 'rms_norm_eps': config.norm_eps,
      'rope_theta': config.rope_theta,
      'rope_parameters': {'rope_type': 'default', 'rope_theta': config.rope_theta},
      'tie_word_embeddings': config.tie_embeddings, 'attention_bias': False, 'mlp_bias': False,
      'max_position_embeddings': max_position_embeddings or config.context_length or 4096,
      'bos_token_id': bos_token_id,
      'eos_token_id': eos_token_id, 'dtype': config.dtype, 'torch_dtype': config.dtype,
  }
  if config.qkv_bias:
    del hf['attention_bias'], hf['mlp_bias']
    hf.update(use_sliding_window=False, sliding_window=None)
  os.makedirs(directory, exist_ok=True)
  save_file(tensors, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(hf, f, indent=2)
