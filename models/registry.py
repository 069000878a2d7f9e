"""The one registry of trained draft kinds: each kind declares here its config, forward, jaxspec
wrapper, training recipe (which builds its config from the flags and initializes its params) and
Hugging Face export; nothing else dispatches on the kind.

A trained draft is saved as `draft.json` (`{"kind", "config", "info"}`) and `draft.safetensors`
(its trainable arrays and `vocab_ids`); the target's arrays are never stored, and loading
references them. `models.loading.load_draft` is the loader every script uses; it comes here for
a directory with a `draft.json`.

Shape letters: V vocabulary, W draft vocabulary, D width.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from models import draft_heads, draft_training, hf_export

Params = Any


@dataclasses.dataclass(frozen=True)
class DraftKind:
  """What one trained draft kind is.

  config: its frozen config class (a field's default is the kind's default);
  forward: `forward(target_config, draft_config)`, the model callable;
  assemble: `assemble(target_config, target_params, trainable, vocab_ids) -> params` (what the
    forward reads: trainable arrays plus references to the target's);
  reads_features, shares_target_cache: its jaxspec wrapper (`wrap`): `FeatureDraft` for a
    draft that reads the target's features, else `ModelDraft` with or without the target's cache;
  recipe: its training hook, `models.draft_training.*_recipe` (config from the flags, init of
    the trainable params from the target's, loss);
  export: `export(target_config, target_params, forward, params) -> (blocks, final norm, head)`
    for `models.hf_export.export_hf`, or None with `export_refusal` saying why;
  default_lr, default_out, default_source_layers: `scripts/train_draft.py`'s defaults.
  """

  name: str
  config: type
  forward: Callable[..., Any]
  assemble: Callable[..., Params]
  reads_features: bool
  shares_target_cache: bool
  recipe: Callable[..., draft_training.Recipe]
  export: Callable[..., Any] | None
  export_refusal: str = ''
  default_lr: float = 1e-3
  default_out: str = ''
  default_source_layers: tuple[int, ...] = ()

  def wrap(self, forward):
    """The jaxspec draft that runs `forward`: `FeatureDraft` or `ModelDraft`."""
    import jaxspec  # pylint: disable=g-import-not-at-top
    if self.reads_features:
      return jaxspec.FeatureDraft(forward)
    return jaxspec.ModelDraft(forward, shares_target_cache=self.shares_target_cache)


def _embed(target_params):
  return target_params['embed']['embedding']


KINDS: dict[str, DraftKind] = {k.name: k for k in (
    DraftKind(
        name='exit', config=draft_heads.ExitDraftConfig, forward=draft_heads.ExitDraftForward,
        assemble=lambda tc, tp, tr, ids: {'target': tp, 'adapter': tr, 'vocab_ids': ids},
        reads_features=False, shares_target_cache=True, recipe=draft_training.exit_recipe,
        export=hf_export.exit_blocks, default_lr=2e-3, default_out='drafts/smollm2_exit'),
    DraftKind(
        name='small', config=draft_heads.SmallDraftConfig, forward=draft_heads.SmallDraftForward,
        assemble=lambda tc, tp, tr, ids: {'embed': _embed(tp), **tr, 'vocab_ids': ids},
        reads_features=False, shares_target_cache=False, recipe=draft_training.small_recipe,
        export=hf_export.small_blocks, default_lr=3e-4, default_out='runs/smollm2_small',
        default_source_layers=draft_heads.SmallDraftConfig().source_layers),
    DraftKind(
        name='eagle', config=draft_heads.EagleDraftConfig, forward=draft_heads.EagleDraftForward,
        assemble=lambda tc, tp, tr, ids: {
            'embed': _embed(tp), **tr, 'vocab_ids': ids,
            'head': draft_heads.target_head_rows(tc, tp, ids)},
        reads_features=True, shares_target_cache=False, recipe=draft_training.eagle_recipe,
        export=None,
        export_refusal='it reads the target\'s hidden features, so it is not a standalone '
                       'LlamaForCausalLM and cannot be exported as one',
        default_lr=1e-3, default_out='drafts/smollm2_eagle',
        default_source_layers=(draft_heads.EagleDraftConfig().source_layer,)),
)}


def kind(name: str) -> DraftKind:
  """The registered kind `name`. Raises ValueError naming the known kinds."""
  if name not in KINDS:
    raise ValueError(f'unknown draft kind {name!r} (expected one of {", ".join(KINDS)})')
  return KINDS[name]


def _flatten(tree, prefix=''):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def _unflatten(flat):
  tree = {}
  for name, v in flat.items():
    node = tree
    *path, leaf = name.split('.')
    for p in path:
      node = node.setdefault(p, {})
    node[leaf] = v
  return tree


def save_draft(directory: str, kind_name: str, draft_config, trainable: Params, vocab_ids,
               dtype: str = 'float16', info: dict | None = None) -> None:
  """Writes `draft.json` and `draft.safetensors` (trainable arrays in `dtype`, plus vocab_ids
  `[W]` int32). Raises ValueError for an unknown kind."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  kind(kind_name)
  os.makedirs(directory, exist_ok=True)
  flat = {k: np.asarray(v, dtype) for k, v in _flatten(trainable).items()}
  flat['vocab_ids'] = np.asarray(vocab_ids, np.int32)
  save_file(flat, os.path.join(directory, 'draft.safetensors'))
  meta = {'kind': kind_name, 'config': dataclasses.asdict(draft_config), 'info': info or {}}
  with open(os.path.join(directory, 'draft.json'), 'w', encoding='utf-8') as f:
    json.dump(meta, f, indent=2)


def read_meta(directory: str) -> dict:
  """`draft.json` of a saved draft. Raises FileNotFoundError when there is none."""
  with open(os.path.join(directory, 'draft.json'), encoding='utf-8') as f:
    return json.load(f)


def read_trainable(directory: str):
  """`(draft.json as a dict, trainable params (float32 pytree), vocab_ids [W] int32)` of a draft
  saved by `save_draft`, e.g. to continue training it. Raises FileNotFoundError / ValueError
  (unknown kind) with the reason."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  meta = read_meta(directory)
  try:
    kind(meta['kind'])
  except ValueError as e:
    raise ValueError(f'{directory}: {e}') from None
  flat = load_file(os.path.join(directory, 'draft.safetensors'))
  vocab_ids = flat.pop('vocab_ids').astype(np.int32)
  return meta, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), _unflatten(flat)), vocab_ids


def _load(directory, target_config, target_params):
  """(kind, forward, params) of a saved draft."""
  meta, trainable, vocab_ids = read_trainable(directory)
  k, vocab_ids = kind(meta['kind']), jnp.asarray(vocab_ids)
  cfg = {n: tuple(v) if isinstance(v, list) else v for n, v in meta['config'].items()}
  forward = k.forward(target_config, k.config(**cfg))
  return k, forward, k.assemble(target_config, target_params, trainable, vocab_ids)


def load_draft(directory: str, target_config, target_params):
  """Returns `(forward, params, shares_target_cache)` for a draft saved by `save_draft`; params
  reference the target's arrays (the trainable ones are float32). Raises FileNotFoundError /
  ValueError (unknown kind) with the reason."""
  k, forward, params = _load(directory, target_config, target_params)
  return forward, params, k.shares_target_cache


def load_trained_draft(directory: str, target_config, target_params, mesh=None):
  """`(jaxspec draft, draft params)` for a draft saved by `save_draft` (the form
  `models.loading.load_draft` returns). With a mesh the small arrays stay replicated; the
  target's arrays keep their own placement."""
  del mesh
  k, forward, params = _load(directory, target_config, target_params)
  return k.wrap(forward), params


def export_hf_draft(directory: str, out_dir: str, target_config, target_params) -> int:
  """Writes the draft at `directory` as a Hugging Face `LlamaForCausalLM` in `out_dir`; returns
  its layer count. Raises ValueError for a kind that cannot be exported, saying why."""
  k, forward, dparams = _load(directory, target_config, target_params)
  if k.export is None:
    raise ValueError(f'{directory} is an {k.name} draft: {k.export_refusal}')
  blocks, final_norm, head = k.export(target_config, target_params, forward, dparams)
  return hf_export.export_hf(out_dir, target_config, target_params, blocks, final_norm, head,
                             dparams['vocab_ids'])
