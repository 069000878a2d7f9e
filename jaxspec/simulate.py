"""A schedule against a synthetic draft, off the machine's clock.

Timing `auto` against plain decoding on a shared CPU is noisy (two timings of the same work
differ by 5-8% on the 2-core VM of docs/adaptive.md), so whether a schedule's decisions lose 1%
or 4% cannot be read from one benchmark run. Here the schedule (`contracts.Schedule`: its own
`choose` and `update`, compiled) decides round after round against a draft whose drafted token i
is accepted with a fixed probability given the tokens before it were (independent draws), and
each round is charged the cost given for its K; tokens per unit of cost then say what the rule
itself gains or loses, with nothing else in the measurement.

`replay` does the same against a real draft instead of a synthetic one, at temperature 0: what
the n-gram draft proposes after each token of a recorded greedy decode, and how many of its
tokens the greedy target accepts, are determined by the tokens alone (`ngram_trace`), so a
schedule's decisions can be replayed on them exactly, bursts and all, with each round charged its
K's cost.

Shape letters: R runs, B batch, K largest draft length, S buffer, T generated tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import ngram
from jaxspec.metrics import Metrics


def simulate(schedule, acceptance, round_seconds, *, num_rounds: int, num_runs: int, key,
             batch_size: int = 1) -> dict:
  """Runs `schedule` for `num_rounds` rounds, `num_runs` times from its initial state (as a fresh
  `generate` call per prompt does).

  Args:
    schedule: a `contracts.Schedule` (e.g. `CostModel`, `Heuristic`).
    acceptance: `[K]` floats in [0, 1], the probability that drafted token i is accepted given
      that those before it were; K is the largest draft length.
    round_seconds: `[K+1]` positive floats, the cost of a round at K = 0..K (any unit).
    num_rounds, num_runs, batch_size: rounds per run, runs, rows (all active, all ready).
    key: PRNG key of the acceptance draws.
  Returns:
    {'speedup': tokens per unit of cost over plain decoding's (batch_size / round_seconds[0]),
    'rounds_by_k': mean rounds per run at K = 0..K (a list), 'acceptance': accepted / drafted}.
  Raises:
    ValueError: round_seconds not of length K+1 or not positive, acceptance outside [0, 1].
  """
  alpha = np.asarray(acceptance, np.float32)
  k_max = len(alpha)
  costs = np.asarray(round_seconds, np.float64)
  if costs.shape != (k_max + 1,) or not (costs > 0).all():
    raise ValueError(f'round_seconds must be {k_max + 1} positive costs (K = 0..{k_max}), got '
                     f'{tuple(round_seconds)}')
  if not ((alpha >= 0) & (alpha <= 1)).all():
    raise ValueError(f'acceptance must lie in [0, 1], got {tuple(acceptance)}')
  branches = schedule.branches(k_max)
  branch_costs = jnp.asarray(costs[np.array(branches)], jnp.float32)
  active = jnp.ones((batch_size,), bool)

  def one_round(carry, uniform_BK):
    state, metrics, cost, tokens = carry
    index = schedule.choose(state, active, active)
    leading = jnp.cumprod(uniform_BK < alpha, axis=1).sum(1)  # drafted tokens a row would accept

    def at(k):
      def run(metrics):
        accepted = jnp.minimum(leading, k).astype(jnp.int32)
        return metrics.update(active, jnp.full((batch_size,), k, jnp.int32), accepted,
                              accepted + 1, k), jnp.sum(accepted + 1)
      return run

    after, committed = jax.lax.switch(index, [at(k) for k in branches], metrics)
    state = schedule.update(state, metrics, after, active, active)
    return (state, after, cost + branch_costs[index], tokens + committed), None

  @jax.jit
  def one_run(key):
    carry = (schedule.init(batch_size, k_max), Metrics.zeros(batch_size, k_max),
             jnp.float32(0), jnp.int32(0))
    draws = jax.random.uniform(key, (num_rounds, batch_size, k_max))
    (_, metrics, cost, tokens), _ = jax.lax.scan(one_round, carry, draws)
    return cost, tokens, metrics.rounds_by_k.sum(0), metrics.drafted.sum(), metrics.accepted.sum()

  cost, tokens, rounds_by_k, drafted, accepted = jax.vmap(one_run)(
      jax.random.split(key, num_runs))
  plain_rate = batch_size / costs[0]
  return {'speedup': float(np.sum(tokens) / np.asarray(cost, np.float64).sum()) / plain_rate,
          'rounds_by_k': (np.asarray(rounds_by_k).sum(0) / num_runs / batch_size).tolist(),
          'acceptance': float(np.sum(accepted) / max(int(np.sum(drafted)), 1))}


@dataclasses.dataclass(frozen=True)
class Fixed:
  """The schedule of a fixed K (a `contracts.Schedule` with one branch), to replay beside others."""

  num_draft_tokens: int

  def branches(self, max_draft_tokens: int) -> tuple[int, ...]:
    del max_draft_tokens
    return (self.num_draft_tokens,)

  def init(self, batch_size: int, max_draft_tokens: int):
    del batch_size, max_draft_tokens
    return jnp.int32(0)

  def choose(self, state, active, ready):
    del active, ready
    return state

  def update(self, state, before, after, active, ready):
    del before, after, active, ready
    return state


def ngram_trace(tokens, prompt_length: int, length: int, *, num_draft_tokens: int,
                max_ngram: int, min_ngram: int = 1):
  """The n-gram draft's proposal after each generated token of a recorded greedy decode, and how
  many of its tokens the greedy target accepts.

  Args:
    tokens: `[S]` int32, the decode's buffer: the prompt, then the generated tokens.
    prompt_length: P; length: L, P plus the generated tokens, P < L <= S.
    num_draft_tokens: K; max_ngram, min_ngram: as `ngram.lookup`.
  Returns:
    (ready `[T]` bool, leading `[T]` int32), T = L - P: after t generated tokens, whether the
    lookup finds a match (`NGramDraft.ready`), and how many of its K tokens, from the first,
    equal the recorded continuation (what greedy verification accepts; 0 where not ready).
  Raises:
    ValueError: unless 0 < P < L <= S.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  if not 0 < prompt_length < length <= tokens.shape[0]:
    raise ValueError(f'need 0 < prompt_length < length <= {tokens.shape[0]}, got '
                     f'{prompt_length}, {length}')
  lengths = prompt_length + jnp.arange(length - prompt_length, dtype=jnp.int32)  # [T]
  buffers = jnp.broadcast_to(tokens, (lengths.shape[0], tokens.shape[0]))  # [T, S]
  end = ngram.match_end(buffers, lengths, max_ngram, min_ngram)
  proposal = ngram.continuation(buffers, lengths, end, num_draft_tokens)  # [T, K]
  position = lengths[:, None] + jnp.arange(num_draft_tokens)
  truth = tokens[jnp.minimum(position, tokens.shape[0] - 1)]
  match = (proposal == truth) & (position < length)
  ready = end >= 0
  return ready, jnp.where(ready, jnp.cumprod(match, axis=1).sum(1), 0).astype(jnp.int32)


