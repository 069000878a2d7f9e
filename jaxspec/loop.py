"""The decode loop: prefill, then draft-then-verify rounds in one `lax.while_loop`.

Invariants (per row b, with L = lengths[b]):
- `tokens[b, :L]` is the committed sequence (prompt, then generated tokens); every position at or
  after L holds `pad_id`. Finished rows stop changing.
- The target's KV cache holds valid entries for positions `< L - 1`; the last committed token is
  fed at the start of the next round. Rejected draft entries are left in place and are never read:
  rolling back is moving L. Cache and buffer have the same fixed length S (`buffer_length`), so
  no write ever clamps.

A round (Leviathan et al. 2023, Alg. 1) has four parts: `propose` (the draft proposes up to K
tokens with their distributions q), `score` (the target scores `[x_{L-1}, d_1..d_K]` in one
forward pass at positions L-1..L+K-1), `verify` (the verifier accepts n drafted tokens and yields
one more) and `commit` (n + 1 tokens are written, cut at the first EOS and at the token budget;
a row whose numbers went bad where it samples stops there). K = 0 is plain decoding.

With a `Schedule` (`jaxspec.schedule`) each round runs one of several compiled rounds, one per K
in the schedule's branches (each a while loop of 0 or 1 trips); state shapes are those of the
largest K, so nothing recompiles. A draft may also stop early per row
(`DecodeConfig.min_draft_confidence`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import noise
from jaxspec.control import run_if
from jaxspec.contracts import (DeterministicDraft, Draft, DraftContext, FeatureModel, Model,
                               Prefill, Proposal, Schedule, Scored, Verifier, buffer_length)
from jaxspec.metrics import Metrics
from jaxspec.sampling import SamplingConfig
from jaxspec.verify import Exact, Greedy

RUNNING, EOS, LENGTH, NONFINITE = 0, 1, 2, 3
FINISH_REASONS = ('running', 'eos', 'length', 'nonfinite')


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
  """Decoding settings (static: each distinct config compiles once).

  Attributes:
    num_draft_tokens: K (the paper's gamma), tokens drafted per round; 0 = plain decoding. Under
      a schedule, the largest K a round may use.
    max_new_tokens: most tokens generated per row, EOS included.
    sampling: how logits become distributions (temperature 0 = greedy).
    verifier: the acceptance rule; None = `Greedy` at temperature 0, else `Exact`. A lossy rule
      (`Mixture`, `TypicalAcceptance`) is used only when given here by name.
    eos_id: a row stops after committing this token; None = never.
    pad_id: fills the token buffer past each row's length.
    context_length: the model's context in tokens; a buffer (`buffer_length`) longer than this is
      rejected before any work. None = unchecked.
    schedule: picks each round's K in [0, num_draft_tokens] (`jaxspec.schedule.CostModel`,
      `Heuristic`); None = K = num_draft_tokens every round.
    min_draft_confidence: per-row early stop: a row's draft stops after a token whose draft
      distribution's largest probability is below this (`DraftContext.stops`); 0 = never.
  Raises:
    ValueError: num_draft_tokens < 0, max_new_tokens < 1, min_draft_confidence outside [0, 1],
      a schedule that is not a `Schedule` or lacks a draft's K (num_draft_tokens 0), or a
      verifier that is not a `Verifier`, a lossy one at temperature 0, or `Greedy` at
      temperature > 0.
  """

  num_draft_tokens: int = 4
  max_new_tokens: int = 128
  sampling: SamplingConfig = SamplingConfig()
  verifier: Verifier | None = None
  eos_id: int | None = None
  pad_id: int = 0
  context_length: int | None = None
  schedule: Schedule | None = None
  min_draft_confidence: float = 0.0

  def __post_init__(self):
    if self.num_draft_tokens < 0:
      raise ValueError(f'num_draft_tokens must be >= 0 (0 = plain decoding), got '
                       f'{self.num_draft_tokens}')
    if self.max_new_tokens < 1:
      raise ValueError(f'max_new_tokens must be >= 1, got {self.max_new_tokens}')
    if not 0 <= self.min_draft_confidence <= 1:
      raise ValueError(f'min_draft_confidence must be in [0, 1] (0 = no early stop), got '
                       f'{self.min_draft_confidence}')
    if self.schedule is not None:
      if not isinstance(self.schedule, Schedule):
        raise ValueError(f'schedule must be a jaxspec schedule (CostModel, Heuristic), got '
                         f'{self.schedule!r}')
      if self.num_draft_tokens < 1:
        raise ValueError('a schedule needs num_draft_tokens >= 1, the largest K it may pick')
      self.schedule.branches(self.num_draft_tokens)  # raises on a K past num_draft_tokens
    if self.verifier is not None and not isinstance(self.verifier, Verifier):
      raise ValueError(f'verifier must be a jaxspec verifier (Greedy, Exact, Coupled, Mixture, '
                       f'TypicalAcceptance), got {self.verifier!r}')
    if not self.sampling.greedy and isinstance(self.verifier, Greedy):
      raise ValueError(f'the Greedy verifier needs temperature 0, got temperature '
                       f'{self.sampling.temperature} (use Exact or Coupled to sample)')
    if self.sampling.greedy and self.verifier is not None and self.verifier.lossy:
      raise ValueError(f'temperature 0 is greedy decoding; the lossy verifier {self.verifier!r} '
                       'applies to sampling (temperature > 0) only')

  @property
  def rule(self) -> Verifier:
    """The verifier in force: `Greedy` at temperature 0 (exact and coupled rules reduce to it),
    the configured one otherwise (default `Exact`)."""
    if self.sampling.greedy:
      return Greedy()
    return self.verifier or Exact()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Loop state, a pytree. tokens `[B,S]` int32; lengths, prompt_lengths `[B]` int32; finish
  `[B]` int32 (`RUNNING`, `EOS`, `LENGTH` or `NONFINITE`); target_cache and draft_state as the
  model and draft define them; keys `[B]` the rows' PRNG keys (`jaxspec.noise`); schedule the
  schedule's state (None without one)."""

  tokens: jax.Array
  lengths: jax.Array
  prompt_lengths: jax.Array
  finish: jax.Array
  target_cache: Any
  draft_state: Any
  keys: jax.Array
  metrics: Metrics
  schedule: Any = None

  @property
  def done(self) -> jax.Array:
    return self.finish != RUNNING


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeResult:
  """What `generate` returns: tokens `[B,S]` int32 (row b's output is
  `tokens[b, prompt_lengths[b]:lengths[b]]`), lengths and prompt_lengths `[B]`, finish `[B]`
  int32 codes, metrics."""

  tokens: jax.Array
  lengths: jax.Array
  prompt_lengths: jax.Array
  finish: jax.Array
  metrics: Metrics

  def new_tokens(self) -> list[list[int]]:
    """Generated token ids per row (host side)."""
    t, n, p = (np.asarray(x) for x in (self.tokens, self.lengths, self.prompt_lengths))
    return [t[b, p[b]:n[b]].tolist() for b in range(t.shape[0])]

  def finish_reasons(self) -> list[str]:
    """Per row: 'eos' (committed the EOS), 'length' (reached max_new_tokens) or 'nonfinite' (the
    target's or draft's numbers were NaN/inf where the row sampled; it stopped before them)."""
    return [FINISH_REASONS[c] for c in np.asarray(self.finish).tolist()]


