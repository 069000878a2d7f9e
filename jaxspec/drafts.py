"""Drafts: anything that proposes K tokens and the distributions q they were sampled from.

A draft is a hashable object (a static jit argument) with

- `shares_target_cache: bool` - True when the draft reads and writes the target's own KV cache
  (self-speculative early exit), so it needs no cache or prefill of its own;
- `init(params, prompt_tokens [B,P] int32, max_len) -> state` - its own state (e.g. a prefilled
  KV cache), or None;
- `propose(params, state, tokens [B,S] int32, lengths [B] int32, key, *, num_draft_tokens,
  sampling, vocab_size) -> (draft_tokens [B,K] int32, q [B,K,V] float32, state)`.

A draft with `uses_target_features = True` (`FeatureDraft`) also reads the target's features: its
`init` takes them for the prompt and the loop hands it those of every verify pass (`observe`).

`tokens[b, :lengths[b]]` is the committed sequence of row b. A draft's cache (like the target's)
only has to hold entries for committed tokens before `lengths - 2`: it rolls back by the length
pointer alone. A model is a hashable callable `forward(params, tokens [B,T], cache, start [B]) ->
(logits [B,T,V], cache)` with a method `init_cache(batch_size, max_len) -> cache`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxspec import ngram
from jaxspec.sampling import SamplingConfig, process_logits, sample


@dataclasses.dataclass(frozen=True)
class ModelDraft:
  """A draft language model with the target's vocabulary.

  With `shares_target_cache=False` it is a separate model with its own KV cache. With True it is
  a self-speculative early exit (the target's first layers with its final norm and head): it runs
  on the target's params and cache, and the target's verify pass overwrites what it wrote.

  Each round the first draft step feeds the last `2` committed tokens (1 when sharing the target's
  cache), so the draft's cache never lags behind after a fully accepted window, without an extra
  forward pass. Proposals are sampled from `process_logits(logits, sampling)`, the same q that is
  returned for verification.
  """

  forward: Callable[..., Any]
  shares_target_cache: bool = False

  def init(self, params, prompt_tokens, max_len):
    if self.shares_target_cache:
      return None
    b, p = prompt_tokens.shape
    cache = self.forward.init_cache(b, max_len)
    _, cache = self.forward(params, prompt_tokens, cache, jnp.zeros((b,), jnp.int32))
    return cache

  def propose(self, params, state, tokens, lengths, key, *, num_draft_tokens: int,
              sampling: SamplingConfig, vocab_size: int):
    del vocab_size
    width = 1 if self.shares_target_cache else 2
    start = jnp.maximum(lengths - width, 0)
    window = jnp.take_along_axis(tokens, start[:, None] + jnp.arange(width), axis=1)
    logits, cache = self.forward(params, window, state, start)
    last = jnp.take_along_axis(logits, (lengths - 1 - start)[:, None, None], axis=1)[:, 0]

    def step(carry, x):
      cache, position = carry
      logits, cache = self.forward(params, x[:, None], cache, position)
      return logits[:, 0], (cache, position + 1)

    draft_tokens, q, (cache, _) = _autoregress(last, step, (cache, lengths), key,
                                               num_draft_tokens, sampling)
    return draft_tokens, q, cache


@dataclasses.dataclass(frozen=True)
class NGramDraft:
  """Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the
  row's last n tokens (n from `max_ngram` down to `min_ngram`). Its q is one-hot, so exact
  sampling stays exact. No parameters, no cache."""

  max_ngram: int = 3
  min_ngram: int = 1
  shares_target_cache = False

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f'need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}')

  def init(self, params, prompt_tokens, max_len):
    del params, prompt_tokens, max_len
    return None

  def propose(self, params, state, tokens, lengths, key, *, num_draft_tokens: int,
              sampling: SamplingConfig, vocab_size: int):
    del params, key, sampling
    draft_tokens = ngram.lookup(tokens, lengths, num_draft_tokens, self.max_ngram,
                                self.min_ngram)
    return draft_tokens, jax.nn.one_hot(draft_tokens, vocab_size, dtype=jnp.float32), state


@dataclasses.dataclass(frozen=True)
class FeatureDraft:
  """A draft that extrapolates the target's features (EAGLE, Li et al. 2024, Sec. 3-4).

  `forward(params, tokens [B,T] int32, prev_features [B,T,D], cache, start [B]) -> (features
  [B,T,D], cache)` reads token x_j with the target's feature f_{j-1} of the position before and
  predicts f_j; `forward.logits(params, features [B,T,D]) -> [B,T,V] float32` gives the
  distribution of x_{j+1}; `forward.init_cache(batch_size, max_len)`. The target must offer
  `target.with_features(params, tokens, cache, start) -> (logits, cache, features [B,T,D])`.

  State (a dict pytree): the draft's KV cache, `features [B,K+1,D]`, the target's features at
  positions `start .. start+K` from the latest verify pass, and `start [B]` int32. A round with
  committed length L: the window `j = start+1 .. start+K+1` pairs x_j with f_{j-1} (true
  features up to j = L-1, the rest overwritten later), its output at j = L-1 gives d_1; then K-1
  single steps feed each draft token with the predicted feature. Cache entries past L-1 are
  rewritten before they are read, so rolling back is again only moving L.
  """

  forward: Callable[..., Any]
  shares_target_cache = False
  uses_target_features = True

  def init(self, params, prompt_tokens, max_len, *, features, prompt_lengths, num_draft_tokens):
    """Prefills the draft cache from the prompt `[B,P]` and its target features `[B,P,D]`."""
    b, p = prompt_tokens.shape
    prev = jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :p]
    cache = self.forward.init_cache(b, max_len)
    _, cache = self.forward(params, prompt_tokens, prev, cache, jnp.zeros((b,), jnp.int32))
    start = prompt_lengths.astype(jnp.int32) - 2  # the window's first pair is x_{L-1}, f_{L-2}
    pos = start[:, None] + jnp.arange(num_draft_tokens + 1)
    window = jnp.take_along_axis(features, jnp.clip(pos, 0, p - 1)[..., None], axis=1)
    window = jnp.where((pos >= 0)[..., None], window, 0).astype(features.dtype)
    return {'cache': cache, 'features': window, 'start': start}

  def observe(self, state, features, start):
    """Takes the target's features `[B,K+1,D]` of the verify window starting at `start [B]`."""
    return {**state, 'features': features.astype(state['features'].dtype), 'start': start}

  def propose(self, params, state, tokens, lengths, key, *, num_draft_tokens: int,
              sampling: SamplingConfig, vocab_size: int):
    del vocab_size
    k = num_draft_tokens
    pos = state['start'] + 1
    idx = jnp.clip(pos[:, None] + jnp.arange(k + 1), 0, tokens.shape[1] - 1)
    window = jnp.take_along_axis(tokens, idx, axis=1)
    feats, cache = self.forward(params, window, state['features'], state['cache'], pos)
    last = jnp.take_along_axis(feats, (lengths - 1 - pos)[:, None, None], axis=1)  # [B,1,D]

    def step(carry, x):
      feature, cache, position = carry
      feature, cache = self.forward(params, x[:, None], feature, cache, position)
      return self.forward.logits(params, feature)[:, 0], (feature, cache, position + 1)

    draft_tokens, q, (_, cache, _) = _autoregress(
        self.forward.logits(params, last)[:, 0], step, (last, cache, lengths), key, k, sampling)
    return draft_tokens, q, {**state, 'cache': cache}


def _autoregress(first_logits, step, carry, key, num_draft_tokens, sampling):
  """Draws K tokens one at a time: token i from `process_logits(logits_i)` (argmax when greedy),
  then `step(carry, token [B]) -> (next logits [B,V], carry)`; no step after the last token.

  Returns (draft_tokens [B,K] int32, q [B,K,V] float32, carry)."""
  draw = (lambda k, q: jnp.argmax(q, axis=-1).astype(jnp.int32)) if sampling.greedy else sample
  keys = jax.random.split(key, num_draft_tokens)

  def body(c, step_key):
    logits, inner = c
    q = process_logits(logits, sampling)
    x = draw(step_key, q)
    return step(inner, x), (x, q)

  (last, carry), (xs, qs) = jax.lax.scan(body, (first_logits, carry), keys[:-1])
  q_last = process_logits(last, sampling)
  x_last = draw(keys[-1], q_last)
  draft_tokens = jnp.concatenate([xs.T, x_last[:, None]], axis=1)
  q = jnp.concatenate([jnp.swapaxes(qs, 0, 1), q_last[:, None]], axis=1)
  return draft_tokens, q, carry
