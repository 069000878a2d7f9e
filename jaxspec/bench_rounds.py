"""The measurements of `scripts/benchmark.py`: decoding prompt by prompt with every configuration,
the pieces of a round timed on their own and inside the loop, and Leviathan et al.'s Theorem 3.8
predictions from the measured alpha and costs (`jaxspec.speedup`).

A draft entry is `(draft, draft params)`; a target is a `jaxspec.contracts.FeatureModel` where a
draft reads its features. Shapes: P prompt length (padded), B prompts.
"""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import noise, speedup
from jaxspec.bench import round_loop, timed_donated, timed_together
from jaxspec.contracts import DraftContext, Prefill, buffer_length
from jaxspec.loop import DecodeConfig, compile_generate, init_state
from jaxspec.metrics import summarize
from jaxspec.noise import row_keys
from jaxspec.sampling import SamplingConfig
from jaxspec.verify import verify_greedy


def decode_each(params, prompts, kinds: list[str], methods: dict, *, target, seed: int,
                repeats: int = 1) -> dict:
  """Decodes every prompt alone (batch 1; one compile per method for all, since they share a
  padded length) with each method, interleaved: every method is compiled and called once untimed
  (first-call allocations), then each of `repeats` sweeps runs every prompt with every method in
  turn (a burst of load on a shared machine hits all alike), and a method's time on a prompt is
  its best.

  Args:
    params: the target's params; target: its `Model`.
    prompts: (tokens `[B,P]` int32, lengths `[B]` int32); prompt i samples with seed
      `seed * 1000 + i`.
    kinds: each prompt's kind (chat, grounded, ...).
    methods: name -> (draft or None, draft params, `DecodeConfig`).
    repeats: timed sweeps, >= 1.
  Returns:
    name -> dict: temperature, k, wall_s (summed best seconds), compile_s, new_tokens,
    target_forward_passes, drafted_tokens, accepted_tokens, tokens_per_s, acceptance_rate,
    mean_accepted_length, accepted_length_histogram, by_kind {kind: tokens_per_s,
    acceptance_rate, mean_accepted_length}, peak_rss_mb (the process's, at the end), outputs
    (token lists).
  Raises:
    ValueError: repeats < 1.
  """
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1, got {repeats}')
  tokens, lengths = prompts
  batches = [(tokens[i:i + 1], lengths[i:i + 1], [seed * 1000 + i]) for i in range(len(tokens))]
  outs, walls, compile_s, _ = _run_interleaved(params, batches, methods, target=target,
                                               repeats=repeats)
  peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return {name: _decode_summary(outs[name], walls[name], kinds, methods[name][2],
                                compile_s[name], peak_rss_mb) for name in methods}


def _decode_summary(outs, walls, kinds, config, compile_s, peak_rss_mb) -> dict:
  stats = [summarize(o.metrics) for o in outs]
  total = {n: sum(s[n] for s in stats) for n in ('new_tokens', 'target_forward_passes',
                                                 'drafted_tokens', 'accepted_tokens')}
  by_kind = {}
  for kind in sorted(set(kinds)):
    sel = [i for i, x in enumerate(kinds) if x == kind]
    by_kind[kind] = _rates([stats[i] for i in sel], sum(walls[i] for i in sel))
  hist = np.sum([np.asarray(s['accepted_length_histogram']) for s in stats], 0).tolist()
  return dict(
      temperature=config.sampling.temperature, k=config.num_draft_tokens, wall_s=sum(walls),
      compile_s=compile_s, **total, **_rates(stats, sum(walls)), accepted_length_histogram=hist,
      by_kind=by_kind, peak_rss_mb=peak_rss_mb, outputs=[o.new_tokens()[0] for o in outs])


def _rates(stats, wall):
  new = sum(s['new_tokens'] for s in stats)
  return dict(tokens_per_s=new / wall,
              acceptance_rate=sum(s['accepted_tokens'] for s in stats) / max(
                  sum(s['drafted_tokens'] for s in stats), 1),
              mean_accepted_length=new / max(sum(s['target_forward_passes'] for s in stats), 1))


