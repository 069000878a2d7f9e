"""Timing primitives and benchmark-only drafts for the `scripts/bench_*.py` and
`scripts/benchmark.py` measurements, and for `jaxspec.schedule.measure_round_costs` (the round
costs an adaptive K is chosen from).

Every timed job is a jitted function whose loop (`lax.fori_loop`) runs inside one compiled
program, so no per-step dispatch is in the time. Models are `jaxspec.contracts.Model` callables
(`forward(params, tokens [B,T], cache, start [B]) -> (logits [B,T,V], cache)`), as everywhere in
`jaxspec`.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import noise
from jaxspec.contracts import Draft
from jaxspec.drafts import FeatureDraft, ModelDraft
from jaxspec.loop import speculative_step


@dataclasses.dataclass(frozen=True)
class AlphaDraft(Draft):
  """Benchmark-only draft with a set acceptance rate: it runs a real draft model (so it costs
  what a draft of that shape costs) but proposes `params['ref'][b, position]`, the target's own
  greedy token there, with probability `params['alpha']`, else `ref + 1` (never the greedy token).
  `ref` `[B, S]` int32 comes from a plain greedy run; `alpha` is a float32 scalar (an array, so
  every alpha shares one compile); `params['model']` are the draft model's params. Under greedy
  verification each drafted token is then accepted with probability alpha, given the ones before
  it were."""

  forward: object
  coin_stream = 100  # a noise stream of its own (jaxspec.noise)

  def init(self, params, prefill):
    return ModelDraft(self.forward).init(params['model'], prefill)

  def propose(self, params, state, ctx):
    proposal = ModelDraft(self.forward).propose(params['model'], state, ctx)
    ref = params['ref']
    positions = jnp.minimum(ctx.lengths[:, None] + jnp.arange(ctx.num_draft_tokens),
                            ref.shape[1] - 1)
    right = jnp.take_along_axis(ref, positions, axis=1)
    coin = noise.uniform(ctx.keys, self.coin_stream, positions) < params['alpha']
    tokens = jnp.where(coin, right, (right + 1) % ctx.vocab_size)
    # Never true; keeps the draft model's work alive (XLA cannot prove it dead).
    tokens = jnp.where(proposal.tokens < 0, proposal.tokens, tokens)
    return dataclasses.replace(proposal, tokens=tokens,
                               q=jax.nn.one_hot(tokens, ctx.vocab_size, dtype=jnp.float32))


def forward_loop(model, batch: int, t: int, position: int, buffer_len: int, iters: int):
  """A callable `params -> tokens [B,t]` running `iters` forwards of `t` new tokens at cache
  `position` (needs position + t <= buffer_len) in one jitted `fori_loop`, each fed the previous
  one's argmax so none is dead code. The KV cache (`buffer_len` long) is allocated once, on the
  first call, and donated from call to call, so a call times the forward passes only (allocating
  and zeroing a batch-16 cache inside the program cost about as much as two decode steps)."""

  @functools.partial(jax.jit, donate_argnums=1)
  def run(params, cache):
    start = jnp.full((batch,), position, jnp.int32)

    def body(_, carry):
      tokens, cache = carry
      logits, cache = model(params, tokens, cache, start)
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return jnp.broadcast_to(nxt[:, None], (batch, t)), cache

    return jax.lax.fori_loop(0, iters, body, (jnp.zeros((batch, t), jnp.int32), cache))

  held = []

  def call(params):
    if not held:
      held.append(jax.jit(lambda: model.init_cache(batch, buffer_len))())
    tokens, held[0] = run(params, held[0])
    return tokens

  return call


def round_loop(statics: dict, iters: int, step=speculative_step):
  """A jitted `(state, target_params, draft_params) -> (tokens [B,S], metrics)` running `iters`
  rounds of `step` (`speculative_step`, or `jaxspec.loop.decode_step` for rounds under a
  schedule) in one fori_loop; `statics` holds its `target`, `draft` and `config`. The metrics
  (`jaxspec.metrics.Metrics`) count what those rounds drafted and accepted."""
  def run(s, tp, dp):
    s = jax.lax.fori_loop(0, iters, lambda _, s: step(s, tp, dp, **statics), s)
    return s.tokens, s.metrics
  return jax.jit(run)


def timed(fn, *args, reps: int = 5) -> float:
  """Best wall time (s) of `fn(*args)` over `reps` runs, after one warm-up (compile) run. The
  minimum, not the median: on a shared machine it is the closest to the uncontended cost."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return min(times)


