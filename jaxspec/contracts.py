"""The contracts between the loop and what plugs into it: a model, a draft, a verifier, a
schedule.

Shape letters, used in every name, docstring and einsum of the package:

  B  batch (rows)                     P  padded prompt length (a shape bucket)
  T  new tokens in one forward pass   K  drafted tokens per round (the paper's gamma)
  W  window width, K + 1              S  buffer / KV-cache length (`buffer_length`)
  V  vocabulary                       D  feature (model) width

Token ids are int32, positions are absolute indices into a row's buffer (prompt first), and
distributions (`probs`, `q`, `p`) are float32 and sum to 1 over V.

Each contract is a `typing.Protocol` with one signature per method. Drafts and verifiers are
hashable frozen dataclasses, since they are static arguments of the compiled loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxspec import noise
from jaxspec.sampling import SamplingConfig


def buffer_length(prompt_len: int, max_new_tokens: int, num_draft_tokens: int) -> int:
  """S, the length of the token buffer and of every KV cache: `P + max_new_tokens + K + 1`.

  A row's last round can start with `max_new_tokens - 1` tokens generated and write a window of
  K + 1 positions, so no write ever clamps at the end of the buffer."""
  return prompt_len + max_new_tokens + num_draft_tokens + 1


@runtime_checkable
class Model(Protocol):
  """A language model as the loop sees it (target or draft)."""

  def __call__(self, params: Any, tokens: jax.Array, cache: Any,
               start: jax.Array) -> tuple[jax.Array, Any]:
    """tokens `[B,T]` int32 written at positions `start [B] .. start+T-1` -> (logits `[B,T,V]`
    float32, cache). Reads cache entries before each query's position only."""

  def init_cache(self, batch_size: int, buffer_len: int) -> Any:
    """A zeroed cache pytree of fixed shapes for `batch_size` rows of `buffer_len` positions."""


@runtime_checkable
class FeatureModel(Model, Protocol):
  """A target that also returns the features its head reads (what EAGLE drafts consume)."""

  def with_features(self, params: Any, tokens: jax.Array, cache: Any,
                    start: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
    """Like `__call__`, plus features `[B,T,D]`."""


@dataclasses.dataclass(frozen=True)
class Prefill:
  """What a draft gets at the start: the prompts `[B,P]` int32 and lengths `[B]` int32, the
  buffer length S, K, and the target's features of the prompt `[B,P,D]` (None unless the draft
  declares `uses_target_features`)."""

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  buffer_len: int
  num_draft_tokens: int
  features: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class DraftContext:
  """What a draft sees each round.

  Attributes:
    tokens: `[B,S]` int32, the buffer; row b's committed sequence is `tokens[b, :lengths[b]]`.
    lengths: `[B]` int32, L; drafted token i (0-based) will sit at position L + i.
    target_cache: the target's KV cache (a self-speculative draft may write into it and return
      it in its `Proposal`; the verify pass overwrites what it wrote).
    keys: `[B]` PRNG keys, one per row (see `jaxspec.noise`).
    num_draft_tokens: K.
    sampling: the rule that turns the draft's logits into its q.
    vocab_size: the target's V; q must have this width.
    draft_stream: the noise stream the verifier wants the draft to draw with.
    min_confidence: early stop: a row stops proposing after a token drawn from a distribution
      whose largest probability (the draft's own softmax, before temperature, top-k and top-p)
      is below this; 0 = never (see `stops`). num_draft_tokens may be 0 under a schedule: the
      draft then proposes nothing but may update its state (a catch-up forward pass).
  """

  tokens: jax.Array
  lengths: jax.Array
  target_cache: Any
  keys: jax.Array
  num_draft_tokens: int
  sampling: SamplingConfig
  vocab_size: int
  draft_stream: int
  min_confidence: float = 0.0

  def stops(self, logits: jax.Array) -> jax.Array:
    """Whether each row stops after the token drawn from these draft logits `[B,V]` -> `[B]`
    bool: max softmax(logits) < `min_confidence` (the draft confidence rule of transformers'
    `assistant_confidence_threshold` and llama.cpp's `p_min`). It reads only the draft's
    distribution, so every verifier stays exact (a stopping time of the draft's own process)."""
    if self.min_confidence <= 0:
      return jnp.zeros(logits.shape[:1], bool)
    return jnp.max(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), -1) < self.min_confidence

  def draw(self, i: jax.Array | int, q: jax.Array) -> jax.Array:
    """Draws drafted token i (0-based) of every row from its q `[B,V]` -> `[B]` int32: the argmax
    when greedy, else a Gumbel-max sample with the row's noise for position L + i."""
    if self.sampling.greedy:
      return q.argmax(axis=-1).astype('int32')
    return noise.gumbel_max(self.keys, self.draft_stream, self.lengths + i, q)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Proposal:
  """A draft's answer for one round.

  Attributes:
    tokens: `[B,K]` int32 drafted tokens; entries at or after `num_proposed` are ignored.
    q: `[B,K,V]` float32, the processed distributions the tokens were drawn from.
    num_proposed: `[B]` int32 in [0, K]: positions at or after it count as not drafted (the
      target then samples there itself).
    state: the draft's state for the next round.
    target_cache: the target's cache, as the draft leaves it (unchanged for most drafts).
  """

  tokens: jax.Array
  q: jax.Array
  num_proposed: jax.Array
  state: Any
  target_cache: Any


