"""scripts/bench_adaptive.py's floor line: plain decoding's round against the weight-read floor."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), '..', 'scripts', 'bench_adaptive.py')
_spec = importlib.util.spec_from_file_location('bench_adaptive_cli', _PATH)
bench_adaptive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_adaptive)


def _plain(batch_size, seconds, rounds):
  return dict(method='plain', batch_size=batch_size, batch_seconds=seconds, batch_rounds=rounds)


def test_floor_line_sets_each_batch_sizes_fastest_plain_round_against_the_floor():
  results = [_plain(1, [0.3, 0.5], [10, 10]),         # 40 ms a round
             _plain(1, [0.2, 0.4], [10, 10]),         # 30 ms: the faster cell counts
             dict(method='auto', batch_size=1, batch_seconds=[0.01], batch_rounds=[10]),
             _plain(16, [1.0], [10])]                 # 100 ms
  line = bench_adaptive._floor_line(results, dict(weight_bytes=500e6, copy_bytes_per_s=25e9))
  # floor: 500 MB / 25 GB/s = 20 ms
  assert 'weight-read floor 20.0 ms a round (500 MB of weights / 25.0 GB/s' in line
  assert 'B=1 30.0 ms (1.50x), B=16 100.0 ms (5.00x)' in line


def test_floor_line_is_empty_for_runs_stored_without_a_floor():
  assert bench_adaptive._floor_line([_plain(1, [0.3], [10])], None) == ''
