"""Sharded decoding equals single-device decoding, token for token, on 8 fake CPU devices.

The fake devices need `XLA_FLAGS=--xla_force_host_platform_device_count=8` before jax is
imported, so the sharded runs happen in a subprocess (`python tests/test_sharding.py`), which
prints one JSON line that the tests below assert on.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Greedy on every mesh, sampled on the mixed data + tensor parallel one (each mode is a separate
# compile of the whole decode loop, ~5 s each on a CPU, so the suite stays fast).
MESHES = {'data=2,model=4': ('greedy', 'sampled'), 'data=1,model=8': ('greedy',),
          'data=8': ('greedy',)}
PROMPTS = [[1, 2, 3], [5, 9, 11, 13, 2], [7], [4, 8, 15, 16, 23, 42], [3, 3, 3], [100, 1],
           [9, 8, 7, 6, 5, 4, 3], [64]]


def run_worker(script: str, *args: str, timeout: float = 240) -> dict:
  """Runs `python script *args` (a test file with a `__main__` worker) on 8 fake CPU devices;
  returns its last stdout line parsed as JSON. Fails the test with the worker's stderr on error."""
  # Lower XLA:CPU optimization: the workers compile several small programs and run them briefly,
  # so compile time dominates; single-device and sharded runs share the flags.
  flags = ('--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 '
           '--xla_llvm_disable_expensive_passes=true')
  env = dict(os.environ, XLA_FLAGS=flags,
             JAX_PLATFORMS='cpu', PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  proc = subprocess.run([sys.executable, script, *args], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)
  if proc.returncode:
    pytest.fail(f'worker {script} failed ({proc.returncode}):\n{proc.stderr[-4000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def worker():
  return run_worker(os.path.abspath(__file__))


def test_eight_devices(worker):
  assert worker['num_devices'] == 8


@pytest.mark.parametrize('mesh,mode', [(m, mode) for m, modes in MESHES.items() for mode in modes])
def test_sharded_output_identical(worker, mesh, mode):
  single = worker['single'][mode]
  sharded = worker['sharded'][mesh][mode]
  assert len(single) == len(PROMPTS) and all(len(row) == 12 for row in single)
  assert len({tuple(row) for row in single}) == len(PROMPTS)  # rows really differ
  assert sharded == single  # exact token equality, every row


def test_sampled_differs_from_greedy(worker):
  assert worker['single']['sampled'] != worker['single']['greedy']  # the sampled path is real


def test_params_really_sharded(worker):
  specs = worker['sharded']['data=2,model=4']['specs']
  assert specs['q'] == [None, 'model', None]   # 8 heads over model=4
  assert specs['k'] == [None, None, None]      # 2 KV heads: model=4 does not divide, replicated
  assert specs['o'] == ['model', None, None]
  assert specs['up'] == [None, 'model']
  assert specs['down'] == ['model', None]
  assert specs['embed'] == ['model', None]     # vocab 128 over model=4
  assert specs['norm'] == [None]
  assert specs['cache'] == ['data', None, None, None]  # batch over data, kv heads replicated
  specs8 = worker['sharded']['data=1,model=8']['specs']
  assert specs8['q'] == [None, 'model', None] and specs8['up'] == [None, 'model']
  assert specs8['shard_shape_q'] == [32, 1, 8]  # each device holds one of the 8 heads
  specs_dp = worker['sharded']['data=8']['specs']
  assert specs_dp['cache'] == ['data', None, None, None]  # 8 rows, one per device
  assert specs_dp['q'] == [None, None, None]  # no model axis: weights replicated


def test_rules_and_mesh_parsing():
  import jax  # pylint: disable=g-import-not-at-top
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(f'data=1,model={len(jax.devices())}')
  assert mesh.axis_names == ('data', 'model')
  with pytest.raises(ValueError, match='multiply to the device count'):
    sharding.make_mesh(f'data={len(jax.devices()) + 1}')
  with pytest.raises(ValueError, match='name=size'):
    sharding.make_mesh('data2')
  with pytest.raises(ValueError, match="axis 'foo' is used by no sharding rule"):
    sharding.make_mesh('foo=1')  # would otherwise be silently ignored
  assert sharding.parse_mesh_spec('data=2,model=-1') == (('data', 'model'), (2, -1))
  with pytest.raises(ValueError, match='no sharding rule'):
    sharding.DEFAULT_RULES.mesh_axes('experts')
  rules = sharding.DEFAULT_RULES.replace(embed='data')
  assert rules.mesh_axes('embed') == ('data',) and rules.mesh_axes('mlp') == ('model',)
  assert not sharding.maybe_initialize_distributed({})
  assert not sharding.maybe_initialize_distributed({'TPU_WORKER_HOSTNAMES': 'localhost'})


def random_params(config, seed: int):
  """Random params for `models.llama` drawn with NumPy (eager Flax init costs seconds on a
  loaded CPU): kernels ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm scales ~ 1 + N(0, 0.01)."""
  import jax  # pylint: disable=g-import-not-at-top
  from models import llama  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  abstract = jax.eval_shape(lambda: llama.init_params(config, jax.random.key(0)))

  def draw(path, x):
    names = [k.key for k in path]
    if names[-1] == 'scale':
      value = 1 + 0.1 * rng.standard_normal(x.shape)
    elif names[-1] == 'embedding':
      value = rng.standard_normal(x.shape)
    else:
      fan_in = x.shape[0] * (x.shape[1] if names[-2] == 'o' else 1)
      value = rng.standard_normal(x.shape) / np.sqrt(fan_in)
    return jax.numpy.asarray(value, x.dtype)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def test_logical_to_spec_drops_axes_that_do_not_divide():
  from jax.sharding import AbstractMesh, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  from models import llama  # pylint: disable=g-import-not-at-top
  mesh = AbstractMesh((2, 4), ('data', 'model'))
  spec = lambda names, shape, rules=sharding.DEFAULT_RULES: sharding.logical_to_spec(
      names, shape, mesh, rules)
  # SmolLM2 on model=4: 9 heads and 3 KV heads stay replicated, MLP and vocabulary are split.
  assert spec(('embed', 'heads', 'head_dim'), (576, 9, 64)) == P(None, None, None)
  assert spec(('embed', 'kv_heads', 'head_dim'), (576, 3, 64)) == P(None, None, None)
  assert spec(('embed', 'mlp'), (576, 1536)) == P(None, 'model')
  assert spec(('vocab', 'embed'), (49152, 576)) == P('model', None)
  assert spec(('batch', 'seq', 'kv_heads', 'head_dim'), (6, 10, 8, 64)) == P('data', None, 'model',
                                                                             None)
  assert spec(('batch', 'seq', 'kv_heads', 'head_dim'), (3, 10, 8, 64)) == P(None, None, 'model',
                                                                             None)
  both = sharding.DEFAULT_RULES.replace(vocab=('model', 'data'))
  assert spec(('vocab', 'embed'), (64, 8), both) == P(('model', 'data'), None)
  assert spec(('vocab', 'embed'), (4, 8), both) == P('model', None)  # 4 % 8: data dropped
  with pytest.raises(ValueError, match='do not match'):
    spec(('vocab',), (4, 8))
  # The wrapper is a static jit argument: equal by value, so a rebuilt one hits the jit cache.
  config = llama.LlamaConfig.tiny()
  wrap = lambda: sharding.ShardedModel.wrap(llama.LlamaForward(config),
                                            llama.cache_logical_axes(config), mesh)
  assert wrap() == wrap() and hash(wrap()) == hash(wrap())


def _worker():
  """Runs in the 8-device subprocess: decodes on one device and on each mesh, prints JSON."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxspec as js  # pylint: disable=g-import-not-at-top
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  from models import llama  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_default_matmul_precision', 'highest')
  jax.config.update('jax_debug_key_reuse', True)

  config = llama.LlamaConfig.tiny(vocab_size=128, num_heads=8, num_kv_heads=2,
                                  tie_embeddings=False)
  draft_config = llama.LlamaConfig.tiny(vocab_size=128, num_layers=1, tie_embeddings=True)
  params = random_params(config, 0)
  draft_params = random_params(draft_config, 1)
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=8)
  modes = {'greedy': js.SamplingConfig(temperature=0),
           'sampled': js.SamplingConfig(temperature=1.0, top_k=40)}

  def decode(target, draft_model, p, dp, names=tuple(modes)):
    out = {}
    for mode in names:
      sampling = modes[mode]
      cfg = js.DecodeConfig(num_draft_tokens=3, max_new_tokens=12, sampling=sampling)
      res = js.generate(p, dp, tokens, lengths, np.full(len(lengths), 7), target=target,
                        draft=js.ModelDraft(draft_model), config=cfg)
      out[mode] = res.new_tokens()
    return out

  result = {'num_devices': len(jax.devices()),
            'single': decode(llama.LlamaForward(config), llama.LlamaForward(draft_config),
                             params, draft_params), 'sharded': {}}
  for spec, names in MESHES.items():
    mesh = sharding.make_mesh(spec)
    target = sharding.ShardedModel.wrap(llama.LlamaForward(config),
                                        llama.cache_logical_axes(config), mesh)
    draft = sharding.ShardedModel.wrap(llama.LlamaForward(draft_config),
                                       llama.cache_logical_axes(draft_config), mesh)
    sp = sharding.shard_params(params, llama.logical_axes(config), mesh)
    sdp = sharding.shard_params(draft_params, llama.logical_axes(draft_config), mesh)
    out = decode(target, draft, sp, sdp, names)
    cache = jax.jit(target.init_cache, static_argnums=(0, 1))(len(PROMPTS), 16)
    spec_of = lambda x: [a if a is None or isinstance(a, str) else list(a) for a in
                         tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))]
    layer = sp['layers_0']
    out['specs'] = {
        'q': spec_of(layer['attn']['q']['kernel']), 'k': spec_of(layer['attn']['k']['kernel']),
        'o': spec_of(layer['attn']['o']['kernel']), 'up': spec_of(layer['mlp']['up']['kernel']),
        'down': spec_of(layer['mlp']['down']['kernel']), 'embed': spec_of(sp['embed']['embedding']),
        'norm': spec_of(layer['attn_norm']['scale']), 'cache': spec_of(cache[0]['k']),
        'shard_shape_q': list(layer['attn']['q']['kernel'].addressable_shards[0].data.shape)}
    result['sharded'][spec] = out
  print(json.dumps(result))


if __name__ == '__main__':
  _worker()
