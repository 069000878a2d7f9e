"""Hugging Face Llama-family checkpoints (safetensors) in and out of `models.llama` params.

Supported: `LlamaForCausalLM` (Llama 2/3, SmolLM, TinyLlama), `MistralForCausalLM` and
`Qwen2ForCausalLM` (Q/K/V biases). Hugging Face stores linear weights as `(out, in)`; ours are
`(in, out)`, with Q/K/V kernels `[D, N, H]` and the output kernel `[N, H, D]`. Both use the
`rotate_half` RoPE, so no row permutation is needed (unlike GGUF).

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
from models.llama import LlamaConfig, init_params, logical_axes

ARCHITECTURES = {'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'mistral',
                 'Qwen2ForCausalLM': 'qwen2'}


def read_config(directory: str) -> dict:
  """The parsed `config.json` of a checkpoint directory. Raises FileNotFoundError."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'checkpoint directory not found: {directory}')
  path = os.path.join(directory, 'config.json')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} is missing: not a Hugging Face checkpoint directory')
  with open(path) as f:
    return json.load(f)


def config_from_hf(hf: dict, dtype: str = 'float32') -> LlamaConfig:
  """Maps a Hugging Face `config.json` dict to a LlamaConfig.

  Raises:
    ValueError: an unsupported architecture or feature (RoPE scaling, biases on the output or
      MLP projections, an activation other than SiLU).
  """
  archs = hf.get('architectures') or []
  arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
  if arch is None:
    raise ValueError(f'unsupported architecture {archs or hf.get("model_type")!r}; supported: '
                     f'{sorted(ARCHITECTURES)}')
  rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
  rope_type = rope.get('rope_type', rope.get('type', 'default'))
  if rope_type != 'default':
    raise ValueError(f'RoPE scaling {rope_type!r} is not supported (only default RoPE)')
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
      qkv_bias=arch == 'qwen2', dtype=dtype,
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


def _hf_names(config: LlamaConfig) -> dict[tuple[str, ...], tuple[str, str]]:
  """Our param path -> (Hugging Face tensor name, layout)."""
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
    names[(ours, 'attn', 'o', 'kernel')] = (hf + 'self_attn.o_proj.weight', 'heads_out')
    for p in ('gate', 'up', 'down'):
      names[(ours, 'mlp', p, 'kernel')] = (hf + f'mlp.{p}_proj.weight', 'T')
  return names


def _hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if layout == 'copy':
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
  if layout == 'copy':
    return tensor[tuple(slice(x.start, x.stop) for x in r)]
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


def abstract_params(config: LlamaConfig) -> Any:
  """`jax.ShapeDtypeStruct` pytree of `init_params(config)` (no memory allocated)."""
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def _to_hf(x: np.ndarray, layout: str) -> np.ndarray:
  """Our array -> Hugging Face layout (the inverse of `_read` on the whole array)."""
  if layout == 'T':
    x = x.T
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
    ValueError: params do not match `config`.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
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
