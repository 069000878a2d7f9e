"""Sharding by logical axis name: one rules table, a mesh from a flag, sharded params and caches.

Models name every array dimension with a logical name (`embed`, `heads`, `kv_heads`, `head_dim`,
`mlp`, `vocab`, `batch`, `seq`, `norm`); a `Rules` table maps each name to mesh axes. A mesh axis
that does not divide a dimension is dropped for that dimension (SmolLM2's 3 KV heads on
`model=4` stay replicated), so any model runs on any mesh. Nothing here imports Flax or a model:
the logical names come in as a pytree of tuples matching the params (or the cache).

The decode loop runs unchanged under a mesh: pass sharded params to `jaxspec.generate` and wrap
the target (and the draft's model) in `ShardedModel`, which pins the KV caches it creates inside
the jitted program to their sharding. XLA partitions the rest (GSPMD).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class Rules:
  """Logical axis name -> mesh axis (a name, a tuple of names, or None = replicated).

  The default is tensor parallelism over `model` (heads, KV heads, MLP, vocabulary) and data
  parallelism over `data` (batch). Mesh axes absent from the mesh are ignored.
  """

  mapping: tuple[tuple[str, MeshAxes], ...] = (
      ('batch', 'data'),
      ('embed', None),
      ('heads', 'model'),
      ('kv_heads', 'model'),
      ('head_dim', None),
      ('mlp', 'model'),
      ('vocab', 'model'),
      ('seq', None),
      ('norm', None),
  )

  def mesh_axes(self, name: str | None) -> tuple[str, ...]:
    """Mesh axes for one logical name (empty = replicated). Raises ValueError on unknown names."""
    if name is None:
      return ()
    for logical, axes in self.mapping:
      if logical == name:
        return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    raise ValueError(f'logical axis {name!r} has no sharding rule; known: '
                     f'{[n for n, _ in self.mapping]}')

  def replace(self, **updates: MeshAxes) -> Rules:
    """A copy with some names remapped, e.g. `rules.replace(embed='data')` for FSDP-style."""
    known = {n for n, _ in self.mapping}
    return Rules(tuple((n, updates.get(n, a)) for n, a in self.mapping)
                 + tuple((n, a) for n, a in updates.items() if n not in known))


DEFAULT_RULES = Rules()


def parse_mesh_spec(spec: str, rules: Rules = DEFAULT_RULES) -> tuple[tuple[str, ...],
                                                                         tuple[int, ...]]:
  """Axis names and sizes of a mesh flag value such as `'data=2,model=4'` (one size may be -1:
  all remaining devices), checked without looking at devices.

  Raises:
    ValueError: a malformed spec, sizes below 1 (other than one -1), or an axis name that no
      sharding rule of `rules` uses (it would be silently ignored).
  """
  names, sizes = [], []
  for part in spec.replace(' ', '').split(','):
    name, sep, size = part.partition('=')
    if not sep or not name or name in names:
      raise ValueError(f'bad mesh spec {spec!r}: expected distinct name=size pairs, e.g. '
                       f'"data=2,model=4"')
    try:
      sizes.append(int(size))
    except ValueError:
      raise ValueError(f'bad mesh spec {spec!r}: size {size!r} is not an integer') from None
    names.append(name)
  if sizes.count(-1) > 1 or any(s < 1 and s != -1 for s in sizes):
    raise ValueError(f'bad mesh spec {spec!r}: sizes must be >= 1, with at most one -1')
  used = sorted({a for logical, _ in rules.mapping for a in rules.mesh_axes(logical)})
  unknown = [n for n in names if n not in used]
  if unknown:
    raise ValueError(f'mesh {spec!r}: axis {unknown[0]!r} is used by no sharding rule; the '
                     f'axes are {", ".join(used)}')
  return tuple(names), tuple(sizes)


def make_mesh(spec: str | None = None, devices=None, rules: Rules = DEFAULT_RULES) -> Mesh:
  """Builds a mesh from a flag value such as `'data=2,model=4'` (`parse_mesh_spec`).

  One size may be -1 (all remaining devices). The product must equal the number of devices used
  (all of `devices`, default `jax.devices()`). None or '' gives `data=<all devices>`. Axes are
  `AxisType.Auto`, so jit propagates shardings (GSPMD).

  Raises:
    ValueError: what `parse_mesh_spec` raises, or sizes that do not match the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  names, sizes = parse_mesh_spec(spec or f'data={len(devices)}', rules)
  sizes = list(sizes)
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    if len(devices) % rest:
      raise ValueError(f'mesh {spec!r}: {len(devices)} devices are not divisible by {rest}')
    sizes[sizes.index(-1)] = len(devices) // rest
  if math.prod(sizes) != len(devices):
    raise ValueError(f'mesh {spec!r} has {math.prod(sizes)} devices but {len(devices)} are '
                     f'available; the sizes must multiply to the device count')
  auto = (jax.sharding.AxisType.Auto,) * len(names)
  return jax.make_mesh(tuple(sizes), tuple(names), axis_types=auto, devices=devices)


def _is_names(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(n, str) or n is None for n in x)


