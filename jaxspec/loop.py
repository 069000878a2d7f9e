"""The decode loop: prefill, then draft-then-verify rounds in one `lax.while_loop`.

Invariants (per row b, with L = lengths[b]):
- `tokens[b, :L]` is the committed sequence (prompt, then generated tokens); every position at or
  after L holds `pad_id`. Finished rows stop changing.
- The target's KV cache holds valid entries for positions `< L - 1`; the last committed token is
  fed at the start of the next round. Rejected draft entries are left in place and are never read:
  rolling back is moving L. Cache and buffer have the same fixed length
  `S = P + max_new_tokens + K + 1` (P the padded prompt length), so no write ever clamps.

A round (Leviathan et al. 2023, Alg. 1): the draft proposes K tokens with their distributions q;
the target scores `[x_{L-1}, d_1..d_K]` in one forward pass at positions L-1..L+K-1, giving
p_1..p_{K+1}; verification accepts n drafted tokens and yields one more; n+1 tokens are committed,
cut at the first EOS and at the token budget. K = 0 is plain autoregressive decoding. With a draft
that reads the target's features (`FeatureDraft`, EAGLE), prefill and verify call
`target.with_features` instead and hand the features to the draft (`draft.observe`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.metrics import Metrics
from jaxspec.sampling import SamplingConfig, process_logits
from jaxspec.verify import verify_exact, verify_greedy


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
  """Decoding settings (static: each distinct config compiles once).

  Attributes:
    num_draft_tokens: K (the paper's gamma), tokens drafted per round; 0 = plain decoding.
    max_new_tokens: most tokens generated per row, EOS included.
    sampling: how logits become distributions (temperature 0 = greedy).
    eos_id: a row stops after committing this token; None = never.
    pad_id: fills the token buffer past each row's length.
    max_len: the model's context length in tokens; a padded prompt + max_new_tokens + K + 1 that
      exceeds it is rejected before any work. None = unchecked.
  """

  num_draft_tokens: int = 4
  max_new_tokens: int = 128
  sampling: SamplingConfig = SamplingConfig()
  eos_id: int | None = None
  pad_id: int = 0
  max_len: int | None = None

  def __post_init__(self):
    if self.num_draft_tokens < 0:
      raise ValueError(f'num_draft_tokens must be >= 0 (0 = plain decoding), got '
                       f'{self.num_draft_tokens}')
    if self.max_new_tokens < 1:
      raise ValueError(f'max_new_tokens must be >= 1, got {self.max_new_tokens}')


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Loop state, a pytree. tokens `[B, S]` int32; lengths, prompt_lengths `[B]` int32; done `[B]`
  bool; target_cache and draft_state as the models define them; key a PRNG key."""

  tokens: jax.Array
  lengths: jax.Array
  prompt_lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_state: Any
  key: jax.Array
  metrics: Metrics


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeResult:
  """What `generate` returns: tokens `[B, S]` int32 (row b's output is
  `tokens[b, prompt_lengths[b]:lengths[b]]`), lengths and prompt_lengths `[B]`, metrics."""

  tokens: jax.Array
  lengths: jax.Array
  prompt_lengths: jax.Array
  metrics: Metrics

  def new_tokens(self) -> list[list[int]]:
    """Generated token ids per row (host side)."""
    t, n, p = (np.asarray(x) for x in (self.tokens, self.lengths, self.prompt_lengths))
    return [t[b, p[b]:n[b]].tolist() for b in range(t.shape[0])]


def _write_rows(buffer_BS, window_BW, start_B):
  return jax.vmap(lambda r, w, s: jax.lax.dynamic_update_slice_in_dim(r, w, s, axis=0))(
      buffer_BS, window_BW, start_B)


def _uses_features(draft) -> bool:
  return getattr(draft, 'uses_target_features', False)


def init_state(target_params, draft_params, prompt_tokens, prompt_lengths, key, *,
               target: Callable, draft: Any, config: DecodeConfig) -> DecodeState:
  """Allocates the buffer and caches and prefills target (and draft) with the prompts.

  Args:
    prompt_tokens: `[B, P]` int32, each row right-padded; P is the shape bucket.
    prompt_lengths: `[B]` int32 in [1, P].
    key: PRNG key for the whole generation.
  """
  k = config.num_draft_tokens
  b, p = prompt_tokens.shape
  max_len = p + config.max_new_tokens + k + 1
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  positions = jnp.arange(max_len)[None]
  tokens = jnp.pad(prompt_tokens.astype(jnp.int32), ((0, 0), (0, max_len - p)))
  tokens = jnp.where(positions < prompt_lengths[:, None], tokens, config.pad_id)
  # Prefill writes every prompt position; entries at and after L-1 are rewritten before use.
  cache, start = target.init_cache(b, max_len), jnp.zeros((b,), jnp.int32)
  draft_state = None
  if k > 0 and _uses_features(draft):
    if not hasattr(target, 'with_features'):
      raise ValueError(f'the draft reads the target\'s features, but the target '
                       f'{type(target).__name__} has no with_features method')
    _, target_cache, features = target.with_features(target_params, prompt_tokens, cache, start)
    draft_state = draft.init(draft_params, prompt_tokens, max_len, features=features,
                             prompt_lengths=prompt_lengths, num_draft_tokens=k)
  else:
    _, target_cache = target(target_params, prompt_tokens, cache, start)
    if k > 0 and not draft.shares_target_cache:
      draft_state = draft.init(draft_params, prompt_tokens, max_len)
  return DecodeState(tokens=tokens, lengths=prompt_lengths, prompt_lengths=prompt_lengths,
                     done=jnp.zeros((b,), bool), target_cache=target_cache,
                     draft_state=draft_state, key=key, metrics=Metrics.zeros(b, k))


def speculative_step(state: DecodeState, target_params, draft_params, *, target: Callable,
                     draft: Any, config: DecodeConfig) -> DecodeState:
  """One draft-then-verify round for every row (a pure function: state -> state).

  Raises:
    ValueError: at trace time, when the draft's vocabulary differs from the target's.
  """
  k = config.num_draft_tokens
  b = state.tokens.shape[0]
  lengths = state.lengths
  key, key_draft, key_verify = jax.random.split(state.key, 3)
  target_cache, draft_state = state.target_cache, state.draft_state
  last = jnp.take_along_axis(state.tokens, (lengths - 1)[:, None], axis=1)
  vocab_size = jax.eval_shape(target, target_params, last, target_cache, lengths)[0].shape[-1]

  if k > 0:
    draft_in = target_cache if draft.shares_target_cache else draft_state
    draft_tokens, q, draft_out = draft.propose(
        draft_params, draft_in, state.tokens, lengths, key_draft, num_draft_tokens=k,
        sampling=config.sampling, vocab_size=vocab_size)
    if q.shape[-1] != vocab_size:
      raise ValueError(f'vocabulary mismatch: the draft has {q.shape[-1]} tokens, the target '
                       f'{vocab_size}; the draft must share the target\'s vocabulary')
    if draft.shares_target_cache:
      target_cache = draft_out
    else:
      draft_state = draft_out
  else:
    draft_tokens = jnp.zeros((b, 0), jnp.int32)
    q = jnp.zeros((b, 0, vocab_size), jnp.float32)

  window = jnp.concatenate([last, draft_tokens], axis=1)  # [B, K+1]
  if k > 0 and _uses_features(draft):
    logits, target_cache, features = target.with_features(target_params, window, target_cache,
                                                          lengths - 1)
    draft_state = draft.observe(draft_state, features, lengths - 1)
  else:
    logits, target_cache = target(target_params, window, target_cache, lengths - 1)
  if config.sampling.greedy:
    num_accepted, next_token = verify_greedy(draft_tokens, logits)
  else:
    p = process_logits(logits, config.sampling)
    num_accepted, next_token = verify_exact(key_verify, draft_tokens, q, p)

  # Commit drafted[:n] + next_token, cut after the first EOS and at the token budget.
  idx = jnp.arange(k + 1)
  new = jnp.where(idx[None] < num_accepted[:, None], jnp.pad(draft_tokens, ((0, 0), (0, 1))),
                  next_token[:, None])
  eos_at = jnp.full((b,), k + 1)  # index of the first committed-able EOS in the window
  if config.eos_id is not None:
    is_eos = (new == config.eos_id) & (idx[None] <= num_accepted[:, None])
    eos_at = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), eos_at)
  budget = config.max_new_tokens - (lengths - state.prompt_lengths)
  active = ~state.done
  num_committed = jnp.where(active, jnp.minimum(jnp.minimum(num_accepted, eos_at) + 1, budget), 0)
  tokens = _write_rows(state.tokens, jnp.where(idx[None] < num_committed[:, None], new,
                                               config.pad_id), lengths)
  new_lengths = lengths + num_committed
  hit_eos = eos_at < num_committed
  done = state.done | hit_eos | (new_lengths - state.prompt_lengths >= config.max_new_tokens)

  cut_short = num_committed < num_accepted + 1
  num_drafted = jnp.where(cut_short, jnp.minimum(num_committed, k), k)
  metrics = state.metrics.update(active, num_drafted, jnp.minimum(num_accepted, num_committed),
                                 num_committed)
  return DecodeState(tokens=tokens, lengths=new_lengths, prompt_lengths=state.prompt_lengths,
                     done=done, target_cache=target_cache, draft_state=draft_state, key=key,
                     metrics=metrics)


