"""The expected-speedup model of Leviathan et al. 2023 ("Fast Inference from Transformers via
Speculative Decoding"), used to pick K from measured quantities.

With i.i.d. per-token acceptance rate alpha, K drafted tokens per round and a draft step costing
c target steps, one round commits E = (1 - alpha^(K+1)) / (1 - alpha) tokens in expectation
(Eq. 1) and the walltime improvement is E / (K c + 1) (Theorem 3.8). That assumes a verify pass of
K+1 tokens costs the same as one target step; `measured_cost_speedup` replaces that with the
measured verify cost, which matters on a CPU.
"""

from __future__ import annotations

import numpy as np


def expected_tokens(alpha: float, k: int) -> float:
  """E[tokens committed per round] = (1 - alpha^(K+1)) / (1 - alpha)."""
  if alpha >= 1.0:
    return float(k + 1)
  return float((1.0 - alpha ** (k + 1)) / (1.0 - alpha))


def expected_tokens_by_position(acceptance, k: int) -> float:
  """`expected_tokens` with a rate per drafted position (`acceptance [>= K]`, the probability
  that token i is accepted given those before it were): 1 + sum_{j<=K} prod_{i<j}
  acceptance[i] (Leviathan et al. 2023, Eq. 1)."""
  return 1.0 + float(np.sum(np.cumprod(np.asarray(acceptance, np.float64)[:k])))


def theorem_speedup(alpha: float, k: int, c: float) -> float:
  """Leviathan et al. Theorem 3.8: (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1))."""
  return expected_tokens(alpha, k) / (k * c + 1.0)


def measured_cost_speedup(alpha: float, k: int, draft_step_s: float, verify_s: float,
                          target_step_s: float, overhead_s: float = 0.0) -> float:
  """Expected tokens per round over the round's measured cost, in target steps."""
  return expected_tokens(alpha, k) * target_step_s / (k * draft_step_s + verify_s + overhead_s)


def alpha_from_tokens_per_round(tokens_per_round: float, k: int) -> float:
  """Inverts E(alpha, K) = tokens_per_round for alpha in [0, 1] (bisection)."""
  target = float(np.clip(tokens_per_round, 1.0, k + 1.0))
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if expected_tokens(mid, k) < target else (lo, mid)
  return 0.5 * (lo + hi)


def best_k(alpha: float, c: float, max_k: int = 8) -> int:
  """The K in [1, max_k] with the largest Theorem 3.8 speedup."""
  return int(max(range(1, max_k + 1), key=lambda k: theorem_speedup(alpha, k, c)))
