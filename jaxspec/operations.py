"""The operations view of speculative decoding: what a server sees at batch size B.

For one (method, B) `measure` gives per-request latency (time to first token, time per output
token), throughput over the batch, the memory each part holds (target params, draft params,
target KV cache, draft KV cache / state, computed from array sizes), the target's work per
committed token relative to plain decoding, and compile and prefill time apart. `stops_paying`
names the batch size where a draft's throughput falls below plain decoding's.

Target work per committed token is Leviathan et al. 2023, Theorem 3.11's total-operations factor,
measured: each verify pass runs the target on a window of W = K+1 positions, so the target
processes `passes * W / committed` positions per committed token, against 1 for plain decoding
(prefill, the same for both, excluded). On hardware where a W-token pass costs about as much as
a 1-token pass (memory bound) this extra work is free; once the batch makes the pass compute
bound it is not, which is where speculation stops paying.

A static batch: every row's answer is ready when the batch ends, so a request's latency is the
batch's end-to-end time; `ttft_s` is the prefill plus one round (the decode time over the loop's
rounds), `tpot_s` the rest over the mean answer length minus one.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from jaxspec.bench import nbytes, own_param_bytes
from jaxspec.loop import DecodeConfig, compile_generate, init_state
from jaxspec.metrics import summarize
from jaxspec.noise import row_keys


def memory_bytes(params, draft_params, prompt_tokens, prompt_lengths, *, target, draft,
                 config: DecodeConfig) -> dict:
  """Bytes each part of a decode holds, from array sizes (no allocation: `jax.eval_shape` of
  `init_state`): target_params, draft_params (only the arrays that are not the target's),
  target_kv_cache, draft_state (the draft's own KV cache, EAGLE's feature window; 0 for a shared
  cache or n-gram lookup) and token_buffer `[B,S]`. prompt_tokens `[B,P]` int32, lengths `[B]`."""
  keys = row_keys(np.zeros(len(prompt_lengths), np.int64))
  state = jax.eval_shape(functools.partial(init_state, target=target, draft=draft,
                                           config=config),
                         params, draft_params, prompt_tokens, prompt_lengths, keys)
  return dict(target_params=nbytes(params), draft_params=own_param_bytes(draft_params, params),
              target_kv_cache=nbytes(state.target_cache), draft_state=nbytes(state.draft_state),
              token_buffer=nbytes(state.tokens))


def _timed(fn, *args, reps: int = 1):
  """(best seconds of `reps` calls, the last output); on a shared machine the best is the
  closest to the uncontended cost."""
  best = float('inf')
  for _ in range(reps):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best, out


def measure(params, draft_params, prompt_tokens, prompt_lengths, seeds, *, target, draft,
            config: DecodeConfig, reps: int = 3) -> dict:
  """One batch decoded with one configuration, measured for the operations table.

  Args:
    prompt_tokens: `[B,P]` int32 (`pad_prompts`); prompt_lengths `[B]`; seeds: B integers.
    target, draft, config: as for `jaxspec.generate` (draft None and K=0 for plain decoding).
    reps: timed runs of the decode and of the prefill (after a first, untimed one); the best.
  Returns:
    dict: batch_size, k, compile_s (the whole decode program), prefill_s (target and draft
    prefill, compiled apart), ttft_s (prefill + one mean round), tpot_s, e2e_s (the whole
    decode), tokens_per_s (committed tokens of the batch / e2e),
    new_tokens, acceptance_rate, mean_accepted_length, target_positions_per_token (window
    positions the target computed, each round's K + 1 summed, / committed tokens), rounds_by_k
    and memory (`memory_bytes`).
  Raises:
    ValueError: what `generate` raises for bad inputs.
  """
  keys = row_keys(seeds)
  statics = dict(target=target, draft=draft, config=config)
  t0 = time.perf_counter()
  run = compile_generate(params, draft_params, prompt_tokens, prompt_lengths, seeds, **statics)
  compile_s = time.perf_counter() - t0
  run(params, draft_params, prompt_tokens, prompt_lengths, keys)  # first-call allocations
  e2e_s, out = _timed(run, params, draft_params, prompt_tokens, prompt_lengths, keys, reps=reps)
  prefill = jax.jit(functools.partial(init_state, **statics))
  prefill(params, draft_params, prompt_tokens, prompt_lengths, keys)  # compile
  prefill_s, _ = _timed(prefill, params, draft_params, prompt_tokens, prompt_lengths, keys,
                        reps=reps)
  s = summarize(out.metrics)
  b = len(prompt_lengths)
  per_row = s['new_tokens'] / b
  rounds = max(int(np.max(np.asarray(out.metrics.target_forward_passes))), 1)  # loop iterations
  ttft_s = prefill_s + max(e2e_s - prefill_s, 0.0) / rounds
  return dict(
      batch_size=b, k=config.num_draft_tokens, compile_s=compile_s, prefill_s=prefill_s,
      ttft_s=ttft_s, tpot_s=max(e2e_s - ttft_s, 0.0) / max(per_row - 1, 1), e2e_s=e2e_s,
      tokens_per_s=s['new_tokens'] / e2e_s, new_tokens=s['new_tokens'],
      acceptance_rate=s['acceptance_rate'], mean_accepted_length=s['mean_accepted_length'],
      rounds_by_k=s['rounds_by_k'],
      target_positions_per_token=(sum(n * (k + 1) for k, n in enumerate(s['rounds_by_k']))
                                  / max(s['new_tokens'], 1)),
      memory=memory_bytes(params, draft_params, prompt_tokens, prompt_lengths, **statics))


def add_relative(rows: list[dict]) -> None:
  """Adds to every row (dicts with 'method', 'batch_size', 'tokens_per_s', 'tpot_s',
  'target_positions_per_token', as from `measure`) its speedup over plain decoding at the same
  batch size (throughput ratio), its latency ratio (plain TPOT / its TPOT) and its target work
  relative to plain (`target_work_vs_plain`). Rows of method 'plain' are the reference."""
  plain = {r['batch_size']: r for r in rows if r['method'] == 'plain'}
  for r in rows:
    p = plain.get(r['batch_size'])
    if p is None:
      continue
    r['speedup'] = r['tokens_per_s'] / p['tokens_per_s']
    r['latency_speedup'] = p['tpot_s'] / r['tpot_s'] if r['tpot_s'] else float('nan')
    r['target_work_vs_plain'] = (r['target_positions_per_token'] /
                                 p['target_positions_per_token'])


def stops_paying(rows: list[dict]) -> dict:
  """Per draft method: the smallest measured batch size from which on its speedup (from
  `add_relative`) stays below 1, or None if it pays at the largest batch measured. A draft that
  never pays gets the smallest batch size."""
  out = {}
  for name in sorted({r['method'] for r in rows} - {'plain'}):
    mine = sorted((r for r in rows if r['method'] == name and 'speedup' in r),
                  key=lambda r: r['batch_size'])
    stop = None
    for r in reversed(mine):
      if r['speedup'] >= 1:
        break
      stop = r['batch_size']
    out[name] = stop
  return out
