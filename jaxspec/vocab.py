"""A draft with another vocabulary: token-level intersection, on device and exact.

Timor et al. 2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (arXiv 2502.05202), Sec. 3.2 ("TLI"): the draft proposes only tokens
that the target's vocabulary has with the identical string; its distribution q is restricted to
that intersection, renormalized, and moved into the target's ids (zero elsewhere). Every drafted
token is then a target token drawn from exactly that q, so modified rejection sampling (and the
coupled and greedy rules) stay exact at every temperature. The same mechanism serves two models
of one family whose vocabularies differ only in size.

The draft reads the committed sequence through the table target -> draft (a target token with no
counterpart is read as `fallback_id`): that only changes what the draft conditions on, never the
exactness. Tables are arrays in the draft's params, so nothing leaves the device:

  params = {'draft': inner draft's params,
            'draft_to_target': [V_d] int32 (target id of each draft token, or -1),
            'target_to_draft': [V_t] int32 (draft id of each target token, or -1)}

(`models.vocab_map.build_vocab_map` builds them from two tokenizers.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.contracts import Draft, DraftContext, Prefill, Proposal
from jaxspec.drafts import ModelDraft


def restrict_to_target(q_d: jax.Array, draft_to_target: jax.Array,
                       target_vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """Moves draft distributions into the target's vocabulary, restricted to the intersection.

  Args:
    q_d: `[..., V_d]` float32 draft probabilities.
    draft_to_target: `[V_d]` int32, the target id of each draft token or -1.
    target_vocab_size: V_t.
  Returns:
    (q_t `[..., V_t]` float32 renormalized over the intersection, zero elsewhere; mass `[...]`
    float32, the draft's mass on the intersection before renormalizing: where it is 0, q_t is 0
    and nothing can be drawn).
  """
  idx = jnp.where(draft_to_target >= 0, draft_to_target, target_vocab_size)
  q_t = jnp.zeros(q_d.shape[:-1] + (target_vocab_size,), jnp.float32)
  q_t = q_t.at[..., idx].add(q_d.astype(jnp.float32), mode='drop')
  mass = jnp.sum(q_t, axis=-1)
  return q_t / jnp.where(mass > 0, mass, 1.0)[..., None], mass


def to_draft_ids(tokens_t: jax.Array, target_to_draft: jax.Array, fallback_id: int) -> jax.Array:
  """Target ids `[...]` int32 -> draft ids (`fallback_id` where the draft has no counterpart)."""
  d = jnp.take(target_to_draft, jnp.clip(tokens_t, 0, target_to_draft.shape[0] - 1))
  return jnp.where(d >= 0, d, fallback_id).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class _MappedContext(DraftContext):
  """The inner draft's view: the buffer in draft ids, V = V_d; each draw happens on the
  restricted distribution in the target's vocabulary (with the target-vocabulary noise the
  verifier expects) and is handed back as a draft id."""

  draft_to_target: jax.Array | None = None
  target_to_draft: jax.Array | None = None
  target_vocab_size: int = 0
  fallback_id: int = 0

  def draw(self, i, q):
    q_t, _ = restrict_to_target(q, self.draft_to_target, self.target_vocab_size)
    x_t = DraftContext.draw(self, i, q_t)
    return to_draft_ids(x_t, self.target_to_draft, self.fallback_id)


@dataclasses.dataclass(frozen=True)
class VocabMappedDraft(Draft):
  """Wraps a draft over another vocabulary (TLI, Timor et al. 2025, Sec. 3.2); see the module
  docstring for its params. A drafted position whose q has no mass on the intersection, and every
  position after it, counts as not drafted.

  Attributes:
    inner: the draft in its own vocabulary (`ModelDraft`, `NGramDraft`, ...; not one that reads
      the target's features or shares its cache).
    fallback_id: the draft id read in place of a target token the draft cannot spell.
  Raises:
    ValueError: an inner draft that reads the target's features or shares its KV cache.
  """

  inner: Draft
  fallback_id: int = 0

  def __post_init__(self):
    shares_cache = isinstance(self.inner, ModelDraft) and self.inner.shares_target_cache
    if self.inner.uses_target_features or shares_cache:
      raise ValueError('a draft with another vocabulary cannot read the target\'s features or '
                       'share its KV cache')

  def init(self, params, prefill: Prefill):
    tokens = to_draft_ids(prefill.prompt_tokens, params['target_to_draft'], self.fallback_id)
    return self.inner.init(params['draft'], dataclasses.replace(prefill, prompt_tokens=tokens))

  def ready(self, params, state, tokens, lengths):
    """The inner draft's readiness on the committed tokens in draft ids."""
    tokens = to_draft_ids(tokens, params['target_to_draft'], self.fallback_id)
    return self.inner.ready(params['draft'], state, tokens, lengths)

  def propose(self, params, state, ctx: DraftContext) -> Proposal:
    d2t, t2d = params['draft_to_target'], params['target_to_draft']
    inner_ctx = _MappedContext(
        to_draft_ids(ctx.tokens, t2d, self.fallback_id), ctx.lengths, None, ctx.keys,
        ctx.num_draft_tokens, ctx.sampling, d2t.shape[0], ctx.draft_stream, ctx.min_confidence,
        draft_to_target=d2t,
        target_to_draft=t2d, target_vocab_size=ctx.vocab_size, fallback_id=self.fallback_id)
    proposal = self.inner.propose(params['draft'], state, inner_ctx)
    q_t, mass = restrict_to_target(proposal.q, d2t, ctx.vocab_size)
    tokens = jnp.take(d2t, jnp.clip(proposal.tokens, 0, d2t.shape[0] - 1))
    tokens = jnp.where(mass > 0, tokens, -1)  # -1 ends the proposal there (the loop rejects it)
    return Proposal(tokens.astype(jnp.int32), q_t, proposal.num_proposed, proposal.state,
                    ctx.target_cache)