def logical_to_spec(names: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh,
                    rules: Rules = DEFAULT_RULES) -> PartitionSpec:
  """PartitionSpec for one array: each dimension gets the mesh axes its logical name maps to,
  keeping only axes that are in the mesh, unused by an earlier dimension, and that divide it.

  Raises:
    ValueError: `names` and `shape` differ in length, or a name has no rule.
  """
  if len(names) != len(shape):
    raise ValueError(f'logical axes {names} do not match an array of shape {shape}')
  used, spec = set(), []
  for name, dim in zip(names, shape):
    kept = []
    for axis in rules.mesh_axes(name):
      size = mesh.shape.get(axis)
      if size is None or axis in used or dim % (math.prod(mesh.shape[a] for a in kept) * size):
        continue
      kept.append(axis)
      used.add(axis)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def named_shardings(logical: Any, arrays: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """Pytree of `NamedSharding`s.

  Args:
    logical: pytree of logical-name tuples (e.g. `models.llama.logical_axes(config)`).
    arrays: matching pytree of anything with `.shape` (arrays, `jax.ShapeDtypeStruct`s).
  Raises:
    ValueError: the trees do not match, or a name has no rule.
  """
  return jax.tree.map(
      lambda names, x: NamedSharding(mesh, logical_to_spec(names, tuple(x.shape), mesh, rules)),
      logical, arrays, is_leaf=_is_names)


def abstract_sharded(logical: Any, abstract: Any, mesh: Mesh,
                     rules: Rules = DEFAULT_RULES) -> Any:
  """`jax.ShapeDtypeStruct`s carrying their shardings (for orbax restore and placed loading)."""
  shardings = named_shardings(logical, abstract, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract, shardings)


def shard_params(params: Any, logical_axes: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """Places a params pytree on the mesh by logical name (`jax.device_put`; same values)."""
  return jax.device_put(params, named_shardings(logical_axes, params, mesh, rules))


class FrozenTree:
  """A pytree of hashable leaves (logical-name tuples) made hashable, for static jit arguments."""

  def __init__(self, tree: Any):
    leaves, self.treedef = jax.tree.flatten(tree, is_leaf=_is_names)
    self.leaves = tuple(leaves)

  def unfreeze(self) -> Any:
    return jax.tree.unflatten(self.treedef, self.leaves)

  def __hash__(self):
    return hash((self.treedef, self.leaves))

  def __eq__(self, other):
    return (isinstance(other, FrozenTree) and self.treedef == other.treedef
            and self.leaves == other.leaves)


@dataclasses.dataclass(frozen=True)
class ShardedModel:
  """A model callable whose KV caches live sharded on `mesh`, inside or outside jit.

  Same interface as the wrapped model: `forward(params, tokens [B,T], cache, start [B]) ->
  (logits [B,T,V], cache)` and `init_cache(batch_size, buffer_len)`. The caches it creates and
  returns are constrained (`jax.lax.with_sharding_constraint`) to the shardings of
  `cache_axes` (a pytree of logical-name tuples matching the cache). Hashable, so it is a static
  jit argument like the model it wraps. Build it with `ShardedModel.wrap`.
  """

  model: Callable[..., Any]
  mesh: Mesh
  cache_axes: FrozenTree
  rules: Rules = DEFAULT_RULES

  @classmethod
  def wrap(cls, model, cache_axes: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> ShardedModel:
    return cls(model, mesh, FrozenTree(cache_axes), rules)

  def _constrain(self, cache):
    shardings = named_shardings(self.cache_axes.unfreeze(), cache, self.mesh, self.rules)
    return jax.lax.with_sharding_constraint(cache, shardings)

  def __call__(self, params, *args):
    *outputs, cache = self.model(params, *args)  # the cache is the last output of every model
    return (*outputs, self._constrain(cache))

  def with_features(self, params, tokens_BT, cache, start_B):
    """The wrapped model's `with_features` (for EAGLE-style drafts), cache constrained."""
    logits, cache, features = self.model.with_features(params, tokens_BT, cache, start_B)
    return logits, self._constrain(cache), features

  def logits(self, params, features_BTD):
    """The wrapped draft's `logits` (EAGLE-style drafts)."""
    return self.model.logits(params, features_BTD)

  def init_cache(self, batch_size: int, buffer_len: int):
    return self._constrain(self.model.init_cache(batch_size, buffer_len))


_MULTIHOST_ENV = ('JAX_COORDINATOR_ADDRESS', 'COORDINATOR_ADDRESS')


def maybe_initialize_distributed(env: Mapping[str, str] | None = None) -> bool:
  """Calls `jax.distributed.initialize()` when this process is one of several hosts.

  Detected from the standard environment: `JAX_COORDINATOR_ADDRESS` (with `JAX_NUM_PROCESSES`,
  `JAX_PROCESS_ID`), a multi-host TPU VM slice (`TPU_WORKER_HOSTNAMES` with several hosts,
  or `MEGASCALE_COORDINATOR_ADDRESS`), SLURM (`SLURM_NTASKS` > 1) or Open MPI
  (`OMPI_COMM_WORLD_SIZE` > 1); jax fills in the rest itself (on Cloud TPU from the VM
  metadata). `JAXSPEC_MULTIHOST=1` forces it, e.g. on a TPU pod slice whose environment names
  none of these. Call it before any other jax call. Returns True when it initialized.
  """
  env = os.environ if env is None else env
  coordinator = next((env[k] for k in _MULTIHOST_ENV if env.get(k)), None)
  multi = (env.get('JAXSPEC_MULTIHOST') == '1' or coordinator is not None
           or len([h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1
           or bool(env.get('MEGASCALE_COORDINATOR_ADDRESS'))
           or int(env.get('SLURM_NTASKS', '1') or 1) > 1
           or int(env.get('OMPI_COMM_WORLD_SIZE', '1') or 1) > 1)
  if not multi:
    return False
  if coordinator is not None and env.get('JAX_NUM_PROCESSES'):
    jax.distributed.initialize(coordinator_address=coordinator,
                               num_processes=int(env['JAX_NUM_PROCESSES']),
                               process_id=int(env.get('JAX_PROCESS_ID', '0')))
  else:
    jax.distributed.initialize()
  return True
