"""Per-row decoding metrics, accumulated on device inside the loop."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metrics:
  """Counters per row (all int32). Tokens after an EOS or past `max_new_tokens` are never counted.

  Attributes:
    target_forward_passes: `[B]` verify (decode) passes of the target; prefill excluded.
    drafted: `[B]` drafted tokens that were examined (K per round, fewer in a round cut short by
      an EOS or the token budget).
    accepted: `[B]` drafted tokens accepted and committed.
    new_tokens: `[B]` tokens committed after the prompt.
    accepted_hist: `[B, K+1]` number of rounds that accepted 0..K drafted tokens.
    position_reached: `[B, K]` rounds whose drafted token i (0-based) was examined: drafted, and
      every drafted token before it accepted.
    position_accepted: `[B, K]` rounds whose drafted token i was accepted. The per-position
      (conditional) acceptance rate is position_accepted / position_reached.
    rounds_by_k: `[B, K+1]` rounds run with 0..K drafted tokens allowed (all at K unless a
      `jaxspec.schedule` schedule picks K per round).
    plain_checked: `[B]` plain rounds (K = 0, under a schedule) in which the first token a
      `contracts.DeterministicDraft` would have drafted was compared with the token the target
      committed: an observation of the first position's acceptance that costs no draft or
      verify work.
    plain_matched: `[B]` of those, the rounds where the two were equal. At temperature 0 that is
      what greedy verification accepts; at temperature > 0 it happens with probability p(token),
      the exact rules' acceptance probability for a one-hot draft.
  """

  target_forward_passes: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  new_tokens: jax.Array
  accepted_hist: jax.Array
  position_reached: jax.Array
  position_accepted: jax.Array
  rounds_by_k: jax.Array
  plain_checked: jax.Array
  plain_matched: jax.Array

  @classmethod
  def zeros(cls, batch_size: int, num_draft_tokens: int) -> Metrics:
    z = jnp.zeros((batch_size,), jnp.int32)
    zk = jnp.zeros((batch_size, num_draft_tokens), jnp.int32)
    zk1 = jnp.zeros((batch_size, num_draft_tokens + 1), jnp.int32)
    return cls(z, z, z, z, zk1, zk, zk, zk1, z, z)

  def update(self, active, num_drafted, num_accepted, num_committed, k: int) -> Metrics:
    """Adds one round run with K = `k` (static) allowed; `active` `[B]` bool masks rows that were
    already finished."""
    a = active.astype(jnp.int32)
    width = self.accepted_hist.shape[1]
    hist = jax.nn.one_hot(num_accepted, width, dtype=jnp.int32)
    i = jnp.arange(width - 1)[None]
    reached = (i < num_drafted[:, None]) & (i <= num_accepted[:, None])
    accepted = i < num_accepted[:, None]
    return Metrics(self.target_forward_passes + a, self.drafted + a * num_drafted,
                   self.accepted + a * num_accepted, self.new_tokens + a * num_committed,
                   self.accepted_hist + a[:, None] * hist,
                   self.position_reached + a[:, None] * reached,
                   self.position_accepted + a[:, None] * accepted,
                   self.rounds_by_k.at[:, k].add(a), self.plain_checked, self.plain_matched)

  def check_plain(self, checked, matched) -> Metrics:
    """Adds one plain round's check of a deterministic draft's first token: `checked` `[B]` bool
    (the row was active, the draft had a token, the round committed one), `matched` `[B]` bool
    (and it equalled the committed token)."""
    return dataclasses.replace(self, plain_checked=self.plain_checked + checked,
                               plain_matched=self.plain_matched + (checked & matched))


def summarize(metrics: Metrics) -> dict:
  """Batch totals as Python numbers: acceptance_rate = accepted / drafted (0 when nothing was
  drafted), mean_accepted_length = new tokens / target forward passes (tokens per pass),
  position_acceptance[i] = accepted / examined at drafted position i (None where never examined),
  rounds_by_k[k] = rounds run with K = k (summed over rows), plain_checked / plain_matched =
  plain rounds that checked a deterministic draft's first token / found it equal."""
  m = jax.tree.map(np.asarray, metrics)
  passes, drafted = int(m.target_forward_passes.sum()), int(m.drafted.sum())
  return {
      'new_tokens': int(m.new_tokens.sum()),
      'target_forward_passes': passes,
      'drafted_tokens': drafted,
      'accepted_tokens': int(m.accepted.sum()),
      'acceptance_rate': float(m.accepted.sum() / drafted) if drafted else 0.0,
      'mean_accepted_length': float(m.new_tokens.sum() / passes) if passes else 0.0,
      'accepted_length_histogram': m.accepted_hist.sum(0).tolist(),
      'position_acceptance': [float(a / r) if r else None for a, r in
                              zip(m.position_accepted.sum(0), m.position_reached.sum(0))],
      'rounds_by_k': m.rounds_by_k.sum(0).tolist(),
      'plain_checked': int(m.plain_checked.sum()),
      'plain_matched': int(m.plain_matched.sum()),
  }
