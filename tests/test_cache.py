"""KV-cache consistency of the model forward: one (K+1)-token verify pass equals K+1 one-token
steps, cached decoding equals a full forward pass, and stale entries past a row's length (left by
a rejected draft) never change the result."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.llama import LlamaConfig, LlamaForward, init_params

CONFIG = LlamaConfig.tiny(tie_embeddings=False)
MODEL = LlamaForward(CONFIG)
FWD = jax.jit(MODEL)
PARAMS = init_params(CONFIG, jax.random.key(0))
TOKENS = jax.random.randint(jax.random.key(1), (3, 20), 0, CONFIG.vocab_size)
S = 32
TOL = dict(atol=1e-5, rtol=1e-5)


def _full():
  logits, _ = FWD(PARAMS, TOKENS, MODEL.init_cache(3, S), jnp.zeros((3,), jnp.int32))
  return logits


@pytest.mark.parametrize('k', [1, 3, 6])
def test_verify_pass_equals_single_steps(k):
  start = jnp.array([4, 7, 11])  # rows at different positions
  cache = MODEL.init_cache(3, S)
  _, cache = FWD(PARAMS, TOKENS[:, :12], cache, jnp.zeros((3,), jnp.int32))
  window = jnp.stack([TOKENS[b, int(s):int(s) + k + 1] for b, s in enumerate(start)])
  multi, _ = FWD(PARAMS, window, cache, start)
  singles = []
  for t in range(k + 1):
    step_logits, cache = FWD(PARAMS, window[:, t:t + 1], cache, start + t)
    singles.append(step_logits)
  chex.assert_shape(multi, (3, k + 1, CONFIG.vocab_size))
  chex.assert_trees_all_close(multi, jnp.concatenate(singles, axis=1), **TOL)


def test_cached_decoding_equals_full_forward():
  full = _full()
  cache = MODEL.init_cache(3, S)
  pieces, pos = [], 0
  for width in (5, 1, 4, 1, 1, 8):  # prefill, then mixed one- and multi-token steps
    logits, cache = FWD(PARAMS, TOKENS[:, pos:pos + width], cache, jnp.full((3,), pos))
    pieces.append(logits)
    pos += width
  chex.assert_trees_all_close(jnp.concatenate(pieces, axis=1), full, **TOL)


def test_stale_entries_are_ignored():
  """Write garbage past the length (a rejected draft), roll back, continue: same logits."""
  full = _full()
  cache = MODEL.init_cache(3, S)
  _, cache = FWD(PARAMS, TOKENS[:, :10], cache, jnp.zeros((3,), jnp.int32))
  garbage = (TOKENS[:, 10:16] + 7) % CONFIG.vocab_size
  _, cache = FWD(PARAMS, garbage, cache, jnp.full((3,), 10))
  logits, _ = FWD(PARAMS, TOKENS[:, 10:14], cache, jnp.full((3,), 10))
  chex.assert_trees_all_close(logits, full[:, 10:14], **TOL)


def test_jit_matches_eager():
  cache = MODEL.init_cache(3, S)
  eager, _ = MODEL(PARAMS, TOKENS, cache, jnp.zeros((3,), jnp.int32))
  jitted, _ = FWD(PARAMS, TOKENS, cache, jnp.zeros((3,), jnp.int32))
  chex.assert_trees_all_close(eager, jitted, **TOL)
  assert np.isfinite(np.asarray(eager)).all()
