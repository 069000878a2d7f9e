"""Small-row float32 matmuls on the CPU through C++ kernels (`jax.ffi`), XLA's dot elsewhere.

XLA:CPU leaves its matrix-vector kernel as soon as a matmul has more than one row, and its GEMM
packs (re-reads) the weights, so a forward pass of T = 2..16 tokens costs up to 3x one of T = 1
although both read the same weights once. `matmul(x, w)` computes `x @ w` with the kernel in
`models/csrc/` (built by `pip install` as `models/_small_matmul*.so`), which reads each weight
once for all rows on both cores, when all of these hold; otherwise it is exactly `x @ w` in XLA:

- the backend is the CPU (chosen with `jax.lax.platform_dependent`, so GPU/TPU lowerings never
  contain the custom call), and there is a single device (a custom call is opaque to the SPMD
  partitioner, so meshes - and the fake multi-device CPUs of the sharding tests - use XLA);
- the extension was built from the current `models/csrc/` sources (a fingerprint compiled into
  it, `models/kernel_sources.py`) and loads, and `JAXSPEC_CPU_MATMUL` is not `0` (read at import);
- x and w are float32, w is 2-D `[K, N]` and x has 1 to `MAX_ROWS` rows (product of its leading
  dimensions): prefill of long prompts stays on XLA's GEMM, which is good at many rows.

Up to `STREAM_MAX_ROWS` (16) rows (a decode step, a verify window, batch-16 decoding) take the
streaming form (`jaxspec_matmul_kn_stream`): w's rows split in 4 parts that both cores stream in
memory order, each output an fma chain over its part's k, the parts added in order. Up to
`MAX_ROWS` rows take the tile form (`jaxspec_matmul_kn`, `kernel_matmul`): one fma chain over all
of k per output, register tiles of rows sweeping strips of columns. In both a row's result does
not depend on the other rows, and both differ from XLA's dot only by float round-off (docs/
cpu_verify.md: at one row the streaming form is ~20% faster here than XLA's one-row dot, which
streams on one core). The invariant mode takes the tile form at every row count, so a row gets
the same bits alone as in a window. Gradients use XLA matmuls (`jax.custom_vjp`). `matmul_nt` is
the same for weights stored (out, in), such as a tied embedding, except at one row, where XLA's
`x @ w.T` already streams on both cores; its streaming form for 2 to `STREAM_NK_MAX_ROWS` (16) rows
(`jaxspec_matmul_nk_stream`) reads w's rows in order, 4 at a time, for all rows of x, each
output 16 lane-wise fma chains summed by a fixed tree (a row's bits do not depend on the others).

`attention_scores` and `attention_mix` are the two cache products of grouped-query attention
(`'BTMGH,BSMH->BMGTS'` and `'BMGTS,BSMH->BTMGH'`), which XLA:CPU runs as B*M separate small
GEMMs (about 1 ms a layer at B=16, most of a batch-16 decode step); same selection rules, with T
in place of the rows.

`invariant=True` (every function here; `LlamaConfig.invariant`) makes the results of a row
independent of how many rows there are, for window/batch-invariant decoding (docs/invariance.md):
on a 1-device CPU the kernel then takes every row count, one row and prefill included (its
per-row arithmetic does not depend on R), and bfloat16 operands too: activations cast exactly to
float32, bfloat16 weights read as they are and widened exactly on load (`*_bf16` targets: the
same bits as the float32 kernel on float32 copies, half the bytes), fp32 accumulation, the
result rounded back to bfloat16 as XLA's bf16 dot rounds its fp32 accumulator. Elsewhere (GPU/TPU lowerings, meshes, no extension) it is XLA's dot,
which is not row-invariant.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.machinery
import os

import jax
import jax.numpy as jnp

from models import kernel_sources

MAX_ROWS = 64
TARGET = 'jaxspec_matmul_kn'
STREAM_TARGET = 'jaxspec_matmul_kn_stream'
STREAM_NK_TARGET = 'jaxspec_matmul_nk_stream'
STREAM_MAX_ROWS = 16
STREAM_NK_MAX_ROWS = 16
# FFI target name -> exported handler symbol of the extension.
_TARGETS = {TARGET: 'JaxspecMatmulKN', 'jaxspec_matmul_nk': 'JaxspecMatmulNK',
            STREAM_TARGET: 'JaxspecStreamKN', STREAM_NK_TARGET: 'JaxspecStreamNK',
            'jaxspec_matmul_kn_bf16': 'JaxspecMatmulKNBf16',
            'jaxspec_matmul_nk_bf16': 'JaxspecMatmulNKBf16',
            'jaxspec_attn_scores': 'JaxspecAttnScores',
            'jaxspec_attn_mix': 'JaxspecAttnMix'}
_DIR = os.path.dirname(os.path.abspath(__file__))


def _load() -> str | None:
  """Loads and registers the kernel; returns None on success, else why it is unavailable."""
  if os.environ.get('JAXSPEC_CPU_MATMUL', '1') == '0':
    return 'disabled by JAXSPEC_CPU_MATMUL=0'
  paths = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES
           for p in glob.glob(os.path.join(_DIR, '_small_matmul' + suffix))]
  if not paths:
    return f'no built extension models/_small_matmul*.so in {_DIR} (pip install -e . builds it)'
  try:
    lib = ctypes.CDLL(paths[0])
    expected = kernel_sources.source_hash()
    lib.JaxspecSourceHash.restype = ctypes.c_char_p
    built = lib.JaxspecSourceHash().decode()
    if expected is not None and built != expected:
      return (f'{paths[0]} was built from other sources than models/csrc/ (built {built}, '
              f'sources {expected}); rebuild it: pip install -e . (or python setup.py build_ext '
              '--inplace)')
    for name, symbol in _TARGETS.items():
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform='cpu')
  except (OSError, AttributeError) as e:  # a broken build: fall back to XLA
    return f'{paths[0]} failed to load: {e}'
  return None


UNAVAILABLE_REASON = _load()


def _ffi(target, shape, *args):
  """A float32 custom call of the extension (vmap: one call per batch element)."""
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, jnp.float32),
                          vmap_method='sequential')(*args)


def available() -> bool:
  """Whether the C++ kernel is built, loaded and enabled (it is then used on a 1-device CPU)."""
  return UNAVAILABLE_REASON is None


def kernel_matmul(x_RK: jax.Array, w_KN: jax.Array) -> jax.Array:
  """The raw kernel, CPU only: float32 `x [R, K] @ w [K, N] -> [R, N]`.

  Raises:
    RuntimeError: the kernel is unavailable (see `UNAVAILABLE_REASON`).
  """
  if not available():
    raise RuntimeError(f'CPU matmul kernel unavailable: {UNAVAILABLE_REASON}')
  return _ffi(TARGET, (x_RK.shape[0], w_KN.shape[1]), x_RK, w_KN)


def _dtypes_ok(a, b, invariant: bool) -> bool:
  """float32 operands; in the invariant mode also bfloat16 ones (cast to float32 in the kernel)."""
  allowed = (jnp.float32, jnp.bfloat16) if invariant else (jnp.float32,)
  return a.dtype == b.dtype and a.dtype in allowed


def uses_kernel(x: jax.Array, w: jax.Array, invariant: bool = False) -> bool:
  """Whether `matmul(x, w, invariant)` takes the kernel on a CPU (from shapes, dtypes, devices)."""
  rows = 1
  for d in x.shape[:-1]:
    rows *= d
  rows_ok = rows >= 1 and (invariant or rows <= MAX_ROWS)
  return (available() and jax.device_count() == 1 and w.ndim == 2 and x.ndim >= 1
          and _dtypes_ok(x, w, invariant) and rows_ok
          and x.shape[-1] == w.shape[0] and w.shape[1] >= 1)


def _as_f32(fn):
  """fn on float32 copies of its operands (exact for bfloat16), result in the first's dtype."""
  return lambda a, b: fn(a.astype(jnp.float32), b.astype(jnp.float32)).astype(a.dtype)