def _write_rows(buffer_BS, window_BW, start_B):
  return jax.vmap(lambda r, w, s: jax.lax.dynamic_update_slice_in_dim(r, w, s, axis=0))(
      buffer_BS, window_BW, start_B)


def _feature_target(target, draft) -> bool:
  """Whether the loop must run `target.with_features` (raises when the target cannot)."""
  if draft is None or not draft.uses_target_features:
    return False
  if not isinstance(target, FeatureModel):
    raise ValueError(f'the draft reads the target\'s features, but the target '
                     f'{type(target).__name__} has no with_features method')
  return True


def _plain_only(config: DecodeConfig) -> bool:
  """Whether a schedule left only K = 0 to compile (no K can pay): plain decoding's program."""
  return (config.schedule is not None
          and config.schedule.branches(config.num_draft_tokens) == (0,))


def init_state(target_params, draft_params, prompt_tokens, prompt_lengths, keys, *,
               target: Model, draft: Draft | None, config: DecodeConfig) -> DecodeState:
  """Allocates the buffer and caches and prefills target (and draft) with the prompts. Under a
  schedule whose only branch is K = 0 (`Schedule.branches`: no K can pay), the state is plain
  decoding's: no draft state, no target features, a buffer without the draft window.

  Args:
    prompt_tokens: `[B,P]` int32, each row right-padded; P is the shape bucket.
    prompt_lengths: `[B]` int32 in [1, P].
    keys: `[B]` PRNG keys, one per row (`jaxspec.noise.row_keys`).
  """
  k = max_k = config.num_draft_tokens
  if _plain_only(config):
    draft, k = None, 0
  b, p = prompt_tokens.shape
  s = buffer_length(p, config.max_new_tokens, k)
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  tokens = jnp.pad(prompt_tokens.astype(jnp.int32), ((0, 0), (0, s - p)))
  tokens = jnp.where(jnp.arange(s)[None] < prompt_lengths[:, None], tokens, config.pad_id)
  # Prefill writes every prompt position; entries at and after L-1 are rewritten before use.
  cache, start = target.init_cache(b, s), jnp.zeros((b,), jnp.int32)
  features = None
  if _feature_target(target, draft):
    _, target_cache, features = target.with_features(target_params, prompt_tokens, cache, start)
  else:
    _, target_cache = target(target_params, prompt_tokens, cache, start)
  draft_state = None
  if draft is not None:
    draft_state = draft.init(draft_params, Prefill(prompt_tokens, prompt_lengths, s, k, features))
  schedule = config.schedule and config.schedule.init(b, max_k)
  return DecodeState(tokens=tokens, lengths=prompt_lengths, prompt_lengths=prompt_lengths,
                     finish=jnp.zeros((b,), jnp.int32), target_cache=target_cache,
                     draft_state=draft_state, keys=keys, metrics=Metrics.zeros(b, max_k),
                     schedule=schedule)


