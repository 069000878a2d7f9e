"""The operations view (jaxspec/operations.py) on a tiny Llama: the memory split follows the array
shapes, plain decoding does one target position per committed token, a draft with its own model
adds its params and KV cache, and `stops_paying` names the batch size from which a draft stays
below plain decoding."""

import dataclasses

import jax
import numpy as np
import pytest

import jaxspec as js
from jaxspec import bench_rounds, operations
from models import llama


def _measure(draft, dparams, k, batch):
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  tokens, lengths = js.pad_prompts([[1, 2, 3, 1, 2, 3]] * batch, bucket=8)
  decode = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=8,
                           sampling=js.SamplingConfig(temperature=0))
  target = llama.LlamaForward(config)
  draft_params = params if dparams == 'target' else dparams
  runs = operations.measure(params, [(tokens, lengths, np.arange(batch))],
                            {'m': (draft, draft_params, decode)}, target=target, reps=1)
  return config, params, runs['m']


def test_plain_memory_split_and_work():
  config, params, r = _measure(None, None, 0, 2)
  s = js.buffer_length(8, 8, 0)
  kv = 2 * config.num_layers * 2 * s * config.num_kv_heads * config.head_dim * 4  # K and V, f32
  assert r['memory']['target_kv_cache'] >= kv
  assert r['memory']['target_params'] == sum(a.nbytes for a in jax.tree.leaves(params))
  assert r['memory']['draft_params'] == 0 and r['memory']['draft_state'] == 0
  assert r['target_positions_per_token'] == 1.0
  assert r['new_tokens'] == 16 and r['tokens_per_s'] > 0 and r['ttft_s'] >= r['prefill_s'] > 0


def test_draft_model_adds_its_params_and_cache():
  config = llama.LlamaConfig.tiny(num_layers=1)
  dparams = llama.init_params(config, jax.random.key(1))
  _, _, r = _measure(js.ModelDraft(llama.LlamaForward(config)), dparams, 2, 1)
  assert r['memory']['draft_params'] == sum(a.nbytes for a in jax.tree.leaves(dparams))
  assert r['memory']['draft_state'] > 0
  assert r['target_positions_per_token'] >= 1.0  # W = 3 positions per pass, >= 1 token a pass
  _, _, shared = _measure(js.ModelDraft(llama.LlamaForward(llama.LlamaConfig.tiny(),
                                                           num_layers=1),
                                        shares_target_cache=True), 'target', 2, 1)
  assert shared['memory']['draft_params'] == 0 and shared['memory']['draft_state'] == 0


def test_every_batch_size_serves_the_same_requests():
  tokens = np.arange(5)[:, None] * np.ones((5, 3), np.int32)
  lengths, seeds = np.full(5, 3), 100 + np.arange(5)
  for b, rows in [(1, [[0], [1], [2], [3], [4]]), (2, [[0, 1], [2, 3], [4, 0]]),
                  (5, [[0, 1, 2, 3, 4]]), (8, [[0, 1, 2, 3, 4, 0, 1, 2]])]:
    batches = operations.batches_of(tokens, lengths, seeds, b)
    assert [bt[:, 0].tolist() for bt, _, _ in batches] == rows
    assert [s.tolist() for _, _, s in batches] == [[100 + i for i in r] for r in rows]


def test_batches_add_up():
  """Two batches of one request each: the totals are the sum of the batches' (one batch of the
  same two requests commits the same tokens, greedy)."""
  config = llama.LlamaConfig.tiny()
  params = llama.init_params(config, jax.random.key(0))
  tokens, lengths = js.pad_prompts([[1, 2, 3, 1, 2, 3], [4, 5, 6]], bucket=8)
  decode = js.DecodeConfig(num_draft_tokens=2, max_new_tokens=8,
                           sampling=js.SamplingConfig(temperature=0))
  run = lambda b: operations.measure(
      params, operations.batches_of(tokens, lengths, np.arange(2), b),
      {'plain': (None, None, dataclasses.replace(decode, num_draft_tokens=0)),
       'ngram': (js.NGramDraft(), None, decode)}, target=llama.LlamaForward(config), reps=1)
  by_one, by_two = run(1), run(2)
  for name in ('plain', 'ngram'):
    one, two = by_one[name], by_two[name]
    assert one['num_batches'] == 2 and two['num_batches'] == 1
    assert one['new_tokens'] == two['new_tokens'] == 16
    assert one['rounds_by_k'] == two['rounds_by_k']
    assert one['acceptance_rate'] == two['acceptance_rate']
    assert one['e2e_s'] > 0 and one['ttft_s'] >= one['prefill_s'] > 0
    # Over every sweep a method is no faster than over its best times.
    assert 0 < one['sweep_tokens_per_s'] <= one['tokens_per_s'] * (1 + 1e-9)
  assert by_one['plain']['target_positions_per_token'] == 1.0


