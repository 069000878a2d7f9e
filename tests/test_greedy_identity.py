"""Greedy speculative decoding is token-for-token the target's greedy decoding, for every K and
every draft (perfect, useless, adversarial, n-gram, early exit), on rows of different lengths."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models.llama import LlamaConfig, LlamaForward, init_params

CONFIG = LlamaConfig.tiny(tie_embeddings=False)
TARGET = LlamaForward(CONFIG)
PARAMS = init_params(CONFIG, jax.random.key(0))
OTHER_PARAMS = init_params(CONFIG, jax.random.key(1))
PROMPTS = [[1, 2, 3], [5, 9, 11, 13, 2, 7, 30], [4, 4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23]]
GREEDY = js.SamplingConfig(temperature=0)
MAX_NEW = 24


@dataclasses.dataclass(frozen=True)
class AdversarialDraft(js.ModelDraft):
  """Proposes, at every position, a token that the target's greedy choice is not."""

  def propose(self, params, state, ctx):
    proposal = super().propose(params, state, ctx)
    wrong = (proposal.tokens + 1) % ctx.vocab_size
    return dataclasses.replace(proposal, tokens=wrong, q=jax.nn.one_hot(wrong, ctx.vocab_size))


def _run(draft, draft_params, k):
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=MAX_NEW, sampling=GREEDY)
  out = js.generate(PARAMS, draft_params, tokens, lengths, np.full(len(lengths), 0), target=TARGET,
                    draft=draft, config=config)
  return out.new_tokens(), js.summarize(out.metrics)


@pytest.fixture(scope='module')
def plain():
  tokens, summary = _run(None, None, 0)
  assert summary['mean_accepted_length'] == 1.0
  assert len({tuple(t) for t in tokens}) == len(PROMPTS)  # the rows really differ
  return tokens


DRAFTS = {
    'perfect': (js.ModelDraft(TARGET), PARAMS),
    'useless': (js.ModelDraft(TARGET), OTHER_PARAMS),
    'adversarial': (AdversarialDraft(TARGET), PARAMS),
    'ngram': (js.NGramDraft(), None),
    'early_exit': (js.ModelDraft(LlamaForward(CONFIG, num_layers=1), shares_target_cache=True),
                   PARAMS),
}


@pytest.mark.parametrize('k', [1, 2, 4, 7])
@pytest.mark.parametrize('name', list(DRAFTS))
def test_greedy_identity(plain, name, k):
  draft, draft_params = DRAFTS[name]
  tokens, summary = _run(draft, draft_params, k)
  assert tokens == plain
  assert summary['new_tokens'] == MAX_NEW * len(PROMPTS)
  if name == 'perfect':
    assert summary['acceptance_rate'] == 1.0
  if name == 'adversarial':
    assert summary['acceptance_rate'] == 0.0
    assert summary['mean_accepted_length'] == 1.0


def test_step_twin_matches_generate(plain):
  """The Python-loop twin (`generate_steps`) runs the same step and ends in the same tokens."""
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  config = js.DecodeConfig(num_draft_tokens=3, max_new_tokens=MAX_NEW, sampling=GREEDY)
  states = list(js.generate_steps(PARAMS, None, tokens, lengths, np.full(len(lengths), 0),
                                  target=TARGET, draft=js.NGramDraft(), config=config))
  last = states[-1]
  out = [np.asarray(last.tokens)[b, len(p):int(last.lengths[b])].tolist()
         for b, p in enumerate(PROMPTS)]
  assert out == plain
  assert int(last.metrics.target_forward_passes.max()) == len(states)


def test_bfloat16_weights_and_cache():
  """bf16 weights and KV cache (as on accelerators): logits and acceptance math stay float32,
  and greedy speculative output still equals plain greedy output."""
  cfg = LlamaConfig.tiny(tie_embeddings=False, dtype='bfloat16')
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.ndim > 1 else x, PARAMS)
  target = LlamaForward(cfg)
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  logits, cache = target(params, jnp.asarray(tokens), target.init_cache(3, 16),
                         jnp.zeros((3,), jnp.int32))
  assert logits.dtype == jnp.float32 and cache[0]['k'].dtype == jnp.bfloat16
  run = lambda draft, k: js.generate(
      params, params, tokens, lengths, np.full(len(lengths), 0), target=target, draft=draft,
      config=js.DecodeConfig(num_draft_tokens=k, max_new_tokens=MAX_NEW,
                             sampling=GREEDY)).new_tokens()
  assert run(js.ModelDraft(LlamaForward(cfg, num_layers=1), shares_target_cache=True), 3) == \
      run(None, 0)
