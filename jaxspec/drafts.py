"""Drafts (the `jaxspec.contracts.Draft` protocol): n-gram lookup, a draft model or the target's
early layers, and EAGLE feature extrapolation.

A model here is a hashable `jaxspec.contracts.Model`: `forward(params, tokens [B,T], cache,
start [B]) -> (logits [B,T,V], cache)` with `init_cache(batch_size, buffer_len)`. Every drafted
token is drawn with `DraftContext.draw` from exactly the q returned for verification.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxspec import ngram
from jaxspec.contracts import DeterministicDraft, Draft, DraftContext, Prefill, Proposal, Scored
from jaxspec.sampling import process_logits


def _empty(ctx: DraftContext, state, target_cache) -> Proposal:
  """Nothing drafted (a K = 0 round under a schedule)."""
  b = ctx.lengths.shape[0]
  return Proposal(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, ctx.vocab_size), jnp.float32),
                  jnp.zeros((b,), jnp.int32), state, target_cache)


@dataclasses.dataclass(frozen=True)
class ModelDraft(Draft):
  """A draft language model with the target's vocabulary.

  With `shares_target_cache=False` it is a separate model with its own KV cache. With True it is
  a self-speculative early exit (the target's first layers with its final norm and head): it runs
  on the target's params and cache, and the target's verify pass overwrites what it wrote.

  Each round the first draft step feeds the last `2` committed tokens (1 when sharing the target's
  cache), so the draft's cache never lags behind after a fully accepted window, without an extra
  forward pass.
  """

  forward: Callable[..., Any]
  shares_target_cache: bool = False

  def init(self, params, prefill: Prefill):
    if self.shares_target_cache:
      return None
    b = prefill.prompt_tokens.shape[0]
    cache = self.forward.init_cache(b, prefill.buffer_len)
    _, cache = self.forward(params, prefill.prompt_tokens, cache, jnp.zeros((b,), jnp.int32))
    return cache

  def propose(self, params, state, ctx: DraftContext) -> Proposal:
    lengths = ctx.lengths
    if self.shares_target_cache and ctx.num_draft_tokens == 0:
      return _empty(ctx, state, ctx.target_cache)
    width = 1 if self.shares_target_cache else 2
    start = jnp.maximum(lengths - width, 0)
    window = jnp.take_along_axis(ctx.tokens, start[:, None] + jnp.arange(width), axis=1)
    cache = ctx.target_cache if self.shares_target_cache else state
    logits, cache = self.forward(params, window, cache, start)
    last = jnp.take_along_axis(logits, (lengths - 1 - start)[:, None, None], axis=1)[:, 0]

    def step(carry, x):
      cache, position = carry
      logits, cache = self.forward(params, x[:, None], cache, position)
      return logits[:, 0], (cache, position + 1)

    tokens, q, num, (cache, _) = _autoregress(last, step, (cache, lengths), ctx)
    if self.shares_target_cache:
      return Proposal(tokens, q, num, None, cache)
    return Proposal(tokens, q, num, cache, ctx.target_cache)


@dataclasses.dataclass(frozen=True)
class NGramDraft(DeterministicDraft):
  """Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the
  row's last n tokens (n from `max_ngram` down to `min_ngram`); a row with no such occurrence
  proposes nothing and is not `ready` (as vLLM's and transformers' prompt lookup), so a schedule
  can run a plain round there. Its q is one-hot, so exact sampling stays exact, and its proposal
  is a function of the tokens, so plain rounds check its `first_token` for free. No parameters,
  no cache.

  Raises:
    ValueError: unless 1 <= min_ngram <= max_ngram.
  """

  max_ngram: int = 3
  min_ngram: int = 1

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f'need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}')

  def init(self, params, prefill: Prefill):
    del params, prefill
    return None

  def ready(self, params, state, tokens, lengths):
    return self.first_token(params, state, tokens, lengths) >= 0

  def first_token(self, params, state, tokens, lengths):
    del params, state
    end = ngram.match_end(tokens, lengths, self.max_ngram, self.min_ngram)
    return jnp.where(end >= 0, ngram.continuation(tokens, lengths, end, 1)[:, 0], -1)

  def propose(self, params, state, ctx: DraftContext) -> Proposal:
    if ctx.num_draft_tokens == 0:
      return _empty(ctx, state, ctx.target_cache)
    del params
    end = ngram.match_end(ctx.tokens, ctx.lengths, self.max_ngram, self.min_ngram)
    tokens = ngram.continuation(ctx.tokens, ctx.lengths, end, ctx.num_draft_tokens)
    q = jax.nn.one_hot(tokens, ctx.vocab_size, dtype=jnp.float32)
    num = jnp.where(end >= 0, ctx.num_draft_tokens, 0).astype(jnp.int32)
    return Proposal(tokens, q, num, state, ctx.target_cache)


@dataclasses.dataclass(frozen=True)
class FeatureDraft(Draft):
  """A draft that extrapolates the target's features (EAGLE, Li et al. 2024, Sec. 3-4).

  `forward(params, tokens [B,T] int32, prev_features [B,T,D], cache, start [B]) -> (features
  [B,T,D], cache)` reads token x_j with the target's feature f_{j-1} of the position before and
  predicts f_j; `forward.logits(params, features [B,T,D]) -> [B,T,V] float32` gives the
  distribution of x_{j+1}; `forward.init_cache(batch_size, buffer_len)`. The target must be a
  `FeatureModel`.

  State (a dict pytree): the draft's KV cache, `features [B,S,D]` with `features[:, j] = f_j`,
  the target's feature at position j as far as verified, and `start [B]` int32: the draft's cache
  is up to date for positions <= start. A drafting round with K tokens and committed length L
  catches up: chunks of K + 1 positions `j = start+1 ..` pair x_j with f_{j-1} (true features up
  to j = L-1, the rest overwritten later) until the chunk holding j = L-1, whose output there
  gives d_1; then K-1 single steps feed each draft token with the predicted feature, and `start`
  becomes L-1. With a fixed K every catch-up is one chunk (a round commits at most K + 1 tokens).
  Cache entries past L-1 are rewritten before they are read, so rolling back is again only
  moving L.

  A K = 0 round (under a schedule) drafts nothing and only stores the verify pass's feature: the
  next drafting round catches up over every position since (several chunks, a `while_loop`), so
  plain rounds cost no draft work, and plain rounds never followed by a drafting one cost none at
  all (a catch-up every few plain rounds cost ~3.5% of a plain round at batch 16 on the CPU:
  this draft's one layer is ~3.5% of the target's FLOPs). `features` costs B x S x D in the
  features' dtype.
  """

  forward: Callable[..., Any]
  uses_target_features = True

  def init(self, params, prefill: Prefill):
    """Prefills the draft cache from the prompt `[B,P]` and its target features `[B,P,D]`."""
    tokens, features = prefill.prompt_tokens, prefill.features
    b, p = tokens.shape
    prev = jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :p]
    cache = self.forward.init_cache(b, prefill.buffer_len)
    _, cache = self.forward(params, tokens, prev, cache, jnp.zeros((b,), jnp.int32))
    start = prefill.prompt_lengths.astype(jnp.int32) - 2  # first pair: x_{L-1}, f_{L-2}
    stored = jnp.zeros((b, prefill.buffer_len, features.shape[-1]), features.dtype)
    return {'cache': cache, 'features': stored.at[:, :p].set(features), 'start': start}

  def observe(self, state, scored: Scored):
    """Stores the target's features `[B,K+1,D]` of the verify window at positions
    `scored.start ..` of `features`."""
    features = scored.features.astype(state['features'].dtype)
    write = jax.vmap(lambda f, w, i: jax.lax.dynamic_update_slice_in_dim(f, w, i, axis=0))
    return {**state, 'features': write(state['features'], features, scored.start)}

  def _catch_up(self, params, state, ctx: DraftContext):
    """Feeds x_j with f_{j-1} for j = start+1 .. L-1 (and beyond, to fill the last chunk) in
    chunks of K + 1; returns (the output feature at j = L-1 `[B,1,D]`, state with start = L-1)."""
    lengths, width, size = ctx.lengths, ctx.num_draft_tokens + 1, ctx.tokens.shape[1]

    def chunk(start, cache):
      pos = start + 1
      idx = jnp.clip(pos[:, None] + jnp.arange(width), 0, size - 1)
      prev = jnp.take_along_axis(state['features'], jnp.maximum(idx - 1, 0)[..., None], axis=1)
      prev = jnp.where((idx >= 1)[..., None], prev, 0).astype(prev.dtype)  # f_{-1} = 0
      out, cache = self.forward(params, jnp.take_along_axis(ctx.tokens, idx, axis=1), prev,
                                cache, pos)
      off = lengths - 1 - pos  # where j = L-1 falls in this chunk
      at = jnp.take_along_axis(out, jnp.clip(off, 0, width - 1)[:, None, None], axis=1)
      return at, (off >= 0) & (off < width), jnp.minimum(start + width, lengths - 1), cache

    last, _, start, cache = chunk(state['start'], state['cache'])

    def more(c):
      start, last, cache = c
      at, hit, start, cache = chunk(start, cache)
      return start, jnp.where(hit[:, None, None], at, last), cache

    start, last, cache = jax.lax.while_loop(lambda c: jnp.any(c[0] < lengths - 1), more,
                                            (start, last, cache))
    return last, {**state, 'cache': cache, 'start': start}

  def propose(self, params, state, ctx: DraftContext) -> Proposal:
    if ctx.num_draft_tokens == 0:  # nothing drafted; the next drafting round catches up
      return _empty(ctx, state, ctx.target_cache)
    last, state = self._catch_up(params, state, ctx)
    lengths = ctx.lengths

    def step(carry, x):
      feature, cache, position = carry
      feature, cache = self.forward(params, x[:, None], feature, cache, position)
      return self.forward.logits(params, feature)[:, 0], (feature, cache, position + 1)

    tokens, q, num, (_, cache, _) = _autoregress(
        self.forward.logits(params, last)[:, 0], step, (last, state['cache'], lengths), ctx)
    return Proposal(tokens, q, num, {**state, 'cache': cache}, ctx.target_cache)


def _autoregress(first_logits, step, carry, ctx: DraftContext):
  """Draws up to K tokens one at a time: token i from `q_i = process_logits(logits_i)` with
  `ctx.draw(i, q_i)`, then `step(carry, token [B]) -> (next logits [B,V], carry)`; no step after
  the last token. A row stops proposing after a token where `ctx.stops` says so, and the loop
  ends once every row has stopped (its later entries are zeros).

  Returns (draft_tokens [B,K] int32, q [B,K,V] float32, num_proposed [B] int32, carry)."""
  k, (b, v) = ctx.num_draft_tokens, first_logits.shape
  if k == 0:
    return (jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, v), jnp.float32),
            jnp.zeros((b,), jnp.int32), carry)

  def draw(i, logits, tokens, qs, num, stopped):
    q = process_logits(logits, ctx.sampling)
    x = ctx.draw(i, q)
    num = jnp.where(stopped, num, i + 1)
    return x, tokens.at[:, i].set(x), qs.at[:, i].set(q), num, stopped | ctx.stops(logits)

  def body(c):
    i, x, inner, tokens, qs, num, stopped = c
    logits, inner = step(inner, x)
    x, tokens, qs, num, stopped = draw(i, logits, tokens, qs, num, stopped)
    return i + 1, x, inner, tokens, qs, num, stopped

  x, tokens, qs, num, stopped = draw(0, first_logits, jnp.zeros((b, k), jnp.int32),
                                     jnp.zeros((b, k, v), jnp.float32),
                                     jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
  _, _, carry, tokens, qs, num, _ = jax.lax.while_loop(
      lambda c: (c[0] < k) & ~jnp.all(c[-1]), body,
      (jnp.int32(1), x, carry, tokens, qs, num, stopped))
  return tokens, qs, num, carry
