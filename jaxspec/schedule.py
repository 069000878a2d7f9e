"""Schedules: K chosen per round inside the compiled loop (the `contracts.Schedule` protocol).

- `Heuristic` is transformers' "heuristic" schedule (`num_assistant_tokens_schedule`): K grows by
  2 after a round whose drafted tokens were all accepted, and shrinks by 1 otherwise.
- `CostModel` keeps on-device, discounted (exponentially weighted) acceptance counts per row
  and drafted position, pooled for the batch, and picks the K (0, a plain step, included) with
  the most expected tokens per second: E_b(K) = 1 + sum_{j<=K} prod_{i<j} alpha_{b,i}
  (Leviathan et al. 2023, Eq. 1, with per-position rates; 1 for a row the draft is not ready
  for) divided by the measured cost of a K-round (`measure_round_costs`). At batch > 1 with a
  known horizon (max_new_tokens) the rows' E_b(K) are averaged with weights on the rows that
  will finish last, since the batch's loop lasts as long as its longest row (tokens gained by a
  row that finishes early save no time); without one, over all active rows. Where speculation
  does not pay (a slow draft, a large batch) it picks 0; a K whose round costs K + 1 plain ones
  or more can never pay and is not compiled (nor, after `measured_cost_model`, one that could
  not pay at the highest first-position acceptance its start-up rounds leave credible), and
  with no K left the loop runs plain decoding's own round (the draft is never called). Rates
  change only in rounds that draft and in plain rounds that check a
  `contracts.DeterministicDraft`'s first token against the committed one (free), so after
  `probe_every` plain rounds in a row that observed nothing one round drafts with the smallest
  K > 0 (a probe); by default the wait is set from the measured costs so that probes that find
  nothing cost at most `probe_budget` (2%) of the decoding time, and no probe runs with fewer
  rounds left than that wait (it could not pay for itself).

Neither changes what is sampled: K depends only on rounds already committed.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import bench, loop
from jaxspec.metrics import Metrics


def _round_outcome(before: Metrics, after: Metrics):
  """This round's per-position examined and accepted flags `[B,K]` int32, from the counters; a
  plain round's check of a deterministic draft's first token counts as position 0 examined."""
  checked = after.plain_checked - before.plain_checked
  matched = after.plain_matched - before.plain_matched
  return (after.position_reached.at[:, 0].add(checked) - before.position_reached,
          after.position_accepted.at[:, 0].add(matched) - before.position_accepted)


@dataclasses.dataclass(frozen=True)
class Cycle:
  """Round r runs K = ks[r % len(ks)], whatever happened: for tests (K changing every round)
  and for timing rounds that change K against rounds at one K (`scripts/bench_switch.py
  --cycle`). Compiles a branch for every K in 0..max_draft_tokens; a K above it is clamped to
  the last branch. Exact under every verifier: K depends on the round number only."""

  ks: tuple[int, ...] = (3, 0, 1, 4, 2, 0, 0, 4)

  def branches(self, max_draft_tokens):
    return tuple(range(max_draft_tokens + 1))

  def init(self, batch_size: int, max_draft_tokens: int) -> jax.Array:
    del batch_size, max_draft_tokens
    return jnp.int32(0)

  def choose(self, state, active, ready):
    del active, ready
    return jnp.asarray(self.ks, jnp.int32)[state % len(self.ks)]

  def update(self, state, before: Metrics, after: Metrics, active, ready):
    del before, after, active, ready
    return state + 1


@dataclasses.dataclass(frozen=True)
class Heuristic:
  """transformers' heuristic schedule: K += 2 after a round in which every active row accepted
  all it drafted, else K -= 1, within [1, K_max]. State: K, an int32 scalar.

  Attributes:
    initial: K of the first round; None = K_max.
  """

  initial: int | None = None

  def branches(self, max_draft_tokens: int) -> tuple[int, ...]:
    return tuple(range(1, max_draft_tokens + 1))

  def init(self, batch_size: int, max_draft_tokens: int) -> jax.Array:
    del batch_size
    return jnp.int32(min(self.initial or max_draft_tokens, max_draft_tokens))

  def choose(self, state, active, ready):
    del active, ready
    return state - 1

  def update(self, state, before: Metrics, after: Metrics, active, ready):
    del ready
    all_accepted = jnp.all(~active | (after.accepted - before.accepted ==
                                      after.drafted - before.drafted))
    k_max = before.position_reached.shape[1]
    return jnp.clip(jnp.where(all_accepted, state + 2, state - 1), 1, k_max).astype(jnp.int32)


STARTUP_ROUNDS = 8  # rounds a call when the start-up prices are measured
BOUND_DELTA = 1e-3  # the chance that `measured_cost_model`'s max_acceptance reads too low


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CostModelState:
  """Discounted counts per row and drafted position i (`[B,K]` float32): reached (token i was
  examined: drafted, every token before it accepted; or, for i = 0, checked in a plain round)
  and accepted; plain_rounds, an int32 scalar: rounds in a row that observed nothing; rounds,
  an int32 scalar: rounds so far; committed, `[B]` float32: tokens each row has committed;
  ready_share, `[B]` float32: each row's discounted share of rounds the draft was ready for it
  (`Draft.ready`; 1 before the first round)."""

  reached: jax.Array
  accepted: jax.Array
  plain_rounds: jax.Array
  rounds: jax.Array
  committed: jax.Array
  ready_share: jax.Array


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Picks the K with the most expected tokens per second from measured round costs.

  The acceptance rate at drafted position i (given the tokens before it accepted) is estimated
  per row from discounted counts (each observation's weight falls by `decay` per later
  observation at that row and position): a row's rate at position i is its own counts plus
  `prior_weight` pseudo-observations at the rate of the *other* active rows' pooled counts at i,
  themselves plus `prior_weight` pseudo-observations at the row's own rate at position i - 1 (at
  `prior` for the first position). So a row's own observations count once (at batch 1 the rate
  is its counts plus pseudo-observations at its rate one position earlier), a position never
  examined yet follows the one before it rather than a fixed guess, and a row with no history of
  its own follows the rest of the batch. (Shrinking a row to the pooled counts of all rows, its
  own included, counted its observations twice: at batch 1 one accepted probe read as 0.875,
  and in a simulation of Bernoulli acceptance the rates swung enough to lose 5-9% against the
  best fixed K for drafts that pay; docs/adaptive.md run 15.) Until the batch has examined a
  drafted token, a round drafts at most the smallest K > 0 (learning the rate costs short
  rounds, never a long window drafted on a guess), and none if even the prior says drafting
  does not pay.

  At batch > 1 the batch's loop runs until its slowest row is done, so tokens matter by the row
  they go to. With a `horizon`, a row b needs about rounds_b(K) = (horizon - committed_b) /
  L_b(K) more rounds at a fixed K, where L_b(K) = s_b E_b(K) + 1 - s_b is its long-run tokens
  per round (s_b its share of rounds the draft was ready for it), and a round's expected tokens
  are averaged over active rows with weights exp((rounds_b(K) - max_b rounds_b(K)) /
  `finish_spread`): the rows that finish last decide. Summing over rows instead drafted in
  rounds that could not shorten the batch: at batch 16 on the CPU a fixed K = 1 cut the loop by
  2-12% where the rows' acceptance promised 19-24%, and `auto` read x0.88-0.98 of plain
  (docs/adaptive.md run 33). At batch 1 the weight is 1: the rule is the one above.

  Attributes:
    ks: the K values compiled, ascending (0 = a plain step).
    round_seconds: the measured cost of one round at each K (same order; `measure_round_costs`).
    prior: the first position's rate before anything was observed (`measured_cost_model`
      measures it in its start-up rounds).
    decay: the discount of older observations, in (0, 1] (1 = only the latest counts).
    prior_weight: how many observations the prior counts for, > 0. The default 2 with prior 0.5
      is Laplace's rule (a uniform Beta(1, 1) prior on the first position's rate): one rejected
      probe reads 1/3, one accepted 2/3. (With 1, one rejected first round read 0.25, under the
      ~1.3 plain rounds a K = 1 round costs at batch 1 on the CPU, and with few probes left in
      a 48-token decode a bursty n-gram draft on grounded prompts stayed off: x1.01 against K =
      4's x1.39 in docs/adaptive.md run 24; replayed on recorded n-gram acceptance of training
      prompts, 2 gains up to 12%, and against Bernoulli acceptance it loses at most 1%, at
      rates of 0.1.)
    probe_every: after this many plain rounds in a row that observed nothing (no check of a
      deterministic draft's first token), one round drafts with the smallest K > 0; 0 = never
      (speculation, once off, stays off); None (the default) = `probe_interval()`, from the costs
      and `probe_budget`.
    probe_budget: the largest share of a plain round's time that probes may waste when they
      find nothing (all rejected), > 0: a probe at K costs round_seconds[K] - round_seconds[0]
      more than the plain round it replaces, so probing every (that excess /
      round_seconds[0]) / probe_budget plain rounds spends at most this share. At batch 1 on
      the 2-core CPU of docs/adaptive.md a K = 1 round costs ~1.1 plain ones (a probe every 5
      rounds); at batch 32, ~1.9 (every 45): bursty drafts (n-gram copies) are found again
      quickly where probing is cheap, and rarely probed where it is dear.
    horizon: the most rounds a decode runs (its max_new_tokens: a round commits >= 1 token a
      row), or None (unknown). A probe needs more than `probe_interval()` rounds left after it
      to use what it finds: one due later is skipped (at batch 32 on the CPU a K = 1 round costs
      1.9 plain ones, a probe every 44 rounds, and in a 48-token decode the one probe came with
      4 rounds left and cost ~2.5% of the decode; docs/adaptive.md run 22).
      `measured_cost_model` sets it from the config. Without one, rows weigh alike.
    finish_spread: in rounds, > 0: how far (in expected rounds still to run) a row may be from
      the slowest before its tokens count e times less; rows that tie weigh alike, so the
      choice never waits on one row the draft happens not to be ready for.
    min_gain: >= 0: a round drafts only where it promises more than (1 + min_gain) times a
      plain round's tokens per second (probes aside): a margin for prices that read low. Off by
      default: against Bernoulli acceptance with EAGLE's batch-1 prices and drafting rounds
      charged 2% over them, margins of 0.02-0.05 gained at most 0.5 points at acceptance 0.2
      and lost 0.5-1.5 where K = 1 pays 7-15% (`scripts/simulate_schedule.py --min-gains`,
      docs/adaptive.md run 41).
    max_acceptance: an upper bound, in [0, 1], on the first drafted position's acceptance rate
      (1 = none). One round's expected tokens a row, 1 + sum_{i<=K} P(tokens 1..i accepted), is
      at most 1 + K max_acceptance, so `paying()` keeps a K > 0 only if its round costs less
      than that many plain rounds. `measured_cost_model` sets it from its start-up counts.
  Raises:
    ValueError: ks and round_seconds of different lengths, ks not ascending, non-positive
      costs, or prior, decay, prior_weight, probe_every, probe_budget, horizon, finish_spread
      out of range.
  """

  ks: tuple[int, ...]
  round_seconds: tuple[float, ...]
  prior: float = 0.5
  decay: float = 0.1
  prior_weight: float = 2.0
  probe_every: int | None = None
  probe_budget: float = 0.02
  horizon: int | None = None
  finish_spread: float = 1.0
  min_gain: float = 0.0
  max_acceptance: float = 1.0

  def __post_init__(self):
    if len(self.ks) != len(self.round_seconds) or not self.ks:
      raise ValueError(f'ks and round_seconds must pair up; got {self.ks} and '
                       f'{self.round_seconds}')
    if list(self.ks) != sorted(set(self.ks)) or self.ks[0] < 0:
      raise ValueError(f'ks must be distinct, ascending and >= 0, got {self.ks}')
    if not all(c > 0 for c in self.round_seconds):
      raise ValueError(f'round_seconds must be positive, got {self.round_seconds}')
    if not (0 <= self.prior <= 1 and 0 < self.decay <= 1 and self.prior_weight > 0 and
            (self.probe_every is None or self.probe_every >= 0) and self.probe_budget > 0 and
            (self.horizon is None or self.horizon >= 1) and self.finish_spread > 0 and
            self.min_gain >= 0 and 0 <= self.max_acceptance <= 1):
      raise ValueError(f'need prior in [0, 1], decay in (0, 1], prior_weight > 0, probe_every '
                       f'None or >= 0, probe_budget > 0, horizon None or >= 1, finish_spread > 0, '
                       f'min_gain >= 0, max_acceptance in [0, 1]; got {self.prior}, {self.decay}, '
                       f'{self.prior_weight}, {self.probe_every}, {self.probe_budget}, '
                       f'{self.horizon}, {self.finish_spread}, {self.min_gain}, '
                       f'{self.max_acceptance}')

  def paying(self) -> tuple[int, ...]:
    """The Ks of `ks` a round may run (ascending): K = 0 and every K > 0 whose round costs less
    than 1 + K max_acceptance plain rounds. A round commits at most that many tokens a row in
    expectation (at most K + 1 whatever the acceptance), so a K that costs more never beats
    plain decoding (at batch 16 on the 2-core CPU of docs/adaptive.md a K = 1 round costs
    ~1.5-2.2 plain ones). Without a K = 0, all of `ks`."""
    if self.ks[0] != 0:
      return self.ks
    plain = self.round_seconds[0]
    return tuple(k for k, c in zip(self.ks, self.round_seconds)
                 if k == 0 or c < (1 + k * self.max_acceptance) * plain)

  def probe_interval(self) -> int:
    """Plain rounds in a row after which a round probes: `probe_every` if given, else
    ceil(excess / probe_budget), at least 1, where excess = round_seconds[K] /
    round_seconds[0] - 1 for the smallest K > 0 of `paying()`; 0 (never) without a K = 0 and
    a K > 0 there."""
    ks = self.paying()
    if ks[0] != 0 or len(ks) < 2:
      return 0
    if self.probe_every is not None:
      return self.probe_every
    excess = self.round_seconds[self.ks.index(ks[1])] / self.round_seconds[0] - 1
    return max(1, int(np.ceil(excess / self.probe_budget - 1e-9)))

  def branches(self, max_draft_tokens: int) -> tuple[int, ...]:
    """`paying()`: the Ks that can beat plain decoding at some first-position acceptance rate up
    to `max_acceptance` (only (0,) when none can: the loop then runs plain decoding's own round
    and never calls the draft)."""
    if self.ks[-1] > max_draft_tokens:
      raise ValueError(f'the cost model has K up to {self.ks[-1]}, more than num_draft_tokens '
                       f'{max_draft_tokens}')
    return self.paying()

  def init(self, batch_size: int, max_draft_tokens: int) -> CostModelState:
    zeros = jnp.zeros((batch_size, max_draft_tokens), jnp.float32)
    return CostModelState(zeros, zeros, jnp.int32(0), jnp.int32(0),
                          jnp.zeros((batch_size,), jnp.float32),
                          jnp.ones((batch_size,), jnp.float32))

  def rates(self, state: CostModelState, active) -> tuple[jax.Array, jax.Array]:
    """(per-row rates `[B,K]`, the batch's rates `[K]`) float32, from active rows' counts. The
    batch's rate at position i (reported, not used to choose) is the pooled counts plus
    `prior_weight` pseudo-observations at its rate at i - 1 (at `prior` for i = 0)."""
    w, a = self.prior_weight, active[:, None]
    accepted_BK = jnp.where(a, state.accepted, 0)
    reached_BK = jnp.where(a, state.reached, 0)
    accepted_K, reached_K = accepted_BK.sum(0), reached_BK.sum(0)
    others_accepted, others_reached = accepted_K - accepted_BK, reached_K - reached_BK
    row = jnp.full(state.accepted.shape[:1], self.prior, jnp.float32)
    batch, rows, previous = [], [], jnp.float32(self.prior)
    for i in range(accepted_K.shape[0]):  # K_max positions, a static handful
      others = (others_accepted[:, i] + w * row) / (others_reached[:, i] + w)
      row = (state.accepted[:, i] + w * others) / (state.reached[:, i] + w)
      rows.append(row)
      previous = (accepted_K[i] + w * previous) / (reached_K[i] + w)
      batch.append(previous)
    return jnp.stack(rows, 1), jnp.stack(batch)

  def row_tokens(self, state: CostModelState, active) -> jax.Array:
    """E_b(K): the tokens one round is expected to commit for each row the draft is ready for,
    at each K of `ks` (Leviathan et al. 2023, Eq. 1, with the row's per-position rates):
    `[B, len(ks)]` float32."""
    reach = jnp.cumprod(self.rates(state, active)[0], axis=1)  # P(token i and all before accepted)
    per_k = 1 + jnp.pad(jnp.cumsum(reach, axis=1), ((0, 0), (1, 0)))  # [B, K+1], E at K = 0..
    return per_k[:, np.array(self.ks)]

  def expected_tokens(self, state: CostModelState, active, ready=None) -> jax.Array:
    """Expected tokens committed by one round at each K of `ks`, summed over active rows:
    `[len(ks)]` float32. A row the draft is not ready for (`ready [B]` bool; default all)
    commits one token at every K."""
    ready = active if ready is None else active & ready
    per_k = jnp.where(ready[:, None], self.row_tokens(state, active), 1.0)
    return jnp.sum(jnp.where(active[:, None], per_k, 0.0), axis=0)

  def finish_weights(self, state: CostModelState, active, row_tokens=None) -> jax.Array:
    """How much each row's tokens count at each K of `ks`: `[B, len(ks)]` float32 in [0, 1],
    exp((rounds_b(K) - max over active rows) / finish_spread) with rounds_b(K) = (horizon -
    committed_b) / (s_b E_b(K) + 1 - s_b) (see the class); 0 for inactive rows; 1 for every
    active row without a horizon. `row_tokens`: E_b(K) if already computed (`row_tokens()`)."""
    if self.horizon is None:
      return jnp.broadcast_to(active[:, None], (active.shape[0], len(self.ks))).astype(jnp.float32)
    if row_tokens is None:
      row_tokens = self.row_tokens(state, active)
    share = state.ready_share[:, None]
    long_run = share * row_tokens + 1 - share
    remaining = jnp.maximum(self.horizon - state.committed, 1.0)[:, None]
    rounds = jnp.where(active[:, None], remaining / long_run, -jnp.inf)
    slowest = jnp.max(rounds, axis=0)
    slowest = jnp.where(jnp.isfinite(slowest), slowest, 0.0)  # no active row: every weight 0
    return jnp.exp((rounds - slowest) / self.finish_spread)

  def choose(self, state: CostModelState, active, ready):
    """The index into `branches` (`paying()`) of this round's K: the most expected tokens per
    second, tokens averaged over rows with `finish_weights`, plain's rate counted (1 +
    min_gain) times."""
    ks = self.paying()
    kept = np.array([self.ks.index(k) for k in ks])
    row_tokens = self.row_tokens(state, active)
    per_k = jnp.where((active & ready)[:, None], row_tokens, 1.0)[:, kept]
    weights = self.finish_weights(state, active, row_tokens)[:, kept]
    tokens = jnp.sum(weights * per_k, axis=0) / jnp.maximum(jnp.sum(weights, axis=0), 1e-30)
    bonus = np.array([1 + self.min_gain if k == 0 else 1.0 for k in ks], np.float32)
    rate = bonus * tokens / jnp.asarray(self.round_seconds, jnp.float32)[kept]
    index = jnp.argmax(rate).astype(jnp.int32)
    positive = [i for i, k in enumerate(ks) if k > 0]
    if positive:
      # Nothing examined yet: draft no more than the smallest K > 0, if drafting pays at all.
      unseen = ~jnp.any(active & (state.reached[:, 0] > 0))
      index = jnp.where(unseen & (index > positive[0]), positive[0], index)
      interval = self.probe_interval()
      if interval:
        probe = ((index == 0) & (state.plain_rounds >= interval) &
                 jnp.any(active & ready))
        if self.horizon is not None:  # enough rounds left to use what the probe finds
          probe &= self.horizon - state.rounds - 1 > interval
        index = jnp.where(probe, positive[0], index)
    return index.astype(jnp.int32)

  def update(self, state: CostModelState, before: Metrics, after: Metrics, active, ready):
    reached, accepted = _round_outcome(before, after)
    seen, keep = reached > 0, 1 - self.decay
    drafted = jnp.any((after.drafted > before.drafted) |
                      (after.plain_checked > before.plain_checked))  # observed something
    share = keep * state.ready_share + self.decay * ready.astype(jnp.float32)
    return CostModelState(jnp.where(seen, keep * state.reached + 1, state.reached),
                          jnp.where(seen, keep * state.accepted + accepted, state.accepted),
                          jnp.where(drafted, 0, state.plain_rounds + 1).astype(jnp.int32),
                          state.rounds + 1, after.new_tokens.astype(jnp.float32),
                          jnp.where(active, share, state.ready_share))