def test_stops_paying():
  # Best-time throughputs (tokens_per_s) are not what is compared: they say the opposite.
  rows = [dict(method=m, batch_size=b, sweep_tokens_per_s=t, tokens_per_s=100 - t, tpot_s=1 / t,
               target_positions_per_token=w)
          for m, b, t, w in [('plain', 1, 10, 1), ('plain', 4, 30, 1), ('plain', 16, 80, 1),
                             ('a', 1, 15, 2), ('a', 4, 31, 2), ('a', 16, 60, 2),
                             ('b', 1, 9, 2), ('b', 4, 20, 2), ('b', 16, 70, 2),
                             ('c', 1, 11, 2), ('c', 4, 40, 2), ('c', 16, 90, 2)]]
  operations.add_relative(rows)
  assert operations.stops_paying(rows) == {'a': 16, 'b': 1, 'c': None}
  a16 = next(r for r in rows if r['method'] == 'a' and r['batch_size'] == 16)
  assert a16['speedup'] == 0.75 and a16['target_work_vs_plain'] == 2


def test_sweep_speedup_cancels_drift():
  # The method is 10% slower than plain in two sweeps out of three; in the third it ran in a fast
  # spell of the machine. Best times read x1.05 (10.5 s vs 10.0 s); all sweeps x0.95 (33.5/35.3).
  plain = {'new_tokens': 100, 'sweep_seconds': [12.0, 11.0, 10.5]}
  method = {'new_tokens': 100, 'sweep_seconds': [13.2, 12.1, 10.0]}
  assert min(plain['sweep_seconds']) / min(method['sweep_seconds']) == pytest.approx(1.05)
  assert bench_rounds.sweep_speedup(method, plain) == pytest.approx(33.5 / 35.3)
  assert bench_rounds.sweep_speedup(plain, plain) == 1.0
  # Tokens count: twice the tokens in the same time is x2.
  assert bench_rounds.sweep_speedup({**plain, 'new_tokens': 200}, plain) == pytest.approx(2)
  with pytest.raises(ValueError, match='different repeats'):
    bench_rounds.sweep_speedup({**method, 'sweep_seconds': [1.0]}, plain)


def test_sweep_speedup_error():
  # Per-sweep ratios 12/13.2, 11/12.1, 10.5/10.0: their sample sd over sqrt(3).
  plain = {'new_tokens': 100, 'sweep_seconds': [12.0, 11.0, 10.5]}
  method = {'new_tokens': 100, 'sweep_seconds': [13.2, 12.1, 10.0]}
  ratios = [12.0 / 13.2, 11.0 / 12.1, 10.5 / 10.0]
  assert bench_rounds.sweep_speedup_error(method, plain) == pytest.approx(
      np.std(ratios, ddof=1) / np.sqrt(3))
  assert bench_rounds.sweep_speedup_error(plain, plain) == 0.0
  assert np.isnan(bench_rounds.sweep_speedup_error({'new_tokens': 1, 'sweep_seconds': [1.0]},
                                                   {'new_tokens': 1, 'sweep_seconds': [2.0]}))
  with pytest.raises(ValueError, match='different repeats'):
    bench_rounds.sweep_speedup_error({**method, 'sweep_seconds': [1.0]}, plain)


def test_pooled_reference_averages_the_copies_per_sweep():
  # Two copies of one program: the pooled reference's sweeps are their means, so a method's
  # speed-up over it is its tokens over its seconds against the copies' mean seconds.
  first = {'new_tokens': 100, 'sweep_seconds': [10.0, 12.0, 11.0]}
  again = {'new_tokens': 100, 'sweep_seconds': [11.0, 12.0, 12.0]}
  method = {'new_tokens': 100, 'sweep_seconds': [11.0, 11.5, 11.5]}
  ref = bench_rounds.pooled_reference([first, again])
  assert ref['sweep_seconds'] == [10.5, 12.0, 11.5] and ref['new_tokens'] == 100
  assert bench_rounds.sweep_speedup(method, ref) == pytest.approx(34.0 / 34.0)
  assert bench_rounds.sweep_speedup(method, first) == pytest.approx(33.0 / 34.0)
  assert bench_rounds.pooled_reference([first]) == first
  with pytest.raises(ValueError, match='same tokens'):
    bench_rounds.pooled_reference([first, {**again, 'new_tokens': 99}])
  with pytest.raises(ValueError, match='different repeats'):
    bench_rounds.pooled_reference([first, {**again, 'sweep_seconds': [1.0]}])


def test_speedups_over_plain_puts_the_copies_over_the_first_and_the_rest_over_both():
  first = {'new_tokens': 100, 'sweep_seconds': [10.0, 12.0, 11.0]}
  again = {'new_tokens': 100, 'sweep_seconds': [11.0, 12.0, 12.0]}
  method = {'new_tokens': 100, 'sweep_seconds': [11.0, 11.5, 11.5]}
  x = bench_rounds.speedups_over_plain({'plain': first, 'plain again': again, 'm': method})
  assert x['plain'] == (1.0, 0.0)
  assert x['plain again'][0] == pytest.approx(bench_rounds.sweep_speedup(again, first))
  pooled = bench_rounds.pooled_reference([first, again])
  assert x['m'] == (bench_rounds.sweep_speedup(method, pooled),
                    bench_rounds.sweep_speedup_error(method, pooled))
  with pytest.raises(KeyError):
    bench_rounds.speedups_over_plain({'plain': first, 'm': method})
