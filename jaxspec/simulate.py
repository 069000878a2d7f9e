"""A schedule against a synthetic draft, off the machine's clock.

Timing `auto` against plain decoding on a shared CPU is noisy (two timings of the same work
differ by 5-8% on the 2-core VM of docs/adaptive.md), so whether a schedule's decisions lose 1%
or 4% cannot be read from one benchmark run. Here the schedule (`contracts.Schedule`: its own
`choose` and `update`, compiled) decides round after round against a draft whose drafted token i
is accepted with a fixed probability given the tokens before it were (independent draws), and
each round is charged the cost given for its K; tokens per unit of cost then say what the rule
itself gains or loses, with nothing else in the measurement.

Shape letters: R runs, B batch, K largest draft length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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
    state = schedule.update(state, metrics, after, active)
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