@dataclasses.dataclass(frozen=True)
class _Forced:
  """A schedule that compiles a branch for every K of `ks` and runs the branch its state names:
  an int32 index into `ks`, data rather than a constant, so one compiled program runs every K
  (and the compiler cannot fold the switch away)."""

  ks: tuple[int, ...]

  def branches(self, max_draft_tokens):
    del max_draft_tokens
    return self.ks

  def init(self, batch_size, max_draft_tokens):
    del batch_size, max_draft_tokens
    return jnp.int32(0)

  def choose(self, state, active, ready):
    del active, ready
    return state

  def update(self, state, before, after, active, ready):
    del before, after, active, ready
    return state


def measure_round_costs(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
                        target, draft, config: loop.DecodeConfig, ks,
                        rounds: int = STARTUP_ROUNDS, repeats: int = 5, max_repeats: int = 20,
                        budget_s: float = 20.0) -> tuple[float, ...]:
  """Seconds per round at each K of `ks`, measured here on these prompts (the batch size and
  devices that decoding will use): `round_costs` of `measure_round_sweeps`.

  Args: as `generate`; config.num_draft_tokens is the largest K (it sets the buffer's size);
    rounds, repeats, max_repeats, budget_s as `measure_round_sweeps`.
  Returns:
    seconds per round, one per K, in the order of `ks`.
  Raises:
    ValueError: what `generate` raises, a K outside [0, config.num_draft_tokens], or repeats,
    max_repeats, budget_s out of range.
  """
  sweeps = measure_round_sweeps(target_params, draft_params, prompt_tokens, prompt_lengths,
                                seeds, target=target, draft=draft, config=config, ks=ks,
                                rounds=rounds, repeats=repeats, max_repeats=max_repeats,
                                budget_s=budget_s)[0]
  return round_costs(sweeps, ks, rounds)