def _weights_kernel(target, out_shape):
  """The CPU branch of a weight matmul: float32 x; bfloat16 weights go to the `_bf16` target
  unconverted; the result in x's dtype."""
  def run(x, w):
    name = target + '_bf16' if w.dtype == jnp.bfloat16 else target
    return _ffi(name, out_shape(x, w), x.astype(jnp.float32), w).astype(x.dtype)
  return run


@jax.custom_vjp
def _small_rows(x_RK, w_KN):
  kernel = _weights_kernel(TARGET, lambda x, w: (x.shape[0], w.shape[1]))
  return jax.lax.platform_dependent(x_RK, w_KN, cpu=kernel, default=jnp.matmul)


@jax.custom_vjp
def _streamed(x_RK, w_KN):
  kernel = lambda x, w: _ffi(STREAM_TARGET, (x.shape[0], w.shape[1]), x, w)
  return jax.lax.platform_dependent(x_RK, w_KN, cpu=kernel, default=jnp.matmul)


def _matmul_fwd(fn):
  return lambda x_RK, w_KN: (fn(x_RK, w_KN), (x_RK, w_KN))


def _matmul_bwd(res, g_RN):
  x_RK, w_KN = res
  return g_RN @ w_KN.T, x_RK.T @ g_RN


_small_rows.defvjp(_matmul_fwd(_small_rows), _matmul_bwd)
_streamed.defvjp(_matmul_fwd(_streamed), _matmul_bwd)