def propose(state: DecodeState, draft_params, vocab_size: int, *, draft: Draft | None,
            config: DecodeConfig) -> Proposal:
  """Part 1: the draft's proposal (an empty one without a draft). Drafted ids outside [0, V) end the
  row's proposal there (they count as not drafted) and are replaced by 0 before the target reads
  them, so that no out-of-range id reaches an embedding lookup.

  Raises:
    ValueError: at trace time, when the draft's vocabulary differs from the target's.
  """
  k, b = config.num_draft_tokens, state.tokens.shape[0]
  if draft is None:
    return Proposal(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, vocab_size), jnp.float32),
                    jnp.zeros((b,), jnp.int32), state.draft_state, state.target_cache)
  ctx = DraftContext(state.tokens, state.lengths, state.target_cache, state.keys, k,
                     config.sampling, vocab_size, config.rule.draft_stream,
                     config.min_draft_confidence)
  proposal = draft.propose(draft_params, state.draft_state, ctx)
  if proposal.q.shape[-1] != vocab_size:
    raise ValueError(f'vocabulary mismatch: the draft has {proposal.q.shape[-1]} tokens, the '
                     f'target {vocab_size}; the draft must share the target\'s vocabulary')
  if k == 0:
    return proposal
  valid = (proposal.tokens >= 0) & (proposal.tokens < vocab_size)
  first_invalid = jnp.where(jnp.all(valid, 1), k, jnp.argmin(valid, 1)).astype(jnp.int32)
  return dataclasses.replace(proposal, tokens=jnp.where(valid, proposal.tokens, 0),
                             num_proposed=jnp.minimum(proposal.num_proposed, first_invalid))


def score(state: DecodeState, proposal: Proposal, target_params, *, target: Model,
          draft: Draft | None, config: DecodeConfig) -> tuple[Scored, Any]:
  """Part 2: the target's one forward pass over `[x_{L-1}, d_1..d_K]`; returns (Scored with
  logits `[B,W,V]`, the target's cache)."""
  last = jnp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)
  window = jnp.concatenate([last, proposal.tokens], axis=1)
  start = state.lengths - 1
  if _feature_target(target, draft):
    logits, cache, features = target.with_features(target_params, window,
                                                   proposal.target_cache, start)
    return Scored(logits, start, features), cache
  logits, cache = target(target_params, window, proposal.target_cache, start)
  return Scored(logits, start), cache


