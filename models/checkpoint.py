"""Orbax checkpoints of `models.llama` params: save, and restore straight onto a mesh.

A checkpoint directory holds `jaxspec_config.json` (the LlamaConfig fields) and `params/` (an orbax
`StandardCheckpointer` tree). Restoring builds abstract arrays from the config, each carrying the
`NamedSharding` its logical axes get under the rules, so every device reads only its own shard.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax

from jaxspec import sharding as sh
from models import hf_loader
from models.llama import LlamaConfig, logical_axes

CONFIG_FILE = 'jaxspec_config.json'  # not config.json: that marks a Hugging Face directory
PARAMS_DIR = 'params'


def load_source(path: str, dtype: str = 'float32', mesh=None,
                rules: sh.Rules = sh.DEFAULT_RULES) -> tuple[LlamaConfig, Any]:
  """Loads weights from a `.gguf` file or a Hugging Face checkpoint directory.

  Raises:
    FileNotFoundError: `path` does not exist. ValueError: an unsupported model.
  """
  if os.path.isdir(path):
    return hf_loader.load_hf(path, dtype=dtype, mesh=mesh, rules=rules)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no GGUF file or Hugging Face directory at {path}')
  from models.gguf_loader import load_gguf  # pylint: disable=g-import-not-at-top
  config, params = load_gguf(path, dtype)
  if mesh is not None:
    params = sh.shard_params(params, logical_axes(config), mesh, rules)
  return config, params


def save(directory: str, config: LlamaConfig, params: Any) -> None:
  """Writes `jaxspec_config.json` and the params (orbax) under `directory` (absolute or relative).

  Raises:
    FileExistsError: `directory/params` already exists (orbax never overwrites).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(directory, PARAMS_DIR), params)
    ckptr.wait_until_finished()
  if jax.process_index() == 0:
    with open(os.path.join(directory, CONFIG_FILE), 'w') as f:
      json.dump(dataclasses.asdict(config), f, indent=2)


def read_config(directory: str) -> LlamaConfig:
  """The LlamaConfig saved with a checkpoint. Raises FileNotFoundError when it is missing."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} is missing: not a checkpoint written by models.checkpoint')
  with open(path) as f:
    return LlamaConfig(**json.load(f))


def restore(directory: str, mesh: jax.sharding.Mesh | None = None,
            rules: sh.Rules = sh.DEFAULT_RULES) -> tuple[LlamaConfig, Any]:
  """Restores (config, params); with `mesh`, each param lands sharded by its logical axes.

  Without a mesh everything lands on the first local device. Values are bit-exact.
  Raises:
    FileNotFoundError: no checkpoint at `directory`.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  directory = os.path.abspath(directory)
  config = read_config(directory)
  abstract = hf_loader.abstract_params(config)
  if mesh is None:
    mesh = sh.make_mesh('data=1', devices=jax.local_devices()[:1])
  target = sh.abstract_sharded(logical_axes(config), abstract, mesh, rules)
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(os.path.join(directory, PARAMS_DIR), target)
  return config, params
