"""Small-row float32 matmul on the CPU through a C++ kernel (`jax.ffi`), XLA's dot elsewhere.

XLA:CPU leaves its matrix-vector kernel as soon as a matmul has more than one row, and its GEMM
packs (re-reads) the weights, so a forward pass of T = 2..16 tokens costs up to 3x one of T = 1
although both read the same weights once. `matmul(x, w)` computes `x @ w` with the kernel in
`models/csrc/` (built by `pip install` as `models/_small_matmul*.so`), which reads each weight
once for all rows on both cores, when all of these hold; otherwise it is exactly `x @ w` in XLA:

- the backend is the CPU (chosen with `jax.lax.platform_dependent`, so GPU/TPU lowerings never
  contain the custom call), and there is a single device (a custom call is opaque to the SPMD
  partitioner, so meshes - and the fake multi-device CPUs of the sharding tests - use XLA);
- the extension was built and loads, and `JAXSPEC_CPU_MATMUL` is not `0` (read at import);
- x and w are float32, w is 2-D `[K, N]` and x has at most `MAX_ROWS` rows (product of its
  leading dimensions; prefill of long prompts stays on XLA's GEMM, which is good at many rows).

Each output is one fused multiply-add chain over k in order, whatever the row count, so the
kernel's result for a row does not depend on the other rows (it differs from XLA's dot only by
float round-off). Gradients use XLA matmuls (`jax.custom_vjp`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.machinery
import os

import jax
import jax.numpy as jnp

MAX_ROWS = 64
TARGET = 'jaxspec_matmul_kn'
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
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.JaxspecMatmulKN), platform='cpu')
  except (OSError, AttributeError) as e:  # a broken build: fall back to XLA
    return f'{paths[0]} failed to load: {e}'
  return None


UNAVAILABLE_REASON = _load()


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
  out = jax.ShapeDtypeStruct((x_RK.shape[0], w_KN.shape[1]), jnp.float32)
  return jax.ffi.ffi_call(TARGET, out, vmap_method='sequential')(x_RK, w_KN)


def uses_kernel(x: jax.Array, w: jax.Array) -> bool:
  """Whether `matmul(x, w)` takes the kernel on a CPU (decided from shapes, dtypes, devices)."""
  rows = 1
  for d in x.shape[:-1]:
    rows *= d
  return (available() and jax.device_count() == 1 and w.ndim == 2 and x.ndim >= 1
          and x.dtype == jnp.float32 and w.dtype == jnp.float32 and 1 <= rows <= MAX_ROWS
          and x.shape[-1] == w.shape[0] and w.shape[1] >= 1)


@jax.custom_vjp
def _small_rows(x_RK, w_KN):
  return jax.lax.platform_dependent(x_RK, w_KN, cpu=kernel_matmul, default=jnp.matmul)


def _small_rows_fwd(x_RK, w_KN):
  return _small_rows(x_RK, w_KN), (x_RK, w_KN)


def _small_rows_bwd(res, g_RN):
  x_RK, w_KN = res
  return g_RN @ w_KN.T, x_RK.T @ g_RN


_small_rows.defvjp(_small_rows_fwd, _small_rows_bwd)


def matmul(x: jax.Array, w_KN: jax.Array) -> jax.Array:
  """`x [..., K] @ w [K, N] -> [..., N]`: the kernel where `uses_kernel` holds, else XLA's dot.

  Raises:
    ValueError: the last dimension of x does not match w's first (from XLA's dot).
  """
  if not uses_kernel(x, w_KN):
    return x @ w_KN
  lead = x.shape[:-1]
  y = _small_rows(x.reshape(-1, x.shape[-1]), w_KN)
  return y.reshape(*lead, w_KN.shape[1])


@functools.cache
def describe() -> str:
  """One line for logs and benchmarks: whether the kernel is on, and if not why."""
  return 'C++ small-row kernel' if available() else f'XLA dot ({UNAVAILABLE_REASON})'


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
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
    if uses_kernel(x, w):
      return matmul(x, w).reshape(*lhs.shape[:lhs.ndim - n], *rhs.shape[n:])
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type)