def time_round_parts(params, target, prompts, drafts: dict, ks, max_new_tokens: int) -> dict:
  """Seconds of the pieces of a round, at batch 1, on the first prompt, at cache position
  prompt length + max_new_tokens // 2: one target step (T=1), prefill, a verify pass of K+1
  tokens (forward + greedy verification) per K in `ks`, each draft's K-token proposal; caches
  donated and fed back. `prompts` is (tokens [B,P] int32, lengths [B]) from `pad_prompts`;
  `drafts` maps a name to (draft, draft params). Returns {'prefill_s', 'target_step_s',
  'verify_s': {K: s}, 'draft_s': {name: {K: s}}, 'round_s': `time_rounds`'s}."""
  tokens, lengths = prompts
  tok0, len0 = jnp.asarray(tokens[:1]), jnp.asarray(lengths[:1])
  buffer_len = buffer_length(tokens.shape[1], max_new_tokens, max(ks))
  pos = len0 + max_new_tokens // 2
  zero = jnp.zeros((1,), jnp.int32)
  out = {'verify_s': {}, 'draft_s': {}}
  prefill = jax.jit(lambda c, p: target(p, tok0, c, zero)[1], donate_argnums=0)
  out['prefill_s'], cache = timed_donated(prefill, target.init_cache(1, buffer_len), params,
                                          reps=3)
  step = jax.jit(lambda c, p: target(p, tok0[:, :1], c, pos - 1)[1], donate_argnums=0)
  out['target_step_s'], cache = timed_donated(step, cache, params)
  for k in ks:
    window = jnp.ones((1, k + 1), jnp.int32)

    def verify(c, p, window=window):
      logits, c = target(p, window, c, pos - 1)
      n, nxt = verify_greedy(window[:, 1:], logits)
      return c, n, nxt

    vjit = jax.jit(verify, donate_argnums=0)
    out['verify_s'][k], (cache, _, _) = timed_donated(lambda s, p: vjit(s[0], p),
                                                      (cache, None, None), params)
  buffer = jnp.pad(tok0, ((0, 0), (0, buffer_len - tok0.shape[1])))
  keys = row_keys([0])
  for name, (draft, dparams) in drafts.items():
    out['draft_s'][name] = {}
    for k in ks:
      feats = None
      if draft.uses_target_features:  # its state holds a K+1 window of target features
        _, _, feats = target.with_features(params, tok0, target.init_cache(1, buffer_len), zero)
      state = draft.init(dparams, Prefill(tok0, len0, buffer_len, k, feats))
      if draft.uses_target_features:
        state = {**state, 'start': pos - 2}

      def propose(s, c, dp, draft=draft, k=k):
        # Returns the draft tokens too, or XLA would drop the last token's head and sampling.
        ctx = DraftContext(buffer, pos, c, keys, k, SamplingConfig(temperature=0),
                           target.config.vocab_size, noise.DRAFT)
        proposal = draft.propose(dp, s, ctx)
        return proposal.state, proposal.target_cache, proposal.tokens

      pjit = jax.jit(propose, donate_argnums=(0, 1))
      out['draft_s'][name][k], (_, cache, _) = timed_donated(
          lambda st, dp: pjit(st[0], st[1], dp), (state, cache, None), dparams)
  out['round_s'] = time_rounds(params, target, (tok0, len0), drafts, ks, max_new_tokens)
  return out


def time_rounds(params, target, prompt, drafts: dict, ks, max_new_tokens: int,
                num_rounds: int = 8, reps: int = 5) -> dict:
  """Seconds per round of the real decode step (`speculative_step`, greedy) run `num_rounds`
  times in one `fori_loop` from a prefilled state: what a round costs inside `generate`, all
  included, with no per-round dispatch. Every (draft, K) is timed interleaved with the others
  (`bench.timed_together`, best of `reps`). `prompt` is (tokens [1,P], lengths [1]). Returns
  {name: {K: seconds}}; key 'plain' is the plain (K=0) step."""
  greedy = SamplingConfig(temperature=0)
  init = jax.jit(init_state, static_argnames=('target', 'draft', 'config'))
  jobs = {}
  for name, (draft, dparams) in [('plain', (None, None)), *drafts.items()]:
    for k in ks if draft is not None else [0]:
      statics = dict(target=target, draft=draft, config=DecodeConfig(
          num_draft_tokens=k, max_new_tokens=max_new_tokens, sampling=greedy))
      state = init(params, dparams, *prompt, row_keys([0]), **statics)
      jobs[(name, k)] = (round_loop(statics, num_rounds), (state, params, dparams))
  out = {}
  for (name, k), seconds in timed_together(jobs, reps=reps).items():
    out.setdefault(name, {})[k] = seconds / num_rounds
  return out