def verify(state: DecodeState, proposal: Proposal, scored: Scored, *,
           config: DecodeConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Part 3: the verifier's verdict, and where each row's numbers went bad.

  Returns (num_accepted `[B]`, next_token `[B]`, first_bad `[B]` int32: the first window index
  whose target logits hold NaN or +inf or no finite value, or whose q (a drafted one) is not
  finite; W when none is)."""
  rows = noise.RowNoise(state.keys, state.lengths)
  num_accepted, next_token = config.rule(rows, proposal, scored.logits, config.sampling)
  logits, k = scored.logits, config.num_draft_tokens
  bad = (jnp.any(jnp.isnan(logits) | (logits == jnp.inf), -1) |
         jnp.all(logits == -jnp.inf, -1))  # [B, W]
  drafted = jnp.arange(k)[None] < proposal.num_proposed[:, None]
  bad_q = jnp.any(~jnp.isfinite(proposal.q), -1) & drafted
  bad = bad | jnp.pad(bad_q, ((0, 0), (0, 1)))
  first_bad = jnp.where(jnp.any(bad, 1), jnp.argmax(bad, 1), k + 1).astype(jnp.int32)
  return num_accepted, next_token, first_bad


def commit(state: DecodeState, proposal: Proposal, num_accepted, next_token, first_bad, *,
           config: DecodeConfig) -> tuple[jax.Array, jax.Array, jax.Array, Metrics]:
  """Part 4: writes drafted[:n] + next_token, cut after the first EOS and at the token budget; a
  row whose first bad index is <= n keeps the drafted tokens before it and ends `NONFINITE`.

  Returns (tokens `[B,S]`, lengths `[B]`, finish `[B]`, metrics)."""
  k, b = config.num_draft_tokens, state.tokens.shape[0]
  lengths, active = state.lengths, ~state.done
  went_bad = first_bad <= num_accepted
  num_kept = jnp.where(went_bad, first_bad, num_accepted)  # drafted tokens kept
  emit = num_kept + (~went_bad)  # window tokens to write before the EOS and budget cuts
  idx = jnp.arange(k + 1)
  new = jnp.where(idx[None] < num_accepted[:, None], jnp.pad(proposal.tokens, ((0, 0), (0, 1))),
                  next_token[:, None])
  eos_at = jnp.full((b,), k + 1)  # index of the first committed EOS in the window
  if config.eos_id is not None:
    is_eos = (new == config.eos_id) & (idx[None] < emit[:, None])
    eos_at = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), eos_at)
  budget = config.max_new_tokens - (lengths - state.prompt_lengths)
  num_committed = jnp.where(active, jnp.minimum(jnp.minimum(emit, eos_at + 1), budget), 0)
  tokens = _write_rows(state.tokens, jnp.where(idx[None] < num_committed[:, None], new,
                                               config.pad_id), lengths)
  new_lengths = lengths + num_committed
  finish = jnp.select(
      [~active, eos_at < num_committed, new_lengths - state.prompt_lengths >= config.max_new_tokens,
       went_bad], [state.finish, EOS, LENGTH, NONFINITE], RUNNING).astype(jnp.int32)
  cut_short = num_committed < num_kept + 1
  num_drafted = jnp.where(cut_short, jnp.minimum(num_committed, proposal.num_proposed),
                          proposal.num_proposed)
  metrics = state.metrics.update(active, num_drafted, jnp.minimum(num_kept, num_committed),
                                 num_committed, k)
  return tokens, new_lengths, finish, metrics


def speculative_step(state: DecodeState, target_params, draft_params, *, target: Model,
                     draft: Draft | None, config: DecodeConfig) -> DecodeState:
  """One draft-then-verify round for every row (a pure function: state -> state): `propose`,
  `score`, `verify`, `commit`.

  Raises:
    ValueError: at trace time, when the draft's vocabulary differs from the target's.
  """
  last = state.tokens[:, :1]
  vocab_size = jax.eval_shape(target, target_params, last, state.target_cache,
                              state.lengths)[0].shape[-1]
  proposal = propose(state, draft_params, vocab_size, draft=draft, config=config)
  scored, target_cache = score(state, proposal, target_params, target=target, draft=draft,
                               config=config)
  draft_state = proposal.state
  if draft is not None:
    draft_state = draft.observe(draft_state, scored)
  num_accepted, next_token, first_bad = verify(state, proposal, scored, config=config)
  tokens, lengths, finish, metrics = commit(state, proposal, num_accepted, next_token, first_bad,
                                            config=config)
  return dataclasses.replace(state, tokens=tokens, lengths=lengths, finish=finish,
                             target_cache=target_cache, draft_state=draft_state, metrics=metrics)


def decode_step(state: DecodeState, target_params, draft_params, *, target: Model,
                draft: Draft | None, config: DecodeConfig) -> DecodeState:
  """One round of the loop: `speculative_step` at K = num_draft_tokens or, under a schedule, at
  the K the schedule picks among its compiled branches (`_switch_in_place`), then the schedule's
  update. With a `DeterministicDraft`, a plain round (K = 0) also checks the token the draft
  would have drafted first against the one committed (`Metrics.plain_checked`). A schedule whose
  only branch is K = 0 runs plain decoding's round (no draft, no schedule update). A pure
  function: state -> state."""
  schedule = config.schedule
  if schedule is None:
    return speculative_step(state, target_params, draft_params, target=target, draft=draft,
                            config=config)
  if _plain_only(config):  # no K can pay: plain decoding's round, the draft never called
    return speculative_step(state, target_params, draft_params, target=target, draft=None,
                            config=dataclasses.replace(config, num_draft_tokens=0, schedule=None))
  ks = schedule.branches(config.num_draft_tokens)
  rounds = [functools.partial(speculative_step, target=target, draft=draft,
                              config=dataclasses.replace(config, num_draft_tokens=k,
                                                         schedule=None))
            for k in ks]
  active = ~state.done
  first = None
  if isinstance(draft, DeterministicDraft):
    first = draft.first_token(draft_params, state.draft_state, state.tokens, state.lengths)
    ready = first >= 0
  else:
    ready = active if draft is None else draft.ready(draft_params, state.draft_state,
                                                     state.tokens, state.lengths)
  index = schedule.choose(state.schedule, active, ready)
  new = _switch_in_place(index, rounds, dataclasses.replace(state, schedule=None), target_params,
                         draft_params)
  if first is not None and 0 in ks:
    position = jnp.minimum(state.lengths, state.tokens.shape[1] - 1)[:, None]
    committed = jnp.take_along_axis(new.tokens, position, axis=1)[:, 0]
    checked = (jnp.asarray(ks)[index] == 0) & active & ready & (new.lengths > state.lengths)
    new = dataclasses.replace(new, metrics=new.metrics.check_plain(checked, committed == first))
  return dataclasses.replace(new, schedule=schedule.update(state.schedule, state.metrics,
                                                           new.metrics, active, ready))


def _switch_in_place(index, branches, state, *args):
  """`lax.switch(index, branches, state, *args)` for a state updated in place: each branch runs
  in a while loop of 0 or 1 trips. XLA:CPU copies every buffer a `conditional` branch updates in
  place (the KV caches, twice a round: ~5% of a SmolLM2 step at batch 1), while a loop's carry is
  updated in place, as in the decode loop itself. Exactly one branch runs (index clamped to the
  branches, as `lax.switch` does); the result is the same as `lax.switch`'s."""
  index = jnp.clip(index, 0, len(branches) - 1)
  for i, branch in enumerate(branches):
    state = run_if(index == i, lambda s, branch=branch: branch(s, *args), state)
  return state


def _decode(target_params, draft_params, prompt_tokens, prompt_lengths, keys, *, target, draft,
            config):
  state = init_state(target_params, draft_params, prompt_tokens, prompt_lengths, keys,
                     target=target, draft=draft, config=config)
  step = lambda s: decode_step(s, target_params, draft_params, target=target, draft=draft,
                               config=config)
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)
  return DecodeResult(state.tokens, state.lengths, state.prompt_lengths, state.finish,
                      state.metrics)