def timed_sweeps(jobs: dict, reps: int = 5, seed: int = 0, warm_up: bool = True) -> dict:
  """Wall seconds of every call of each `name: (fn, args)`, `{name: [reps] floats}`, in sweeps:
  each sweep calls every job once, in an order shuffled per sweep (numpy generator of `seed`), so
  load bursts on a shared machine hit all of them alike; after one warm-up call each (skipped with
  `warm_up=False`, for jobs the caller has already run once)."""
  for fn, args in jobs.values() if warm_up else ():
    jax.block_until_ready(fn(*args))
  names, order = list(jobs), np.random.default_rng(seed)
  times = {name: [] for name in names}
  for _ in range(reps):
    for i in order.permutation(len(names)):
      fn, args = jobs[names[i]]
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[names[i]].append(time.perf_counter() - t0)
  return times


def timed_together(jobs: dict, reps: int = 5) -> dict:
  """Seconds per call of each `name: (fn, args)`, the best of `reps` calls timed in sweeps
  (`timed_sweeps`)."""
  return {name: min(t) for name, t in timed_sweeps(jobs, reps).items()}


def timed_donated(fn, state, *args, reps: int = 7):
  """Best seconds of `state = fn(state, *args)` over `reps` calls (buffers donated, fed back),
  after one warm-up (compile) call; returns (seconds, last state). The minimum, as in `timed`.
  Parameters go in `args`: closed over, they would be compile-time constants."""
  state = fn(state, *args)  # compile
  jax.block_until_ready(state)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    state = fn(state, *args)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return float(min(times)), state


def device_bandwidth(mib: int = 256, reps: int = 10) -> float:
  """Device copy bandwidth (bytes/s): `x + 1` in place (donated) over an `mib`-MiB float32 array
  reads and writes it once; the best of `reps`."""
  add = jax.jit(lambda x: x + 1, donate_argnums=0)
  x = jax.block_until_ready(add(jnp.zeros((mib * 2 ** 18,), jnp.float32)))
  nb = x.nbytes
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    x = jax.block_until_ready(add(x))
    times.append(time.perf_counter() - t0)
  return 2 * nb / min(times)


def host_copy_bandwidth(mib: int = 256, reps: int = 7) -> float:
  """Bytes/s of `np.copyto` of an `mib`-MiB float32 array, read + written bytes counted; the
  best of `reps` (+1 warm-up)."""
  src = np.ones(mib * 2 ** 18, np.float32)
  dst = np.empty_like(src)
  best = float('inf')
  for _ in range(reps + 1):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t0)
  return 2 * src.nbytes / best


def nbytes(tree) -> int:
  """Total bytes of the arrays (or `ShapeDtypeStruct`s) of a pytree."""
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def own_param_bytes(draft_params, target_params) -> int:
  """Bytes of the draft's params that are not the target's own arrays (a draft that references
  the target's embedding or blocks adds only the rest)."""
  target_ids = {id(a) for a in jax.tree.leaves(target_params)}
  return sum(a.nbytes for a in jax.tree.leaves(draft_params) if id(a) not in target_ids)


def draft_cache_bytes(draft, batch_size: int, buffer_len: int) -> int:
  """Bytes of the KV cache a draft keeps besides the target's (0 for a shared cache or none)."""
  own_cache = isinstance(draft, FeatureDraft) or (isinstance(draft, ModelDraft) and
                                                  not draft.shares_target_cache)
  if not own_cache:
    return 0
  return nbytes(jax.eval_shape(lambda: draft.forward.init_cache(batch_size, buffer_len)))
