"""Verifiers: which drafted tokens to keep, and which token comes next.

Exact rules (the output follows the target's distribution; greedy: its exact tokens):

- `Greedy` accepts while the drafted token equals the target's argmax and emits the target's
  argmax at the first mismatch (temperature 0).
- `Exact` is modified rejection sampling, Leviathan et al. 2023, "Fast Inference from Transformers
  via Speculative Decoding", Algorithm 1 (Section 2.3), equivalently Chen et al. 2023, Algorithm 2:
  drafted token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
  rejection the replacement is drawn from norm(max(0, p_i - q_i)); past the drafted tokens (all
  accepted, or `num_proposed` reached) a token is drawn from p itself.
- `Coupled` is drafter-invariant speculative sampling (Daliri, Musco, Suresh 2024,
  arXiv 2408.07978, the Gumbel-max coupling): every position's token is the Gumbel-max of p under
  the row's noise for that position, the draft draws its token with the same noise, and a drafted
  token is accepted iff it equals the target's own. The output is then token for token plain
  sampling with the same seed, whatever the draft and K. It accepts less than `Exact` (a drafted
  token is accepted with probability P(both Gumbel-maxes agree) <= sum_x min(p(x), q(x))).

Relaxed rules (`lossy = True`): the output does NOT follow the target's distribution. They exist
only when asked for by name, and the CLI prints them as lossy.

- `Mixture(weight)` accepts against r = w p + (1 - w) q instead of p (the rule of transformers'
  `assistant_ensemble_weight`).
- `TypicalAcceptance(epsilon, delta)`: Medusa's typical acceptance (Cai et al. 2024, Sec. 3.3.1).

In every rule, positions at or after a row's `num_proposed` are not drafted: the target samples
there itself. Non-finite numbers are not handled here; the loop stops such rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec import noise
from jaxspec.contracts import Proposal
from jaxspec.sampling import SamplingConfig, process_logits


def _check_shapes(draft_tokens, p_or_logits, q=None):
  b, k = draft_tokens.shape
  if p_or_logits.shape[:2] != (b, k + 1):
    raise ValueError(f'target distributions must be [B, K+1, V] = [{b}, {k + 1}, V], got '
                     f'{p_or_logits.shape}')
  if q is not None and q.shape != (b, k, p_or_logits.shape[-1]):
    raise ValueError(f'draft distributions must be [B, K, V] = [{b}, {k}, '
                     f'{p_or_logits.shape[-1]}], got {q.shape}')


def _prefix_length(accepted_BK, num_proposed_B):
  """Length of the accepted prefix, never past num_proposed: `[B,K]` bool -> `[B]` int32."""
  k = accepted_BK.shape[1]
  accepted = accepted_BK & (jnp.arange(k)[None] < num_proposed_B[:, None])
  return jnp.sum(jnp.cumprod(accepted, axis=1), axis=1).astype(jnp.int32)


def _full(draft_tokens, num_proposed):
  if num_proposed is None:
    return jnp.full(draft_tokens.shape[:1], draft_tokens.shape[1], jnp.int32)
  return num_proposed.astype(jnp.int32)


def _at(x_BWV, index_B):
  return jnp.take_along_axis(x_BWV, index_B[:, None, None], axis=1)[:, 0]


def _prob_of(probs_BKV, tokens_BK):
  safe = jnp.clip(tokens_BK, 0, probs_BKV.shape[-1] - 1)
  return jnp.take_along_axis(probs_BKV, safe[..., None], axis=-1)[..., 0]


def _accept_matching(draft_tokens, target_tokens, num_proposed):
  """Accepts the drafted prefix equal to the target's own tokens `[B,W]`; the next token is the
  target's at the first mismatch (or right after the drafted tokens)."""
  k = draft_tokens.shape[1]
  n = _prefix_length(draft_tokens == target_tokens[:, :k], _full(draft_tokens, num_proposed))
  return n, jnp.take_along_axis(target_tokens, n[:, None], axis=1)[:, 0]


