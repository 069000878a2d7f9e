"""Shared test setup: CPU, float32 matmuls, key-reuse checking on, and `--run-slow`.

Tests marked `slow` (real-model decode sweeps of tens of minutes, far past the suite's budget)
run only with `pytest --run-slow`; without it they are reported as skipped with that reason.

XLA:CPU compiles faster for the tests: they are dominated by compiling many small programs.
Backend optimization -O0 compiles about a third faster, and XLA's elemental emitters instead of
its MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`) cut a tiny-model test's CPU
time by about a third again (16 invariance decode cases: 115 -> 75 CPU-s; compiling a
tiny-Llama decode loop 5.4 -> 1.7 s) while the real-weight tests run slower (tests/test_smollm2.py:
115 -> 142 CPU-s); the whole suite took 23.4 CPU-minutes with both (409 tests; 392 tests took
25.5 with -O0 alone). The same assertions pass with
XLA's defaults. `JAXSPEC_TEST_XLA_FLAGS` replaces these flags (to measure or compare).
"""

import atexit
import os
import shutil
import tempfile

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + os.environ.get(
    'JAXSPEC_TEST_XLA_FLAGS', ' --xla_backend_optimization_level=0'
    ' --xla_cpu_use_fusion_emitters=false')).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_debug_key_reuse', True)
jax.config.update('jax_default_matmul_precision', 'highest')

# One compilation cache for the run, shared by its workers: a program that another test file
# (or the other worker) already compiled is loaded instead of compiled again. The directory is
# new for each run (made by the controlling process, inherited by the workers, removed at the
# end), so a run never reuses what an earlier one compiled.
if 'PYTEST_XDIST_WORKER' not in os.environ and 'JAXSPEC_TEST_COMPILE_CACHE' not in os.environ:
  os.environ['JAXSPEC_TEST_COMPILE_CACHE'] = tempfile.mkdtemp(prefix='jaxspec-test-xla-')
  atexit.register(shutil.rmtree, os.environ['JAXSPEC_TEST_COMPILE_CACHE'], ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', os.environ['JAXSPEC_TEST_COMPILE_CACHE'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.3)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: one process runs the whole suite,
  and the executables of hundreds of configurations would otherwise stay in memory (a full run
  aborted inside XLA's compiler near the end without this)."""
  yield
  jax.clear_caches()


def pytest_addoption(parser):
  parser.addoption('--run-slow', action='store_true',
                   help='also run the tests marked slow (real-model sweeps, tens of minutes)')


def pytest_configure(config):
  config.addinivalue_line('markers', 'slow: a real-model sweep run only with --run-slow')


# The slowest test files first (CPU-seconds of one full run, `pytest --durations=0`, largest
# first): `--dist loadfile` hands files to the workers in collection order, so a heavy file
# collected last (alphabetically) would run alone at the end while the other core idles.
HEAVY_FIRST = ('test_invariance.py', 'test_trained_drafts.py', 'test_smollm2.py',
               'test_verifiers.py', 'test_schedule.py', 'test_greedy_identity.py',
               'test_sharding.py', 'test_exactness.py', 'test_gemma3.py')


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file
  if config.getoption('--run-slow'):
    return
  skip = pytest.mark.skip(reason='slow (a real-model sweep): run with pytest --run-slow')
  for item in items:
    if 'slow' in item.keywords:
      item.add_marker(skip)