@dataclasses.dataclass(frozen=True)
class Scored:
  """The target's verify pass over the window: logits `[B,W,V]` float32 at positions
  `start [B] .. start+K` (start = L - 1), and its features `[B,W,D]` (None unless the draft
  declares `uses_target_features`)."""

  logits: jax.Array
  start: jax.Array
  features: jax.Array | None = None


class Draft(Protocol):
  """Proposes up to K tokens a round with the distributions q they were drawn from.

  `uses_target_features` (a class attribute) says whether the loop must hand the draft the
  target's features at prefill (`Prefill.features`) and after every verify pass
  (`Scored.features`); the target must then be a `FeatureModel`. Subclass this protocol to
  inherit the defaults (no features, `observe` keeps the state).

  A draft's cache, like the target's, rolls back by the length pointer alone: entries at or past
  a row's committed length are rewritten before they are read.
  """

  uses_target_features = False

  def init(self, params: Any, prefill: Prefill) -> Any:
    """The draft's state after the prompt (e.g. a prefilled KV cache), or None."""

  def ready(self, params: Any, state: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """`[B]` bool: the rows this draft will propose for in the coming round (`propose` gives the
    others `num_proposed` 0), decided from the committed tokens (`tokens [B,S]` int32, `lengths
    [B]` int32) and the draft's own state only, so a schedule may pick K from it and every exact
    verifier stays exact. Default: every row (a model always has a proposal); n-gram lookup is
    ready where a match exists (vLLM and transformers propose nothing without one)."""
    del params, state, tokens
    return jnp.ones(lengths.shape, bool)

  def propose(self, params: Any, state: Any, ctx: DraftContext) -> Proposal:
    """Drafts K tokens for every row; each token must be drawn with `ctx.draw` from the q that
    is returned."""

  def observe(self, state: Any, scored: Scored) -> Any:
    """Takes what the target's verify pass computed; returns the next state."""
    del scored
    return state


@runtime_checkable
class DeterministicDraft(Draft, Protocol):
  """A draft whose proposal is a function of the committed tokens alone, with one-hot q (n-gram
  lookup). It can say which token it would draft first without drafting, so a plain round (K =
  0, under a schedule) checks that token against the one the target commits
  (`Metrics.plain_checked`, `plain_matched`): the schedule keeps observing the draft's
  acceptance while it drafts nothing, at no cost.
  """

  def first_token(self, params: Any, state: Any, tokens: jax.Array,
                  lengths: jax.Array) -> jax.Array:
    """`[B]` int32: the token `propose` would draft first for each row from the committed tokens
    (`tokens [B,S]` int32, `lengths [B]` int32), -1 where it would draft nothing (the row is not
    `ready`)."""


@runtime_checkable
class Verifier(Protocol):
  """An acceptance rule: which drafted tokens to keep and which token comes next.

  `lossy` (a class attribute) is False for rules whose output follows the target's distribution
  exactly; `draft_stream` names the noise the draft must draw with (`jaxspec.noise`).
  """

  lossy: bool
  draft_stream: int

  def __call__(self, rows: noise.RowNoise, proposal: Proposal, logits: jax.Array,
               sampling: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """rows: the noise of each row at positions L..L+K; proposal: the drafted window; logits:
    the target's `[B,W,V]` logits -> (num_accepted `[B]` int32 in [0, num_proposed], next token
    `[B]` int32)."""


@runtime_checkable
class Schedule(Protocol):
  """Picks each round's K (the number of tokens drafted) inside the compiled loop.

  The loop compiles one branch per K in `branches(K_max)` (one runs per round: shapes stay fixed and
  nothing recompiles) and each round runs the branch `choose` returns; `update` then sees the
  metrics before and after the round. State is a pytree carried in the loop. K depends only on
  rounds already committed and on the draft's readiness (itself a function of them), so every
  exact verifier stays exact.
  """

  def branches(self, max_draft_tokens: int) -> tuple[int, ...]:
    """The K values a round may use, ascending, each in [0, max_draft_tokens]."""

  def init(self, batch_size: int, max_draft_tokens: int) -> Any:
    """The schedule's state before the first round."""

  def choose(self, state: Any, active: jax.Array, ready: jax.Array) -> jax.Array:
    """active `[B]` bool (rows still decoding), ready `[B]` bool (rows the draft will propose
    for, `Draft.ready`) -> int32 scalar, an index into `branches`."""

  def update(self, state: Any, before: Any, after: Any, active: jax.Array,
             ready: jax.Array) -> Any:
    """The state after a round, from the `jaxspec.metrics.Metrics` before and after it, and the
    round's active and ready rows (as `choose` saw them)."""