def round_costs(sweep_seconds: dict, ks, rounds: int) -> tuple[float, ...]:
  """Seconds per round at each K of `ks` from `measure_round_sweeps`' seconds, `{K: [sweeps]}`
  for `rounds` rounds a call: each K's mean over the sweeps, per round, then raised to the
  largest cost of the smaller Ks (a round with more drafted tokens does strictly more work, so a
  lower time is noise). A best time keeps one lucky call per K, and the ratios between Ks, which
  are all the choice uses, then carry two draws of luck (at batch 16 in docs/adaptive.md run 30
  the best times priced a K = 1 round at 1.16 plain ones, where the loop ran it at ~1.5; the
  mean, in run 31, at 1.09-1.37 where the loop ran it at ~1.3). A median of each K's ratio to
  the plain round of the same sweep was no steadier: over 8 start-ups on one grounded prompt at
  batch 1 its prices lay 0.039-0.076 (root mean square, in plain rounds) from those of all their
  sweeps pooled, the mean's 0.051-0.069, the best time's 0.061-0.120 (`scripts/bench_prices.py`,
  docs/adaptive.md run 39).

  Returns:
    seconds per round, one per K, in the order of `ks`.
  Raises:
    KeyError: a K of `ks` missing from `sweep_seconds`; ValueError: Ks timed over different
    numbers of sweeps, or none.
  """
  branches = sorted(set(ks))
  if len({len(sweep_seconds[k]) for k in branches}) != 1 or not sweep_seconds[branches[0]]:
    raise ValueError(f'every K needs the same number (>= 1) of sweeps, got '
                     f'{ {k: len(sweep_seconds[k]) for k in branches} }')
  costs = np.maximum.accumulate([np.mean(sweep_seconds[k]) / rounds for k in branches])
  return tuple(float(costs[branches.index(k)]) for k in ks)