_decode_jit = jax.jit(_decode, static_argnames=('target', 'draft', 'config'))


def validate_inputs(prompt_tokens, prompt_lengths, *, draft, config: DecodeConfig) -> None:
  """Host-side checks run before any work. Raises ValueError naming the problem."""
  prompt_tokens, prompt_lengths = np.asarray(prompt_tokens), np.asarray(prompt_lengths)
  if prompt_tokens.ndim != 2 or prompt_lengths.shape != prompt_tokens.shape[:1]:
    raise ValueError(f'prompt_tokens must be [B, P] and prompt_lengths [B]; got '
                     f'{prompt_tokens.shape} and {prompt_lengths.shape}')
  if prompt_tokens.shape[0] == 0:
    raise ValueError('empty batch: no prompts were given')
  if np.any(prompt_lengths < 1):
    raise ValueError(f'empty prompt in rows {np.flatnonzero(prompt_lengths < 1).tolist()}: '
                     'every prompt needs at least one token')
  if np.any(prompt_lengths > prompt_tokens.shape[1]):
    raise ValueError(f'prompt_lengths exceed the padded prompt length {prompt_tokens.shape[1]}')
  if draft is not None and config.num_draft_tokens < 1:
    raise ValueError(f'num_draft_tokens must be >= 1 with a draft, got '
                     f'{config.num_draft_tokens} (plain decoding: draft=None)')
  if draft is None and config.num_draft_tokens > 0:
    raise ValueError('num_draft_tokens > 0 needs a draft (plain decoding: num_draft_tokens=0)')
  needed = buffer_length(prompt_tokens.shape[1], config.max_new_tokens, config.num_draft_tokens)
  if config.context_length is not None and needed > config.context_length:
    raise ValueError(f'the prompt does not fit the context: {prompt_tokens.shape[1]} prompt '
                     f'tokens (padded) + {config.max_new_tokens} new + '
                     f'{config.num_draft_tokens + 1} window = {needed} > context_length '
                     f'{config.context_length}')