def _decode(target_params, draft_params, prompt_tokens, prompt_lengths, key, *, target, draft,
            config):
  state = init_state(target_params, draft_params, prompt_tokens, prompt_lengths, key,
                     target=target, draft=draft, config=config)
  step = lambda s: speculative_step(s, target_params, draft_params, target=target, draft=draft,
                                    config=config)
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)
  return DecodeResult(state.tokens, state.lengths, state.prompt_lengths, state.metrics)


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
  needed = prompt_tokens.shape[1] + config.max_new_tokens + config.num_draft_tokens + 1
  if config.max_len is not None and needed > config.max_len:
    raise ValueError(f'the prompt does not fit the cache: {prompt_tokens.shape[1]} prompt tokens '
                     f'(padded) + {config.max_new_tokens} new + {config.num_draft_tokens + 1} '
                     f'window = {needed} > max_len {config.max_len}')


def _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, key, **statics):
  """Validates on the host, then returns (dynamic args, static kwargs) for the jitted programs."""
  validate_inputs(prompt_tokens, prompt_lengths, draft=statics['draft'], config=statics['config'])
  return (target_params, draft_params, jnp.asarray(prompt_tokens, jnp.int32),
          jnp.asarray(prompt_lengths, jnp.int32), key), statics


def generate(target_params, draft_params, prompt_tokens, prompt_lengths, key, *,
             target: Callable, draft: Any, config: DecodeConfig) -> DecodeResult:
  """Speculative (or, with K = 0, plain) decoding of a batch, as one compiled program.

  Args:
    target_params, draft_params: parameter pytrees (draft_params unused by an n-gram draft; the
      target's params for an early-exit draft, passed again without a copy).
    prompt_tokens: `[B, P]` int32, right-padded; pad P to a bucket (see `pad_prompts`) so that a
      new prompt length does not recompile.
    prompt_lengths: `[B]` int32, each in [1, P].
    key: PRNG key (`jax.random.key(seed)`); the same key reproduces the same tokens.
    target: the target model callable (see `jaxspec.drafts` for the interface).
    draft: a draft (`ModelDraft`, `NGramDraft`, ...) or None when K = 0.
    config: DecodeConfig.
  Returns:
    DecodeResult with the token buffer, lengths and per-row metrics.
  Raises:
    ValueError: empty prompt, inconsistent shapes, a missing draft, or a draft/target vocabulary
      mismatch, all before any computation runs.
  """
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, key,
                                target=target, draft=draft, config=config)
  return _decode_jit(*args, **statics)


