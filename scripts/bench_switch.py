"""What the adaptive-K switch costs: plain decoding against `auto` forced to K = 0 every round
(a cost model whose drafting rounds could pay only at rates ~1, no probes), with 5 and with 2
compiled branches, on one prompt (decoded by --batch-size rows together), with --draft compiled
in (default the n-gram); warm runs, interleaved; plain is timed twice ('plain again', the same
program: the run's noise); and the same for drafting rounds: a fixed K = 1 against `auto` forced
to K = 1 every round (K = 1 priced as a plain round, K >= 2 just under the K + 1 bound, so all 5
branches stay compiled and K = 1 always wins). Prints each method's best wall ms and its speed
over plain two ways: by best times and over all sweeps (`bench_rounds.sweep_speedup`, ± its
standard error).

  .venv/bin/python scripts/bench_switch.py [--batch-size 16] [--draft drafts/smollm2_exit] \\
      [--temperature 1]
"""

from __future__ import annotations

import argparse

import numpy as np

import jaxspec as js
from jaxspec import bench_rounds
from models import cli, loading


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--prompt', default='Tell me about the history of Rome in a few sentences.')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=48)
  p.add_argument('--repeats', type=cli.positive_int, default=3)
  p.add_argument('--batch-size', type=cli.positive_int, default=1,
                 help='rows decoding the prompt together (default 1)')
  p.add_argument('--temperature', type=cli.nonnegative_float, default=0.0,
                 help='sampling temperature (default 0: greedy)')
  p.add_argument('--draft', default='ngram',
                 type=cli.parsed_by(loading.parse_draft_spec, keep_text=True),
                 help='draft spec, as decode.py --draft (default ngram)')
  args = p.parse_args(argv)
  config, params, gguf = loading.load_model(args.model)
  tok = loading.tokenizer_for(gguf)
  tokens, lengths = js.pad_prompts([tok.encode_chat(args.prompt)] * args.batch_size,
                                   pad_id=tok.pad_id)
  sampling = js.SamplingConfig(temperature=args.temperature)
  # Rounds at K cost 0.99 (K + 1) plain ones, so every branch is compiled (`CostModel.paying`),
  # but K > 0 pays only at acceptance rates above 0.98 (chat prompts give the n-gram ~0.1); a
  # prior of 0 and no probes: every round is plain ('rounds by K' below shows it).
  costs = lambda k: (1.0,) + tuple(0.99 * (j + 1) for j in range(1, k + 1))
  off = lambda k: js.CostModel(ks=tuple(range(k + 1)), round_seconds=costs(k), prior=0.0,
                               probe_every=0)
  on = js.CostModel(ks=(0, 1, 2, 3, 4), round_seconds=(1.0, 1.0, 2.9, 3.9, 4.9), probe_every=0)
  cfg = lambda k, **kw: js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                                        sampling=sampling, **kw)
  draft, draft_params = loading.load_draft(args.draft, config, params, target_tokenizer=tok)
  methods = {'plain': (None, None, cfg(0)), 'plain again': (None, None, cfg(0)),
             'auto, 5 branches, K=0': (draft, draft_params, cfg(4, schedule=off(4))),
             'auto, 2 branches, K=0': (draft, draft_params, cfg(1, schedule=off(1))),
             'K=1': (draft, draft_params, cfg(1)),
             'auto, 5 branches, K=1': (draft, draft_params, cfg(4, schedule=on))}
  runs = bench_rounds.time_methods(params, [(tokens, lengths, np.arange(args.batch_size))], methods,
                                   target=loading.forward_for(config), repeats=args.repeats)
  plain = runs['plain']
  for name, r in runs.items():
    sweeps = [round(1e3 * t) for t in r['sweep_seconds']]
    print(f'{name}: {1e3 * r["seconds"]:.0f} ms, {r["tok_s"]:.1f} tok/s, x plain: best times '
          f'{plain["seconds"] / r["seconds"]:.3f}, over all sweeps '
          f'{bench_rounds.sweep_speedup(r, plain):.3f} '
          f'±{bench_rounds.sweep_speedup_error(r, plain):.3f}; '
          f'rounds by K {r["rounds_by_k"]}; '
          f'sweeps ms {sweeps}')


if __name__ == '__main__':
  main()