def matmul(x: jax.Array, w_KN: jax.Array, invariant: bool = False) -> jax.Array:
  """`x [..., K] @ w [K, N] -> [..., N]`: the kernel where `uses_kernel` holds, else XLA's dot.

  Raises:
    ValueError: the last dimension of x does not match w's first (from XLA's dot).
  """
  if not uses_kernel(x, w_KN, invariant):
    return x @ w_KN
  lead = x.shape[:-1]
  x_RK = x.reshape(-1, x.shape[-1])
  stream = x_RK.shape[0] <= STREAM_MAX_ROWS and not invariant
  y = _streamed(x_RK, w_KN) if stream else _small_rows(x_RK, w_KN)
  return y.reshape(*lead, w_KN.shape[1])


def describe() -> str:
  """One line for logs and benchmarks: whether the kernel is on, and if not why."""
  return 'C++ small-row kernel' if available() else f'XLA dot ({UNAVAILABLE_REASON})'


def platform_line() -> str:
  """The header line of the timing scripts: jax version, platform, cores and `describe()`."""
  return (f'jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} cores; '
          f'kernel path: {describe()}')


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                invariant: bool = False):
  """Drop-in `jax.lax.dot_general` for Flax `Dense`/`DenseGeneral` (`dot_general=`): a
  contraction of lhs's trailing axes with rhs's leading axes, without batch axes (every dense
  projection), goes through `matmul` (kernel or XLA, see the module docstring); anything else,
  or a `preferred_element_type` other than lhs's dtype, is `jax.lax.dot_general` unchanged."""
  (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
  n = len(lhs_c)
  dense = (not lhs_b and not rhs_b and n >= 1
           and tuple(lhs_c) == tuple(range(lhs.ndim - n, lhs.ndim))
           and tuple(rhs_c) == tuple(range(n)) and rhs.ndim > n
           and preferred_element_type in (None, lhs.dtype))
  if dense:
    k = 1
    for d in lhs.shape[lhs.ndim - n:]:
      k *= d
    x = lhs.reshape(*lhs.shape[:lhs.ndim - n], k)
    w = rhs.reshape(k, -1)
    if uses_kernel(x, w, invariant):
      return matmul(x, w, invariant).reshape(*lhs.shape[:lhs.ndim - n], *rhs.shape[n:])
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type)


def invariant_dot_general(lhs, rhs, dimension_numbers, precision=None,
                          preferred_element_type=None):
  """`dot_general(..., invariant=True)`, for Flax's `dot_general=`."""
  return dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                     invariant=True)


@jax.custom_vjp
def _small_rows_nk(x_RK, w_NK):
  kernel = _weights_kernel('jaxspec_matmul_nk', lambda x, w: (x.shape[0], w.shape[0]))
  return jax.lax.platform_dependent(x_RK, w_NK, cpu=kernel, default=lambda x, w: x @ w.T)


def _small_rows_nk_bwd(res, g_RN):
  x_RK, w_NK = res
  return g_RN @ w_NK, g_RN.T @ x_RK


_small_rows_nk.defvjp(lambda x, w: (_small_rows_nk(x, w), (x, w)), _small_rows_nk_bwd)


@jax.custom_vjp
def _streamed_nk(x_RK, w_NK):
  kernel = lambda x, w: _ffi(STREAM_NK_TARGET, (x.shape[0], w.shape[0]), x, w)
  return jax.lax.platform_dependent(x_RK, w_NK, cpu=kernel, default=lambda x, w: x @ w.T)


_streamed_nk.defvjp(lambda x, w: (_streamed_nk(x, w), (x, w)), _small_rows_nk_bwd)


def matmul_nt(x: jax.Array, w_NK: jax.Array, invariant: bool = False) -> jax.Array:
  """`x [..., K] @ w[N, K].T -> [..., N]` for weights stored (out, in), like a tied embedding
  `[V, D]`: one row (not invariant) is XLA's `x @ w.T`, which streams w on both cores (~30 GB/s
  here against ~21 for the tile kernel and the einsum below); 2 to `STREAM_NK_MAX_ROWS` rows (not
  invariant) the kernel's streaming NK form; more rows, or the invariant mode, the tile kernel where
  `uses_kernel(x, w.T)` would hold, else XLA's `einsum('NK,...K->N...')` moved back (N leading:
  XLA:CPU runs that 3-4x faster for several rows than `x @ w.T`). Raises ValueError if x's last
  dimension is not w's second (from XLA)."""
  if x.size == x.shape[-1] and not invariant:  # contracting w's last axis: no transpose
    y = jax.lax.dot_general(x.reshape(1, -1), w_NK, (((1,), (1,)), ((), ())))
    return y.reshape(*x.shape[:-1], w_NK.shape[0])
  if not uses_kernel(x, w_NK.T, invariant):
    return jnp.moveaxis(jnp.einsum('NK,...K->N...', w_NK, x), 0, -1)
  lead = x.shape[:-1]
  x_RK = x.reshape(-1, x.shape[-1])
  stream = x_RK.shape[0] <= STREAM_NK_MAX_ROWS and not invariant
  return (_streamed_nk if stream else _small_rows_nk)(x_RK, w_NK).reshape(*lead, w_NK.shape[0])