def add_theory(results: list, parts: dict, plain_tps: dict) -> dict:
  """Per (draft, temperature): alpha from each K's tokens per round, c, Theorem 3.8 and
  measured-cost predictions per K (added to each result row in place), and the K the theorem
  picks. `results` are `decode_each` rows with a 'method' key, `parts` is `time_round_parts`'s,
  `plain_tps` maps a temperature to plain decoding's tokens/s. Returns {'name@Ttemp': {alpha, c,
  best_k}}."""
  theory = {}
  for name in {r['method'] for r in results if r['method'] not in ('plain',)}:
    if name not in parts['draft_s']:
      continue
    for temp in {r['temperature'] for r in results}:
      rows = [r for r in results if r['method'] == name and r['temperature'] == temp]
      if not rows:
        continue
      alphas = [speedup.alpha_from_tokens_per_round(r['mean_accepted_length'], r['k'])
                for r in rows]
      alpha = float(np.median(alphas))
      step = parts['target_step_s']
      cs = [parts['draft_s'][name][r['k']] / r['k'] / step for r in rows]
      c = float(np.median(cs))
      for r in rows:
        k = r['k']
        r['alpha_est'] = alpha
        r['c'] = parts['draft_s'][name][k] / k / step
        r['predicted_speedup_thm38'] = speedup.theorem_speedup(alpha, k, r['c'])
        r['predicted_speedup_measured_cost'] = speedup.measured_cost_speedup(
            alpha, k, parts['draft_s'][name][k] / k, parts['verify_s'][k],
            1.0 / plain_tps[temp])
      theory[f'{name}@T{temp:g}'] = dict(alpha=alpha, c=c, best_k=speedup.best_k(alpha, c, 8))
  return theory


def time_methods(params, batches, methods: dict, *, target, repeats: int = 2) -> dict:
  """Each method compiled once and called once untimed (first-call allocations), then timed over
  the same batches, interleaved: every repeat runs every method on every batch in turn (a burst
  of load on a shared machine hits all alike), in a fresh order each time (seeded: no method
  keeps the first place or the place after the heaviest), and a method's time on a batch is its
  best; its seconds in every sweep are kept for `sweep_speedup`.

  Args:
    params: the target's params; target: its `Model`.
    batches: (tokens `[B,P]` int32, lengths `[B]`, seeds `[B]`) each, all of one shape.
    methods: name -> (draft or None, draft params, `DecodeConfig`).
  Returns:
    name -> dict: tok_s (committed tokens / summed best seconds), seconds, compile_s,
    sweep_seconds (per repeat, its seconds summed over the batches: for `sweep_speedup`),
    sweep_tok_s (committed tokens of every sweep / the seconds of every sweep), new_tokens,
    acceptance, tokens_per_pass, position_acceptance (per drafted position, None where never
    examined), rounds_by_k, tokens (every row's generated ids, batches in order),
    and per batch: batch_seconds (its best), batch_rounds (loop iterations: the most target
    passes of a row), batch_new_tokens.
  """
  outs, best, compile_s, times = _run_interleaved(params, batches, methods, target=target,
                                                  repeats=repeats)
  out = {}
  for name in methods:
    summary = _method_summary(outs[name], best[name], compile_s[name])
    sweeps = np.sum(times[name], axis=1)
    out[name] = dict(summary, sweep_seconds=[float(t) for t in sweeps],
                     sweep_tok_s=float(summary['new_tokens'] * sweeps.size / sweeps.sum()))
  return out


def sweep_speedup(run: dict, reference: dict) -> float:
  """The speed of `run` over `reference` (two `time_methods` entries of one call) over all sweeps:
  (run's tokens / its seconds summed over the sweeps) / (reference's).

  With the order shuffled between sweeps, every method runs in the same spells of a noisy
  machine, and the mean over sweeps averages them out, where a best time keeps one lucky call:
  on this 2-core VM a plain program at batch 32 took 8.3-12.6 s a call, and over 8 sweeps a
  second copy of it read x1.05 by best times, x0.96 by the median of per-sweep ratios and x0.98
  by this mean (docs/adaptive.md, run 20). Raises ValueError when the two have different numbers
  of sweeps.
  """
  mine, ref = _paired_sweeps(run, reference)
  return float((run['new_tokens'] / mine.sum()) / (reference['new_tokens'] / ref.sum()))


def sweep_speedup_error(run: dict, reference: dict) -> float:
  """The standard error of `sweep_speedup(run, reference)`, from the spread of the per-sweep
  ratios (reference's seconds / run's, tokens alike): their sample standard deviation over the
  square root of the number of sweeps; nan for one sweep. Raises ValueError as `sweep_speedup`."""
  mine, ref = _paired_sweeps(run, reference)
  if mine.size < 2:
    return float('nan')
  ratios = (run['new_tokens'] / mine) / (reference['new_tokens'] / ref)
  return float(np.std(ratios, ddof=1) / np.sqrt(ratios.size))


def pooled_reference(copies: list[dict]) -> dict:
  """One reference from several `time_methods` entries of one program timed as separate methods
  (e.g. 'plain' and 'plain again'): their seconds per sweep averaged, sweep by sweep, and their
  common tokens; for `sweep_speedup` and `sweep_speedup_error`. Every copy is a measurement of
  the same speed, so their mean halves the reference's variance with two copies; the first
  copy alone read 0.95-1.05 of the second in one run (docs/adaptive.md run 36). Raises
  ValueError when the copies committed different numbers of tokens (not one program) or were
  timed over different numbers of sweeps."""
  if not copies or len({c['new_tokens'] for c in copies}) != 1:
    raise ValueError(f'copies of one program commit the same tokens; got '
                     f'{[c["new_tokens"] for c in copies]}')
  seconds = [_paired_sweeps(c, copies[0])[0] for c in copies]
  return {'new_tokens': copies[0]['new_tokens'],
          'sweep_seconds': [float(t) for t in np.mean(seconds, axis=0)]}


