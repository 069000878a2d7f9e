"""The C++ small-row CPU matmul kernel (models/cpu_matmul.py) against XLA's dot and float64.

Error bound: each kernel output is one fused multiply-add chain over k, whose rounding error is at
most gamma_K * sum_k |x_k w_k| with gamma_K = K eps / (1 - K eps) (Higham, Accuracy and Stability
of Numerical Algorithms, 3.1); XLA's dot obeys the same bound, so the two differ by at most twice.
"""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import cpu_matmul
from models.llama import LlamaConfig, LlamaForward, init_params

EPS = np.finfo(np.float32).eps
# Rows 1..16 (the verify and batch-decode range) and a few past the 3-row register tile, with
# odd widths: no multiple of the 32-column strip, a strip plus a tail, and a single column.
SHAPES = [(1, 1, 1), (1, 7, 5), (2, 33, 65), (3, 576, 1536), (4, 100, 31), (5, 1536, 576),
          (6, 64, 32), (7, 13, 97), (8, 191, 193), (9, 576, 192), (11, 3, 129), (13, 250, 33),
          (16, 577, 95), (16, 1536, 576), (17, 40, 70), (64, 35, 257)]

pytestmark = pytest.mark.skipif(
    os.environ.get('JAXSPEC_CPU_MATMUL') == '0', reason='kernel disabled by JAXSPEC_CPU_MATMUL=0')


def _data(rows, k, n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((rows, k), np.float32), rng.standard_normal((k, n), np.float32)


def _bound(x, w):
  k = x.shape[1]
  gamma = k * EPS / (1 - k * EPS)
  return gamma * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64))


def test_kernel_is_built_and_loaded():
  """`pip install -e .` compiles the extension; a silent fallback would hide a broken build."""
  assert cpu_matmul.available(), cpu_matmul.UNAVAILABLE_REASON


@pytest.mark.parametrize('rows, k, n', SHAPES)
def test_kernel_matches_float64_and_xla(rows, k, n):
  x, w = _data(rows, k, n, seed=rows * 1000 + k)
  ours = np.asarray(jax.jit(cpu_matmul.kernel_matmul)(x, w))
  xla = np.asarray(jax.jit(jnp.matmul)(x, w))
  exact = x.astype(np.float64) @ w.astype(np.float64)
  bound = _bound(x, w)
  assert ours.shape == (rows, n) and ours.dtype == np.float32
  assert np.all(np.abs(ours - exact) <= bound)
  assert np.all(np.abs(ours - xla) <= 2 * bound)