def measure_round_sweeps(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
                         target, draft, config: loop.DecodeConfig, ks,
                         rounds: int = STARTUP_ROUNDS, repeats: int = 5, max_repeats: int = 20,
                         budget_s: float = 20.0, more_prompts=()) -> tuple[dict, float, float]:
  """The wall seconds of `rounds` rounds at each K of `ks`, in sweeps, and the first drafted
  position's (examined, accepted) counts over every K's warm-up rounds and rows (a deterministic
  draft's plain-round checks included): `({K: [sweeps] seconds}, examined, accepted)`. For each
  K the rounds of `loop.decode_step` run in one compiled loop from the prefilled state, under a
  schedule that compiles a branch for every K of `ks` and picks that K every round (the K an
  input of the one program compiled for all of them, as auto's choice is), so the time includes
  what the schedule's switch and a deterministic draft's plain-round check cost (a drafting
  round under the switch cost 1-2% more than in a fixed-K loop with EAGLE at batch 1,
  docs/adaptive.md run 28). After one warm-up, the Ks are timed in sweeps (`bench.timed_sweeps`:
  every K once a sweep, in shuffled order, so a burst of load on a shared machine hits them
  alike): `repeats` of them, then more, up to `max_repeats`, while the sweeps so far took less
  than `budget_s` seconds. With 5 sweeps, EAGLE's K = 1 round read 1.13-1.36 plain ones over 8
  start-ups on one prompt at batch 1 (±0.07), with 20 1.22-1.29 (±0.03), where K = 1 breaks even
  near its acceptance rate there (docs/adaptive.md run 39); at batch 32 on the 2-core CPU one
  sweep takes ~11 s, so the budget keeps it at `repeats` there, where no draft is near
  break-even.

  Args: as `generate`; config.num_draft_tokens is the largest K; 1 <= repeats <= max_repeats;
    budget_s >= 0; more_prompts: further batches `(prompt_tokens, prompt_lengths, seeds)`, as
    the first (e.g. the other prompts that one compiled program will decode), whose warm-up
    rounds at every K join the counts; they are not timed (same shapes as the first: nothing
    recompiles).
  Raises: as `measure_round_costs`, and what `generate` raises for a batch of more_prompts.
  """
  if not 1 <= repeats <= max_repeats or budget_s < 0:
    raise ValueError(f'need 1 <= repeats <= max_repeats and budget_s >= 0, got {repeats}, '
                     f'{max_repeats}, {budget_s}')
  if not all(0 <= k <= config.num_draft_tokens for k in ks):
    raise ValueError(f'every K must be in [0, num_draft_tokens={config.num_draft_tokens}], got '
                     f'{tuple(ks)}')
  branches = tuple(sorted(set(ks)))
  config = dataclasses.replace(config, schedule=_Forced(branches))
  def checked(batch):  # (args, statics) of `generate`; raises on a bad batch
    return loop._checked_args(target_params, draft_params, *batch, target=target, draft=draft,  # pylint: disable=protected-access
                              config=config)

  further = [checked(b)[0] for b in more_prompts]  # bad batches raise before any work
  args, statics = checked((prompt_tokens, prompt_lengths, seeds))
  init = jax.jit(loop.init_state, static_argnames=tuple(statics))
  run = bench.round_loop(statics, rounds, loop.decode_step)  # one program for every K
  forced = lambda state: [(run, (dataclasses.replace(state, schedule=jnp.int32(i)), target_params,
                                 draft_params)) for i in range(len(branches))]
  jobs = dict(zip(branches, forced(init(*args, **statics))))

  def warm_up(batch_jobs):  # each job once (the first compiles): first-position counts
    examined = accepted = 0.0
    for fn, job_args in batch_jobs:
      metrics = fn(*job_args)[1]
      reached_BK, accepted_BK = _round_outcome(jax.tree.map(jnp.zeros_like, metrics), metrics)
      examined += float(jnp.sum(reached_BK[:, 0]))
      accepted += float(jnp.sum(accepted_BK[:, 0]))
    return examined, accepted

  # Further batches are prefilled in turn, so no two of their states are held at once.
  counts = [warm_up(jobs.values())] + [warm_up(forced(init(*a, **statics))) for a in further]
  examined, accepted = (sum(c) for c in zip(*counts))
  start = time.perf_counter()
  sweeps = bench.timed_sweeps(jobs, reps=repeats, warm_up=False)
  while len(sweeps[branches[0]]) < max_repeats and time.perf_counter() - start < budget_s:
    more = bench.timed_sweeps(jobs, reps=1, seed=len(sweeps[branches[0]]), warm_up=False)
    for k in branches:
      sweeps[k] += more[k]
  return sweeps, examined, accepted


