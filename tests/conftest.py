"""Shared test setup: CPU, float32 matmuls, key-reuse checking on.

XLA's backend optimization is lowered for the tests: they are dominated by compiling many small
programs, and -O0 compiles about a third faster with the same results (the same assertions pass
at the default level).
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_backend_optimization_level=0').strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_debug_key_reuse', True)
jax.config.update('jax_default_matmul_precision', 'highest')

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: one process runs the whole suite,
  and the executables of hundreds of configurations would otherwise stay in memory (a full run
  aborted inside XLA's compiler near the end without this)."""
  yield
  jax.clear_caches()