def speedups_over_plain(runs: dict, copies=('plain', 'plain again')) -> dict:
  """Every run's speed-up over plain decoding and its standard error, {name: (x, se)}, by one
  rule: each copy of plain after the first over the first copy alone (their ratio is the run's
  noise), the first over itself (x1), every other run over the copies pooled
  (`pooled_reference`). `runs` is `time_methods`' answer; `copies` the names of plain's copies,
  first first. Raises KeyError when a copy is missing, ValueError as `pooled_reference`."""
  first = runs[copies[0]]
  pooled = pooled_reference([runs[c] for c in copies])
  return {name: (sweep_speedup(r, first if name in copies else pooled),
                 sweep_speedup_error(r, first if name in copies else pooled))
          for name, r in runs.items()}


def _paired_sweeps(run: dict, reference: dict):
  """The two runs' seconds per sweep, as arrays; ValueError when their numbers of sweeps differ."""
  mine, ref = np.asarray(run['sweep_seconds']), np.asarray(reference['sweep_seconds'])
  if mine.shape != ref.shape:
    raise ValueError(f'runs of different repeats: {mine.size} and {ref.size} sweeps')
  return mine, ref


def _run_interleaved(params, batches, methods: dict, *, target, repeats: int):
  """`time_methods`' and `decode_each`'s runs: (outputs {name: [per batch]}, best seconds {name:
  [per batch]}, compile seconds {name: s}, every time {name: [repeats, batches] seconds})."""
  compiled = {}
  for name, (draft, dp, config) in methods.items():
    compiled[name] = wall_time(lambda: compile_generate(
        params, dp, *batches[0], target=target, draft=draft, config=config))
  best = {name: [float('inf')] * len(batches) for name in methods}
  times = {name: np.zeros((repeats, len(batches))) for name in methods}
  outs = {name: [None] * len(batches) for name in methods}
  tokens, lengths, seeds = batches[0]
  for name, (draft, dp, _) in methods.items():  # untimed first call: its allocations
    _blocked(compiled[name][0](params, dp, tokens, lengths, row_keys(seeds)))
  names, rng = list(methods), np.random.default_rng(0)
  for r in range(repeats):
    for i, (tokens, lengths, seeds) in enumerate(batches):
      # A fresh (seeded) order for every batch of every sweep: on this 2-core VM a method timed
      # right after a heavy one read ~3% slower than the first of a sweep (docs/adaptive.md run
      # 18), and with the order only rotated each method kept its predecessor ('plain again',
      # always right after plain, read x1.06 +- 0.02 of it at batch 16 in run 21), so no method
      # keeps a place or a neighbour.
      for name in (names[j] for j in rng.permutation(len(names))):
        dp = methods[name][1]
        out, s = wall_time(lambda: _blocked(compiled[name][0](params, dp, tokens, lengths,
                                                         row_keys(seeds))))
        best[name][i], outs[name][i], times[name][r, i] = min(best[name][i], s), out, s
  return outs, best, {name: c[1] for name, c in compiled.items()}, times


def _method_summary(outs, batch_seconds, compile_s):
  metrics = [summarize(o.metrics) for o in outs]
  seconds = sum(batch_seconds)
  total = lambda key: sum(m[key] for m in metrics)
  reached, accepted = (sum(np.asarray(getattr(o.metrics, f)).sum(0) for o in outs)
                       for f in ('position_reached', 'position_accepted'))
  return {'tok_s': total('new_tokens') / seconds, 'seconds': seconds, 'compile_s': compile_s,
          'new_tokens': total('new_tokens'),
          'acceptance': (total('accepted_tokens') / total('drafted_tokens')
                         if total('drafted_tokens') else 0.0),
          'tokens_per_pass': total('new_tokens') / total('target_forward_passes'),
          'position_acceptance': [round(float(x / n), 3) if n else None
                                  for x, n in zip(accepted, reached)],
          'rounds_by_k': np.sum([m['rounds_by_k'] for m in metrics], axis=0).tolist(),
          'tokens': [t for o in outs for t in o.new_tokens()],
          'batch_seconds': list(batch_seconds),
          'batch_rounds': [max(int(np.max(np.asarray(o.metrics.target_forward_passes))), 1)
                           for o in outs],
          'batch_new_tokens': [m['new_tokens'] for m in metrics]}


def _blocked(out):
  out.tokens.block_until_ready()
  return out


def wall_time(fn):
  """(fn(), its wall seconds)."""
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0