def replay(schedule, ready, leading, num_new, round_seconds, *, plain_checks: bool = True) -> dict:
  """Runs `schedule` at batch 1 against recorded drafts, one decode per run, from its initial
  state: a round after t generated tokens drafts K (0 where the draft is not ready, `ready[r,
  t]`), accepts min(K, leading[r, t]) and commits one token more, within the decode's
  `num_new[r]` tokens, and is charged `round_seconds[K]`. With `plain_checks` a plain round
  where the draft is ready checks its first token (`leading[r, t] >= 1`), as the loop does for a
  `contracts.DeterministicDraft`.

  Args:
    schedule: a `contracts.Schedule` (`CostModel`, `Heuristic`, `Fixed`).
    ready: `[R, T]` bool; leading: `[R, T]` int32, from `ngram_trace` (padded to one T).
    num_new: `[R]` int32, generated tokens of each decode (<= T).
    round_seconds: `[K+1]` positive floats, a round's cost at K = 0..K (any unit).
  Returns:
    {'speedup': tokens per unit of cost over plain decoding's (1 / round_seconds[0]),
    'rounds_by_k': rounds at K = 0..K summed over runs (a list), 'acceptance': accepted /
    drafted}.
  Raises:
    ValueError: round_seconds not positive, or shapes that do not pair up.
  """
  costs = np.asarray(round_seconds, np.float64)
  ready, leading = jnp.asarray(ready, bool), jnp.asarray(leading, jnp.int32)
  num_new = jnp.asarray(num_new, jnp.int32)
  if not (costs > 0).all() or ready.shape != leading.shape or num_new.shape != ready.shape[:1]:
    raise ValueError(f'need positive round_seconds, ready and leading of one shape [R, T] and '
                     f'num_new [R]; got {tuple(round_seconds)}, {ready.shape}, {leading.shape}, '
                     f'{num_new.shape}')
  k_max = costs.shape[0] - 1
  branches = schedule.branches(k_max)
  branch_costs = jnp.asarray(costs[np.array(branches)], jnp.float32)
  active = jnp.ones((1,), bool)

  def one_run(ready_T, leading_T, n):
    def body(carry):
      state, metrics, t, cost = carry
      row_ready = ready_T[t][None]
      index = schedule.choose(state, active, row_ready)
      left = n - t

      def at(k):
        def run(metrics):
          drafted = jnp.where(row_ready, jnp.minimum(k, left - 1), 0).astype(jnp.int32)
          accepted = jnp.minimum(leading_T[t], drafted).astype(jnp.int32)
          committed = jnp.minimum(accepted + 1, left).astype(jnp.int32)
          metrics = metrics.update(active, drafted, accepted, committed, k)
          if k == 0 and plain_checks:
            metrics = metrics.check_plain(row_ready, leading_T[t][None] >= 1)
          return metrics, committed[0]
        return run

      after, committed = jax.lax.switch(index, [at(k) for k in branches], metrics)
      state = schedule.update(state, metrics, after, active, row_ready)
      return state, after, t + committed, cost + branch_costs[index]

    carry = (schedule.init(1, k_max), Metrics.zeros(1, k_max), jnp.int32(0), jnp.float32(0))
    _, metrics, tokens, cost = jax.lax.while_loop(lambda c: c[2] < n, body, carry)
    return cost, tokens, metrics.rounds_by_k[0], metrics.drafted[0], metrics.accepted[0]

  cost, tokens, rounds_by_k, drafted, accepted = jax.jit(jax.vmap(one_run))(ready, leading,
                                                                            num_new)
  return {'speedup': float(np.sum(tokens) / np.asarray(cost, np.float64).sum() * costs[0]),
          'rounds_by_k': np.asarray(rounds_by_k).sum(0).tolist(),
          'acceptance': float(np.sum(accepted) / max(int(np.sum(drafted)), 1))}