@pytest.mark.parametrize('rows, k, n', SHAPES)
def test_transposed_kernel_matches_float64_and_xla(rows, k, n):
  """`matmul_nt(x, w_NK)` = x @ w_NK.T, the tied-head layout; its error bound is the same."""
  x, w = _data(rows, k, n, seed=rows * 1000 + k + 1)
  w_nk = np.ascontiguousarray(w.T)
  ours = np.asarray(jax.jit(cpu_matmul.matmul_nt)(x, w_nk))
  assert cpu_matmul.uses_kernel(jnp.asarray(x), jnp.asarray(w))
  exact = x.astype(np.float64) @ w.astype(np.float64)
  assert ours.shape == (rows, n)
  assert np.all(np.abs(ours - exact) <= _bound(x, w))
  lead = np.asarray(cpu_matmul.matmul_nt(x.reshape(1, rows, k), w_nk))
  np.testing.assert_array_equal(lead[0], ours)
  cot = np.ones((rows, n), np.float32)
  gx, gw = jax.grad(lambda x, w: jnp.sum(cpu_matmul.matmul_nt(x, w) * cot), argnums=(0, 1))(x, w_nk)
  np.testing.assert_allclose(gx, cot @ w_nk.astype(np.float64), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gw, cot.T @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


STREAM_SHAPES = [(1, 1, 1), (1, 7, 5), (1, 576, 192), (1, 576, 1536), (1, 1536, 576),
                 (1, 2000, 3), (2, 33, 65), (3, 576, 1536), (4, 100, 31), (5, 1536, 576),
                 (6, 64, 32), (7, 577, 95), (8, 191, 193), (8, 576, 192), (9, 576, 1536),
                 (12, 100, 65), (16, 1536, 576)]


@pytest.mark.parametrize('rows, k, n', STREAM_SHAPES)
def test_streaming_form_matches_float64_and_xla(rows, k, n):
  """Up to STREAM_MAX_ROWS rows take the streaming form: k split in parts, each an fma chain, the
  parts added in order. That adds at most 3 roundings to chains of K/4 terms, so the single
  chain's bound with gamma_K still holds."""
  x, w = _data(rows, k, n, seed=k * 7 + n + rows)
  fn = jax.jit(cpu_matmul.matmul)
  assert cpu_matmul.STREAM_TARGET in fn.lower(x, w).as_text()
  ours = np.asarray(fn(x, w))
  exact = x.astype(np.float64) @ w.astype(np.float64)
  bound = _bound(x, w)
  assert ours.shape == (rows, n) and ours.dtype == np.float32
  assert np.all(np.abs(ours - exact) <= bound)
  assert np.all(np.abs(ours - np.asarray(jax.jit(jnp.matmul)(x, w))) <= 2 * bound)
  np.testing.assert_array_equal(np.asarray(fn(x, w)), ours)  # deterministic across calls
  lead = np.asarray(cpu_matmul.matmul(x.reshape(1, rows, k), w))  # leading dims flatten
  np.testing.assert_array_equal(lead[0], ours)
  # A row alone gives the same bits as among the others (the parts do not depend on R).
  alone = np.concatenate([np.asarray(fn(x[r:r + 1], w)) for r in range(rows)])
  np.testing.assert_array_equal(alone, ours)
  # The invariant mode keeps the single chain at every row count: the tile kernel's bits.
  inv = np.asarray(jax.jit(lambda x, w: cpu_matmul.matmul(x, w, invariant=True))(x, w))
  np.testing.assert_array_equal(inv, np.asarray(cpu_matmul.kernel_matmul(x, w)))


@pytest.mark.parametrize('rows, k, n', STREAM_SHAPES + [(9, 577, 33), (16, 576, 129)])
def test_streaming_transposed_form_matches_float64_and_xla(rows, k, n):
  """Up to STREAM_NK_MAX_ROWS rows, `matmul_nt` (the tied head of a verify window) takes the
  streaming NK form: 16 lane-wise chains per output summed by a fixed tree, then the tail. Each
  lane's chain has at most ceil(K/16) terms and the tree adds 4 roundings, so the single chain's
  bound with gamma_K holds. A row gets the same bits alone as among the others."""
  x, w = _data(rows, k, n, seed=k * 5 + n + rows)
  w_nk = np.ascontiguousarray(w.T)
  fn = jax.jit(cpu_matmul.matmul_nt)
  assert cpu_matmul.STREAM_NK_TARGET in fn.lower(x, w_nk).as_text() or rows == 1
  ours = np.asarray(fn(x, w_nk))
  exact = x.astype(np.float64) @ w.astype(np.float64)
  bound = _bound(x, w)
  assert ours.shape == (rows, n) and ours.dtype == np.float32
  assert np.all(np.abs(ours - exact) <= bound)
  streamed = jax.jit(cpu_matmul._streamed_nk)  # pylint: disable=protected-access
  together = np.asarray(streamed(x, w_nk))
  assert np.all(np.abs(together - exact) <= bound)
  alone = np.concatenate([np.asarray(streamed(x[r:r + 1], w_nk)) for r in range(rows)])
  np.testing.assert_array_equal(alone, together)
  # The invariant mode keeps the tile kernel (8 lanes) at every row count.
  inv = np.asarray(jax.jit(lambda x, w: cpu_matmul.matmul_nt(x, w, invariant=True))(x, w_nk))
  assert cpu_matmul.STREAM_NK_TARGET not in jax.jit(
      lambda x, w: cpu_matmul.matmul_nt(x, w, invariant=True)).lower(x, w_nk).as_text()
  assert np.all(np.abs(inv - exact) <= bound)


_ISA_SCRIPT = """
import sys, numpy as np, jax
from models import cpu_matmul
rng = np.random.default_rng(0)
out = []
for rows, k, n in [(1, 576, 1536), (3, 577, 95), (8, 100, 67), (5, 33, 2), (6, 64, 64),
                   (16, 40, 9), (9, 577, 96), (13, 150, 64), (16, 1536, 33)]:
  x, w = rng.standard_normal((rows, k), np.float32), rng.standard_normal((k, n), np.float32)
  w_nk = np.ascontiguousarray(w.T)
  out += [np.asarray(jax.jit(cpu_matmul.matmul)(x, w)), np.asarray(cpu_matmul.kernel_matmul(x, w)),
          np.asarray(jax.jit(cpu_matmul.matmul_nt)(x, w_nk)),
          np.asarray(jax.jit(lambda x, w: cpu_matmul.matmul_nt(x, w, invariant=True))(x, w_nk))]
np.savez(sys.argv[1], *out)
"""


def test_instruction_sets_give_the_same_bits(tmp_path):
  """The AVX-512, AVX2 and scalar paths of every form (streaming and tile, KN and NK) compute the
  same fma chains: the same bits
  (JAXSPEC_CPU_MATMUL_ISA caps the instruction set; a CPU without AVX-512 runs avx2 twice)."""
  runs = {}
  for isa in ('native', 'avx2', 'scalar'):
    env = dict(os.environ, JAXSPEC_CPU_MATMUL_ISA=isa, JAX_PLATFORMS='cpu')
    path = tmp_path / f'{isa}.npz'
    subprocess.run([sys.executable, '-c', _ISA_SCRIPT, str(path)], env=env, check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    runs[isa] = np.load(path)
  for isa in ('avx2', 'scalar'):
    for key in runs['native'].files:
      np.testing.assert_array_equal(runs[isa][key], runs['native'][key], err_msg=f'{isa} {key}')


def test_rows_do_not_change_each_others_results():
  """A row's output is bit-identical whether it is computed alone or among 1..16 rows (each
  output is the same fma chain over k whatever R is): what a window-invariant verify needs."""
  x, w = _data(16, 577, 161, seed=3)
  alone = np.stack([np.asarray(cpu_matmul.kernel_matmul(x[r:r + 1], w))[0] for r in range(16)])
  for rows in range(1, 17):
    together = np.asarray(cpu_matmul.kernel_matmul(x[:rows], w))
    np.testing.assert_array_equal(together, alone[:rows])


def test_matmul_takes_the_kernel_only_where_it_applies():
  x, w = _data(3, 8, 5)
  assert cpu_matmul.uses_kernel(jnp.asarray(x), jnp.asarray(w))
  assert cpu_matmul.uses_kernel(jnp.asarray(x[:1]), jnp.asarray(w))  # 1 row: the streaming form
  assert cpu_matmul.uses_kernel(jnp.zeros((2, 3, 8)), jnp.asarray(w))  # leading dims flatten
  assert not cpu_matmul.uses_kernel(jnp.zeros((cpu_matmul.MAX_ROWS + 1, 8)), jnp.asarray(w))
  assert not cpu_matmul.uses_kernel(jnp.zeros((0, 8)), jnp.asarray(w))  # no rows
  assert cpu_matmul.matmul(jnp.zeros((0, 8)), jnp.asarray(w)).shape == (0, 5)
  assert not cpu_matmul.uses_kernel(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16))
  assert not cpu_matmul.uses_kernel(jnp.asarray(x), jnp.zeros((8, 5, 2)))
  lowered = jax.jit(cpu_matmul.matmul).trace(jnp.asarray(x), jnp.asarray(w))
  assert cpu_matmul.TARGET in lowered.lower(lowering_platforms=('cpu',)).as_text()
  one = jax.jit(cpu_matmul.matmul).trace(jnp.asarray(x[:1]), jnp.asarray(w))
  assert cpu_matmul.STREAM_TARGET in one.lower(lowering_platforms=('cpu',)).as_text()
  for platform in ('cuda', 'tpu'):  # accelerators never see the custom calls
    assert cpu_matmul.TARGET not in lowered.lower(lowering_platforms=(platform,)).as_text()
    assert cpu_matmul.STREAM_TARGET not in one.lower(lowering_platforms=(platform,)).as_text()
  big = jnp.ones((cpu_matmul.MAX_ROWS + 1, 8))  # prefill-sized: XLA's dot, exactly
  np.testing.assert_array_equal(cpu_matmul.matmul(big, jnp.asarray(w)), big @ jnp.asarray(w))


@pytest.mark.parametrize('rows', [1, 5])
def test_gradients_and_vmap_match_xla(rows):
  x, w = _data(rows, 37, 19, seed=7)
  loss = lambda mm: lambda x, w: jnp.sum(jnp.sin(mm(x, w)))
  ours = jax.grad(loss(cpu_matmul.matmul), argnums=(0, 1))(x, w)
  xla = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
  for a, b in zip(ours, xla):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  xs = np.stack([x, 2 * x])
  np.testing.assert_allclose(jax.vmap(cpu_matmul.matmul, in_axes=(0, None))(xs, w), xs @ w,
                             rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('tie', [True, False])
def test_llama_forward_kernel_equals_xla(tie):
  """The same params through both paths: logits and caches agree within fp32 round-off, for
  prefill, a verify-sized T and batch > 1; the kernel path really contains the custom call."""
  config = LlamaConfig.tiny(tie_embeddings=tie, embed_dim=40, mlp_dim=72)
  params = init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, 5), 0, config.vocab_size)
  start = jnp.array([0, 4, 9], jnp.int32)
  out = {}
  for on in (True, False):
    forward = LlamaForward(dataclasses.replace(config, cpu_kernel=on))
    fn = jax.jit(forward)
    args = (params, tokens, forward.init_cache(3, 16), start)
    assert (cpu_matmul.TARGET in fn.lower(*args).as_text()) == on
    out[on] = fn(*args)
  np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(out[True][1]), jax.tree.leaves(out[False][1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('b, t, m, g, s, h', [(1, 1, 3, 3, 201, 64), (16, 1, 3, 3, 37, 64),
                                              (2, 9, 1, 4, 50, 256), (3, 5, 2, 2, 17, 13),
                                              (1, 16, 4, 1, 9, 8)])
def test_attention_products_match_xla(b, t, m, g, s, h):
  rng = np.random.default_rng(b * 100 + t)
  q = rng.standard_normal((b, t, m, g, h), np.float32)
  k = rng.standard_normal((b, s, m, h), np.float32)
  p = rng.random((b, m, g, t, s), np.float32)
  scores = np.asarray(jax.jit(cpu_matmul.attention_scores)(q, k))
  mixed = np.asarray(jax.jit(cpu_matmul.attention_mix)(p, k))
  exact_scores = np.einsum('BTMGH,BSMH->BMGTS', q.astype(np.float64), k)
  exact_mixed = np.einsum('BMGTS,BSMH->BTMGH', p.astype(np.float64), k)
  gamma = lambda n: n * EPS / (1 - n * EPS)
  assert scores.shape == exact_scores.shape and mixed.shape == exact_mixed.shape
  assert np.all(np.abs(scores - exact_scores) <= gamma(h) * np.einsum(
      'BTMGH,BSMH->BMGTS', np.abs(q).astype(np.float64), np.abs(k)))
  assert np.all(np.abs(mixed - exact_mixed) <= gamma(s) * np.einsum(
      'BMGTS,BSMH->BTMGH', p.astype(np.float64), np.abs(k)))
  lowered = jax.jit(cpu_matmul.attention_scores).lower(q, k).as_text()
  assert 'jaxspec_attn_scores' in lowered
  cotangent = rng.standard_normal(scores.shape, np.float32)  # linear loss: no round-off gain
  grads = [jax.grad(lambda q, k: jnp.sum(fn(q, k) * cotangent), argnums=(0, 1))(q, k)
           for fn in (cpu_matmul.attention_scores,
                      lambda q, k: jnp.einsum('BTMGH,BSMH->BMGTS', q, k))]
  for a, b_ in zip(*grads):
    np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-5)