def compile_generate(target_params, draft_params, prompt_tokens, prompt_lengths, key, *,
                     target: Callable, draft: Any, config: DecodeConfig):
  """Ahead-of-time compiles `generate` for these shapes, so that compile time and run time can be
  measured apart. Returns a callable `(target_params, draft_params, prompt_tokens,
  prompt_lengths, key) -> DecodeResult` for arguments of the same shapes, dtypes and shardings.
  Raises what `generate` raises, at this call."""
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, key,
                                target=target, draft=draft, config=config)
  return _decode_jit.lower(*args, **statics).compile()


def generate_steps(target_params, draft_params, prompt_tokens, prompt_lengths, key, *,
                   target: Callable, draft: Any, config: DecodeConfig) -> Iterator[DecodeState]:
  """The debug/streaming twin of `generate`: a Python loop over the same jitted
  `speculative_step` (state donated), yielding the state after every round."""
  args, statics = _checked_args(target_params, draft_params, prompt_tokens, prompt_lengths, key,
                                target=target, draft=draft, config=config)
  state = jax.jit(init_state, static_argnames=tuple(statics))(*args, **statics)
  step = jax.jit(speculative_step, static_argnames=tuple(statics), donate_argnums=0)
  while not bool(jnp.all(state.done)):
    state = step(state, target_params, draft_params, **statics)
    yield state


def pad_prompts(prompts: list[list[int]], pad_id: int = 0,
                bucket: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists to one length, rounded up to a multiple of `bucket` (tokens).

  Returns (tokens `[B, P]` int32, lengths `[B]` int32). Raises ValueError on an empty prompt.
  """
  lengths = np.array([len(p) for p in prompts], np.int32)
  if len(prompts) == 0 or np.any(lengths == 0):
    raise ValueError('empty prompt: every prompt needs at least one token')
  width = int(-(-lengths.max() // bucket) * bucket)
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  return tokens, lengths