def acceptance_bound(accepted: float, examined: float, delta: float = BOUND_DELTA) -> float:
  """A one-sided upper bound on an acceptance rate from `accepted` of `examined` drafted tokens:
  the rate is above it with probability at most `delta` (Hoeffding 1963, Thm. 1: the mean of n
  independent draws in [0, 1] exceeds its expectation by t with probability at most
  exp(-2 n t^2)), so min(1, accepted / examined + sqrt(ln(1 / delta) / (2 examined))); 1 with
  nothing examined. It counts every examined token as an independent draw; rows that decode
  the same prompt greedily repeat one another's draws, which makes the bound read low (with n
  draws from m distinct prompts, count n / (rows per prompt)).

  Raises:
    ValueError: counts negative or accepted > examined, or delta outside (0, 1).
  """
  if not (0 <= accepted <= examined and 0 < delta < 1):
    raise ValueError(f'need 0 <= accepted <= examined and delta in (0, 1), got {accepted}, '
                     f'{examined}, {delta}')
  if examined == 0:
    return 1.0
  return float(min(1.0, accepted / examined + np.sqrt(np.log(1 / delta) / (2 * examined))))


def measured_cost_model(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
                        target, draft, config: loop.DecodeConfig, ks=None, more_prompts=(),
                        **cost_model_kwargs) -> CostModel:
  """A `CostModel` over `ks` (default 0..num_draft_tokens) with round costs measured here
  (`measure_round_costs`) on these prompts, `horizon` = config.max_new_tokens and, unless given,
  a `prior` measured in the same rounds: the first drafted position's acceptance over every K's
  warm-up rounds (and a deterministic draft's plain-round checks), counted on top of
  `prior_weight` pseudo-observations at CostModel's default prior (Laplace's rule with the
  defaults: (accepted + 1) / (examined + 2)). A fixed prior of 0.5 had a draft that never pays
  draft its first round of every decode and re-draft after each accepted probe: the exit draft
  on grounded prompts drafted 14 of 120 rounds at acceptance 0.21 where a K = 1 round costs
  1.38 plain ones, x0.968 of plain (docs/adaptive.md run 35). Unless given, `max_acceptance`
  is the same counts' one-sided upper bound (`acceptance_bound`, Hoeffding at `BOUND_DELTA`), so
  where even that rate leaves no K paying, the loop compiles plain decoding's own program and
  pays nothing for the draft, the switch or the schedule (at batch 16 and 32 on the 2-core CPU
  of docs/adaptive.md, a K = 1 round costs ~1.5-1.7 plain ones and the drafts' first tokens are
  accepted at ~0.1-0.25). `more_prompts` (`measure_round_sweeps`): further batches that the
  model will serve, whose start-up rounds join the prior's and the bound's counts (prices come
  from the first batch alone): a prior from one prompt misled the others (EAGLE on chat
  prompts at batch 1: 0.57 from the first prompt, acceptance 0.14 over three, 22 of 101 rounds
  drafted, x0.94 of plain in docs/adaptive.md run 43). The rest of `CostModel`'s settings as
  keywords. Raises what `measure_round_costs` and `CostModel` raise."""
  ks = tuple(range(config.num_draft_tokens + 1)) if ks is None else tuple(ks)
  CostModel(ks=ks, round_seconds=(1.0,) * len(ks), **cost_model_kwargs)  # bad settings: raise now
  sweeps, examined, accepted = measure_round_sweeps(
      target_params, draft_params, prompt_tokens, prompt_lengths, seeds, target=target,
      draft=draft, config=config, ks=ks, more_prompts=more_prompts)
  costs = round_costs(sweeps, ks, STARTUP_ROUNDS)
  if 'prior' not in cost_model_kwargs:
    weight = cost_model_kwargs.get('prior_weight', CostModel.prior_weight)
    cost_model_kwargs['prior'] = (accepted + weight * CostModel.prior) / (examined + weight)
  if 'max_acceptance' not in cost_model_kwargs:
    cost_model_kwargs['max_acceptance'] = acceptance_bound(accepted, examined)
  return CostModel(ks=ks, round_seconds=costs,
                   **{'horizon': config.max_new_tokens, **cost_model_kwargs})