def verify_greedy(draft_tokens: jax.Array, target_logits: jax.Array,
                  num_proposed: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Greedy verification: accept the longest prefix equal to the target's argmax.

  Args:
    draft_tokens: `[B,K]` int32.
    target_logits: `[B,K+1,V]` float (logits or probabilities; only the argmax is used).
    num_proposed: `[B]` int32 in [0, K], default K.
  Returns:
    (num_accepted `[B]` int32, next_token `[B]` int32 = the target's argmax right after the
    accepted prefix).
  Raises:
    ValueError: on inconsistent shapes (at trace time).
  """
  _check_shapes(draft_tokens, target_logits)
  target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, K+1]
  return _accept_matching(draft_tokens, target_tokens, num_proposed)


def verify_exact(rows: noise.RowNoise, draft_tokens: jax.Array, q: jax.Array, p: jax.Array,
                 num_proposed: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Modified rejection sampling over one drafted window (Leviathan et al. 2023, Alg. 1).

  Args:
    rows: the rows' noise (ACCEPT stream for the tests, TARGET stream for the next token).
    draft_tokens: `[B,K]` int32; x_i must have been drawn from q_i.
    q: `[B,K,V]` float32, the processed draft distributions.
    p: `[B,K+1,V]` float32, the processed target distributions at the window's positions.
    num_proposed: `[B]` int32 in [0, K], default K.
  Returns:
    (num_accepted `[B]` int32, next_token `[B]` int32): the replacement at the first rejection,
    or a draw from p right after the drafted tokens.
  Raises:
    ValueError: on inconsistent shapes (at trace time).
  """
  _check_shapes(draft_tokens, p, q)
  k = draft_tokens.shape[1]
  num_proposed = _full(draft_tokens, num_proposed)
  u = rows.uniform(noise.ACCEPT, k)
  accepted = u * _prob_of(q, draft_tokens) < _prob_of(p[:, :k], draft_tokens)  # u < p/q
  n = _prefix_length(accepted, num_proposed)
  residual = jnp.maximum(p[:, :k] - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # A rejection implies p_i(x_i) < q_i(x_i), hence mass > 0; the fallback only guards round-off.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p[:, :k])
  residual = jnp.pad(residual, ((0, 0), (0, 1), (0, 0)))
  dist = jnp.where((n < num_proposed)[:, None], _at(residual, n), _at(p, n))
  return n, rows.gumbel_max(noise.TARGET, n, dist)


def _target_tokens_coupled(rows: noise.RowNoise, p):
  """The target's Gumbel-max token at every window position: `[B,W,V]` -> `[B,W]` int32."""
  w = p.shape[1]
  return jax.vmap(lambda j, p_j: rows.gumbel_max(noise.TARGET, jnp.full_like(rows.positions, j),
                                                 p_j), in_axes=(0, 1), out_axes=1)(
                                                     jnp.arange(w), p)


@dataclasses.dataclass(frozen=True)
class Greedy:
  """Temperature 0: the target's exact greedy tokens. Exact."""

  lossy = False
  draft_stream = noise.DRAFT

  def __call__(self, rows, proposal: Proposal, logits, sampling: SamplingConfig):
    del rows, sampling
    return verify_greedy(proposal.tokens, logits, proposal.num_proposed)


@dataclasses.dataclass(frozen=True)
class Exact:
  """Modified rejection sampling (Leviathan et al. 2023, Alg. 1); the default for sampling.
  Exact: the output follows the target's processed distribution."""

  lossy = False
  draft_stream = noise.DRAFT

  def __call__(self, rows, proposal: Proposal, logits, sampling: SamplingConfig):
    return verify_exact(rows, proposal.tokens, proposal.q, process_logits(logits, sampling),
                        proposal.num_proposed)


@dataclasses.dataclass(frozen=True)
class Coupled:
  """Drafter-invariant speculative sampling (Daliri, Musco, Suresh 2024, arXiv 2408.07978).
  Exact, and more: the tokens equal plain sampling's with the same seeds, for any draft and K."""

  lossy = False
  draft_stream = noise.TARGET

  def __call__(self, rows, proposal: Proposal, logits, sampling: SamplingConfig):
    _check_shapes(proposal.tokens, logits, proposal.q)
    target_tokens = _target_tokens_coupled(rows, process_logits(logits, sampling))
    return _accept_matching(proposal.tokens, target_tokens, proposal.num_proposed)


@dataclasses.dataclass(frozen=True)
class Mixture:
  """LOSSY. Modified rejection sampling against r = w p + (1 - w) q instead of p (the rule of
  transformers' `assistant_ensemble_weight`).

  What is lost: a drafted position's token follows r, not p, so its total variation from the
  target is exactly (1 - w) TV(p, q) <= 1 - w given the same prefix; a position past the drafted
  tokens is drawn from p. `weight = 1` is `Exact`.

  Raises:
    ValueError: weight outside (0, 1].
  """

  weight: float
  lossy = True
  draft_stream = noise.DRAFT

  def __post_init__(self):
    if not 0 < self.weight <= 1:
      raise ValueError(f'mixture weight must be in (0, 1] (1 = exact), got {self.weight}')

  def __call__(self, rows, proposal: Proposal, logits, sampling: SamplingConfig):
    p = process_logits(logits, sampling)
    k = proposal.tokens.shape[1]
    r = jnp.concatenate([self.weight * p[:, :k] + (1 - self.weight) * proposal.q, p[:, k:]], 1)
    return verify_exact(rows, proposal.tokens, proposal.q, r, proposal.num_proposed)


@dataclasses.dataclass(frozen=True)
class TypicalAcceptance:
  """LOSSY. Medusa's typical acceptance (Cai et al. 2024, Sec. 3.3.1): drafted token x_i is
  accepted iff p_i(x_i) > min(epsilon, delta * exp(-H(p_i))), H the entropy of p_i in nats; the
  token after the accepted prefix is drawn from p.

  What is lost: with A_i the accepted set, position i's token follows q_i restricted to A_i plus
  q_i(not A_i) p_i, not p_i; its total variation from the target is at most q_i(A_i) (the mass
  the draft puts on accepted tokens) given the same prefix.

  Raises:
    ValueError: epsilon outside (0, 1] or delta < 0.
  """

  epsilon: float
  delta: float
  lossy = True
  draft_stream = noise.DRAFT

  def __post_init__(self):
    if not 0 < self.epsilon <= 1 or not self.delta >= 0:
      raise ValueError(f'typical acceptance needs epsilon in (0, 1] and delta >= 0, got '
                       f'epsilon={self.epsilon}, delta={self.delta}')

  def accepted_set(self, p: jax.Array) -> jax.Array:
    """`[..., V]` float32 probs -> `[..., V]` bool, the tokens this rule accepts."""
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)
    threshold = jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy))
    return p > threshold[..., None]

  def __call__(self, rows, proposal: Proposal, logits, sampling: SamplingConfig):
    p = process_logits(logits, sampling)
    k = proposal.tokens.shape[1]
    ok = jnp.take_along_axis(self.accepted_set(p[:, :k]),
                             jnp.clip(proposal.tokens, 0, p.shape[-1] - 1)[..., None], -1)[..., 0]
    n = _prefix_length(ok, proposal.num_proposed)
    return n, rows.gumbel_max(noise.TARGET, n, _at(p, n))


def parse_verifier(spec: str):
  """`exact | coupled | mixture:W | typical:EPS,DELTA` -> a verifier for sampling (greedy is
  temperature 0, not a name here).

  Raises:
    ValueError: an unknown name or a malformed or out-of-range parameter, naming the choices.
  """
  name, _, arg = spec.partition(':')
  forms = {'exact': 'exact', 'coupled': 'coupled', 'mixture': 'mixture:W',
           'typical': 'typical:EPS,DELTA'}
  try:
    if name in ('exact', 'coupled') and not arg:
      return {'exact': Exact, 'coupled': Coupled}[name]()
    if name == 'mixture' and arg:
      return Mixture(float(arg))
    if name == 'typical' and arg.count(',') == 1:
      eps, delta = arg.split(',')
      return TypicalAcceptance(float(eps), float(delta))
  except ValueError as e:
    raise ValueError(f'bad verifier {spec!r}: {e}') from None
  if name in forms:
    raise ValueError(f'bad verifier {spec!r}: write it as {forms[name]}')
  raise ValueError(f'unknown verifier {spec!r}; choices: exact, coupled, mixture:W (lossy), '
                   'typical:EPS,DELTA (lossy); temperature 0 is greedy')