def _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, **statics):
  """Validates on the host, then returns (dynamic args, static kwargs) for the jitted programs."""
  validate_inputs(prompt_tokens, prompt_lengths, draft=statics['draft'], config=statics['config'])
  keys = noise.row_keys(seeds)
  if keys.shape != np.shape(prompt_lengths):
    raise ValueError(f'seeds must give one seed per row: {keys.shape[0]} seeds for '
                     f'{np.shape(prompt_lengths)[0]} prompts')
  return (target_params, draft_params, jnp.asarray(prompt_tokens, jnp.int32),
          jnp.asarray(prompt_lengths, jnp.int32), keys), statics


def generate(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
             target: Model, draft: Draft | None, config: DecodeConfig) -> DecodeResult:
  """Speculative (or, with K = 0, plain) decoding of a batch, as one compiled program.

  Args:
    target_params, draft_params: parameter pytrees (draft_params unused by an n-gram draft; the
      target's params for an early-exit draft, passed again without a copy).
    prompt_tokens: `[B,P]` int32, right-padded; pad P to a bucket (see `pad_prompts`) so that a
      new prompt length does not recompile.
    prompt_lengths: `[B]` int32, each in [1, P].
    seeds: `[B]` integers (or typed PRNG keys), one per row. A row's tokens depend only on its
      prompt and its seed: the same pair gives the same tokens alone or at any index of any
      batch (`jaxspec.noise`).
    target: the target model (`jaxspec.contracts.Model`).
    draft: a `jaxspec.contracts.Draft` (`ModelDraft`, `NGramDraft`, ...) or None when K = 0.
    config: DecodeConfig.
  Returns:
    DecodeResult with the token buffer, lengths, finish reasons and per-row metrics.
  Raises:
    ValueError: empty prompt, inconsistent shapes, one seed per row missing, a missing draft, or
      a draft/target vocabulary mismatch, all before any computation runs.
  """
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, seeds,
                                target=target, draft=draft, config=config)
  return _decode_jit(*args, **statics)


def compile_generate(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
                     target: Model, draft: Draft | None, config: DecodeConfig):
  """Ahead-of-time compiles `generate` for these shapes, so that compile time and run time can be
  measured apart. Returns a callable `(target_params, draft_params, prompt_tokens,
  prompt_lengths, keys) -> DecodeResult` for arguments of the same shapes, dtypes and shardings,
  with keys `[B]` from `jaxspec.noise.row_keys(seeds)`. Raises what `generate` raises, here."""
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, seeds,
                                target=target, draft=draft, config=config)
  return _decode_jit.lower(*args, **statics).compile()


def generate_steps(target_params, draft_params, prompt_tokens, prompt_lengths, seeds, *,
                   target: Model, draft: Draft | None,
                   config: DecodeConfig) -> Iterator[DecodeState]:
  """The debug/streaming twin of `generate`: a Python loop over the same jitted `decode_step`
  (state donated), yielding the state after every round."""
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, seeds,
                                target=target, draft=draft, config=config)
  state = jax.jit(init_state, static_argnames=tuple(statics))(*args, **statics)
  step = jax.jit(decode_step, static_argnames=tuple(statics), donate_argnums=0)
  while not bool(jnp.all(state.done)):
    state = step(state, target_params, draft_params, **statics)
    yield state


def pad_prompts(prompts: list[list[int]], pad_id: int = 0,
                bucket: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists to one length, rounded up to a multiple of `bucket` (tokens).

  Returns (tokens `[B,P]` int32, lengths `[B]` int32). Raises ValueError on an empty prompt.
  """
  lengths = np.array([len(p) for p in prompts], np.int32)
  if len(prompts) == 0 or np.any(lengths == 0):
    raise ValueError('empty prompt: every prompt needs at least one token')
  width = int(-(-lengths.max() // bucket) * bucket)
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  return tokens, lengths
