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

Every batch size serves the same requests (`batches_of`), so acceptance and answer lengths are
the same work at every B and only the batching differs. Static batches: every row's answer is
ready when its batch ends, so a request's latency is its batch's end-to-end time; `ttft_s` is
the prefill plus one round (the decode time over the loop's rounds), `tpot_s` the rest over the
mean answer length minus one.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxspec import bench, bench_rounds
from jaxspec.bench import nbytes, own_param_bytes
from jaxspec.loop import DecodeConfig, init_state
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


def batches_of(prompt_tokens, prompt_lengths, seeds, batch_size: int) -> list[tuple]:
  """The requests (rows of `prompt_tokens [N,P]`, `prompt_lengths [N]`, `seeds [N]`) served in
  batches of `batch_size`: ceil(N / B) batches, the last one filled by cycling from the first
  request, so every batch size serves every request (and B > N repeats requests). Returns a list
  of (tokens `[B,P]`, lengths `[B]`, seeds `[B]`)."""
  n = len(prompt_lengths)
  out = []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size) % n
    out.append((prompt_tokens[idx], prompt_lengths[idx], np.asarray(seeds)[idx]))
  return out


def measure(params, batches, methods: dict, *, target, reps: int = 3) -> dict:
  """A set of requests decoded in batches with each method, for the operations table. The
  decodes are timed by `jaxspec.bench_rounds.time_methods` (every method compiled first, then
  interleaved: each sweep runs every method on every batch in turn, so a burst of load on a
  shared machine hits all of them alike, the order shuffled between sweeps), the prefill likewise
  (`jaxspec.bench.timed_together`, on the first batch).

  Args:
    params: the target's params; target: its `Model`.
    batches: a list of (prompt tokens `[B,P]` int32 from `pad_prompts`, prompt lengths `[B]`,
      seeds: B integers), all of one shape (`batches_of`): a static batch at a time, each batch
      run to its end before the next starts.
    methods: name -> (draft or None, draft params, `DecodeConfig`) (K=0 and no draft: plain).
    reps: timed sweeps (after a first, untimed call).
  Returns:
    name -> dict: batch_size B, num_batches, k, compile_s (the whole decode program), prefill_s
    (target and draft prefill of one batch, compiled apart), ttft_s (a request's time to first
    token: its batch's prefill plus one mean round; mean over batches), tpot_s (the rest of its
    batch's decode over the batch's mean answer length minus one; mean over batches), e2e_s
    (all batches, each its best time), tokens_per_s (committed tokens of all batches / e2e_s),
    sweep_tokens_per_s (committed tokens of all batches over every sweep / the seconds of every
    sweep: what `add_relative` compares, see `jaxspec.bench_rounds.sweep_speedup`), new_tokens,
    acceptance_rate, mean_accepted_length, target_positions_per_token (window positions the
    target computed, each round's K + 1 summed, / committed tokens), rounds_by_k,
    position_acceptance and memory (`memory_bytes` of one batch).
  Raises:
    ValueError: what `generate` raises for bad inputs.
  """
  runs = bench_rounds.time_methods(params, batches, methods, target=target, repeats=reps)
  tokens0, lengths0, seeds0 = batches[0]
  keys0 = row_keys(seeds0)
  prefills = {}
  for name, (draft, dparams, config) in methods.items():
    fn = jax.jit(functools.partial(init_state, target=target, draft=draft, config=config))
    prefills[name] = (fn, (params, dparams, tokens0, lengths0, keys0))
  prefill_s = bench.timed_together(prefills, reps=reps)
  rows = len(lengths0)
  out = {}
  for name, (draft, dparams, config) in methods.items():
    r = runs[name]
    ttft, tpot = [], []
    for e2e_b, rounds, new in zip(r['batch_seconds'], r['batch_rounds'],
                                  r['batch_new_tokens']):
      ttft.append(prefill_s[name] + max(e2e_b - prefill_s[name], 0.0) / rounds)
      tpot.append(max(e2e_b - ttft[-1], 0.0) / max(new / rows - 1, 1))
    out[name] = dict(
        batch_size=rows, num_batches=len(batches), k=config.num_draft_tokens,
        compile_s=r['compile_s'], prefill_s=prefill_s[name], ttft_s=float(np.mean(ttft)),
        tpot_s=float(np.mean(tpot)), e2e_s=r['seconds'], tokens_per_s=r['tok_s'],
        sweep_tokens_per_s=r['sweep_tok_s'],
        new_tokens=r['new_tokens'], acceptance_rate=r['acceptance'],
        mean_accepted_length=r['tokens_per_pass'], rounds_by_k=r['rounds_by_k'],
        position_acceptance=r['position_acceptance'],
        target_positions_per_token=(sum(n * (k + 1) for k, n in enumerate(r['rounds_by_k']))
                                    / max(r['new_tokens'], 1)),
        memory=memory_bytes(params, dparams, tokens0, lengths0, target=target, draft=draft,
                            config=config))
  return out


def add_relative(rows: list[dict]) -> None:
  """Adds to every row (dicts with 'method', 'batch_size', 'sweep_tokens_per_s', 'tpot_s',
  'target_positions_per_token', as from `measure`) its speedup over plain decoding at the same
  batch size (the ratio of throughputs over all sweeps, not of best times: on a noisy machine a
  best time keeps one lucky call, `jaxspec.bench_rounds.sweep_speedup`), its latency ratio
  (plain TPOT / its TPOT) and its target work relative to plain (`target_work_vs_plain`). Rows of
  method 'plain' are the reference."""
  plain = {r['batch_size']: r for r in rows if r['method'] == 'plain'}
  for r in rows:
    p = plain.get(r['batch_size'])
    if p is None:
      continue
    r['speedup'] = r['sweep_tokens_per_s'] / p['sweep_tokens_per_s']
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