def _attention_ok(a, kv, t: int, invariant: bool) -> bool:
  return (available() and jax.device_count() == 1 and a.ndim == 5 and kv.ndim == 4
          and _dtypes_ok(a, kv, invariant) and (invariant or t <= MAX_ROWS))


_SCORES, _MIX = 'BTMGH,BSMH->BMGTS', 'BMGTS,BSMH->BTMGH'


@jax.custom_vjp
def _scores(q_BTMGH, k_BSMH):
  b, t, m, g, _ = q_BTMGH.shape
  kernel = lambda q, k: _ffi('jaxspec_attn_scores', (b, m, g, t, k.shape[1]),
                            q.astype(jnp.float32), k.astype(jnp.float32))
  xla = lambda q, k: jnp.einsum(_SCORES, q, k, preferred_element_type=jnp.float32)
  return jax.lax.platform_dependent(q_BTMGH, k_BSMH, cpu=kernel, default=xla)


def _scores_bwd(res, g_BMGTS):
  q, k = res
  return jnp.einsum('BMGTS,BSMH->BTMGH', g_BMGTS, k), jnp.einsum('BMGTS,BTMGH->BSMH', g_BMGTS, q)


_scores.defvjp(lambda q, k: (_scores(q, k), (q, k)), _scores_bwd)


@jax.custom_vjp
def _mix(p_BMGTS, v_BSMH):
  b, m, g, t, _ = p_BMGTS.shape
  kernel = _as_f32(lambda p, v: _ffi('jaxspec_attn_mix', (b, t, m, g, v.shape[-1]), p, v))
  xla = lambda p, v: jnp.einsum(_MIX, p, v)
  return jax.lax.platform_dependent(p_BMGTS, v_BSMH, cpu=kernel, default=xla)


def _mix_bwd(res, g_BTMGH):
  p, v = res
  return jnp.einsum('BTMGH,BSMH->BMGTS', g_BTMGH, v), jnp.einsum('BTMGH,BMGTS->BSMH', g_BTMGH, p)


_mix.defvjp(lambda p, v: (_mix(p, v), (p, v)), _mix_bwd)


def attention_scores(q_BTMGH: jax.Array, k_BSMH: jax.Array, invariant: bool = False) -> jax.Array:
  """`einsum('BTMGH,BSMH->BMGTS')` (float32 result): the kernel on a 1-device CPU for float32
  inputs with T <= MAX_ROWS (invariant: also bfloat16, any T), else XLA's einsum. Raises
  ValueError on mismatched shapes."""
  if _attention_ok(q_BTMGH, k_BSMH, q_BTMGH.shape[1], invariant):
    if (q_BTMGH.shape[0], q_BTMGH.shape[2], q_BTMGH.shape[4]) != (
        k_BSMH.shape[0], k_BSMH.shape[2], k_BSMH.shape[3]):
      raise ValueError(f'attention_scores: q {q_BTMGH.shape} does not match k {k_BSMH.shape}')
    return _scores(q_BTMGH, k_BSMH)
  return jnp.einsum(_SCORES, q_BTMGH, k_BSMH, preferred_element_type=jnp.float32)


def attention_mix(p_BMGTS: jax.Array, v_BSMH: jax.Array, invariant: bool = False) -> jax.Array:
  """`einsum('BMGTS,BSMH->BTMGH')`: the kernel on a 1-device CPU for float32 inputs with
  T <= MAX_ROWS (invariant: also bfloat16, any T), else XLA's einsum (result dtype of the
  inputs). Raises ValueError on mismatched shapes."""
  if _attention_ok(p_BMGTS, v_BSMH, p_BMGTS.shape[3], invariant):
    if (p_BMGTS.shape[0], p_BMGTS.shape[4], p_BMGTS.shape[1]) != v_BSMH.shape[:3]:
      raise ValueError(f'attention_mix: p {p_BMGTS.shape} does not match v {v_BSMH.shape}')
    return _mix(p_BMGTS, v_BSMH)
  return jnp.einsum(_MIX, p_BMGTS, v_BSMH)
