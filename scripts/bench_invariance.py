"""Greedy identity and cost of the window/batch-invariant mode (`LlamaConfig.invariant`, issue 15).

For each numerics mode (default, invariant) it decodes the prompts greedily with plain decoding,
then with each draft at each K, all prompts in one batch, and prints per (mode, draft, K): how
many rows' tokens differ from plain decoding, the top-2 logit margin of plain decoding's logits
at each row's first differing token (a near-tie that flipped), and tokens/s of both. Tokens/s
exclude compilation and count every generated token of the batch.

  .venv/bin/python scripts/bench_invariance.py --dtype bfloat16 --num-prompts 16 \\
      --max-new-tokens 128 --drafts ngram,early-exit:24,drafts/smollm2_eagle \\
      --num-draft-tokens 1,2,3,4,5,6,7,8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec as js
from models import cli, loading, prompts as prompt_files

ROOT = cli.ROOT


def _from_root(spec: str) -> str:
  """A --drafts entry with a path taken from the repository root."""
  return os.path.join(ROOT, spec) if '/' in spec else spec


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  cli.add_model_flags(p, dtype=False)
  p.add_argument('--dtype', default='bfloat16', choices=cli.DTYPES,
                 help='parameter dtype (default bfloat16, where invariance matters)')
  cli.add_prompt_flags(p, prompt_files.DEV_PROMPTS)
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=128)
  p.add_argument('--drafts', default='ngram,early-exit:24,drafts/smollm2_eagle',
                 type=cli.list_of(cli.parsed_by(lambda spec: loading.parse_draft_spec(
                     _from_root(spec)), keep_text=True)),
                 help='comma-separated draft specs, as decode.py --draft')
  p.add_argument('--num-draft-tokens', type=cli.list_of(cli.positive_int),
                 default='1,2,3,4,5,6,7,8', help='comma-separated list of K')
  p.add_argument('--modes', type=cli.choices_of(('default', 'invariant')),
                 default='default,invariant')
  p.add_argument('--no-warmup', action='store_true',
                 help='time the first run (identity checks: half the time, tok/s less exact)')
  p.add_argument('--json', default=None, help='also write every row of the table here')
  args = p.parse_args(argv)
  args.num_prompts = args.num_prompts or 16
  return args


def _timed(compiled, args, warmup=True):
  if warmup:
    jax.block_until_ready(compiled(*args))
  start = time.perf_counter()
  out = jax.block_until_ready(compiled(*args))
  return out, time.perf_counter() - start


def _margins(forward, params, prompts, plain, spec):
  """Top-2 margin of the plain run's logits at each differing row's first differing token."""
  out = []
  for prompt, a, b in zip(prompts, plain, spec):
    if a == b:
      continue
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    seq = jnp.asarray([prompt + a[:i]], jnp.int32)
    logits, _ = forward(params, seq, forward.init_cache(1, seq.shape[1]), jnp.zeros((1,), jnp.int32))
    top2 = np.sort(np.asarray(logits[0, -1]))[-2:]
    out.append((i, round(float(top2[1] - top2[0]), 4)))
  return out


def main(argv=None):
  args = _parse(argv)
  base_config, params, gguf_path = loading.load_model(args.model, args.dtype)
  tok = loading.tokenizer_for(gguf_path)
  texts = [r['prompt'] for r in prompt_files.read_rows(args.prompts_file)][:args.num_prompts]
  prompts = [tok.encode_chat(t) for t in texts]
  tokens, lengths = js.pad_prompts(prompts, pad_id=tok.pad_id)
  keys = js.row_keys(np.zeros(len(prompts), np.int64))
  ks = args.num_draft_tokens
  rows = []
  print(f'SmolLM2-135M {args.dtype}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, '
        f'batch {len(prompts)}, greedy', flush=True)
  print('| mode | draft | K | rows differing | (first differing token, top-2 margin) | '
        'tok/s | plain tok/s |\n|---|---|---|---|---|---|---|', flush=True)
  for mode in args.modes:
    config = dataclasses.replace(base_config, invariant=mode == 'invariant')
    target = loading.forward_for(config)

    def decode(draft, dparams, k, target=target):
      dc = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                           sampling=js.SamplingConfig(temperature=0), eos_id=tok.chat_eos_id,
                           pad_id=tok.pad_id, context_length=config.context_length)
      compiled = js.compile_generate(params, dparams, tokens, lengths, keys, target=target,
                                     draft=draft, config=dc)
      out, seconds = _timed(compiled, (params, dparams, tokens, lengths, keys),
                            not args.no_warmup)
      summary = js.summarize(out.metrics)
      return out.new_tokens(), summary['new_tokens'] / seconds

    plain, plain_tps = decode(None, None, 0)
    print(f'| {mode} | plain | - | - | - | {plain_tps:.1f} | {plain_tps:.1f} |', flush=True)
    for spec in args.drafts:
      draft, dparams = loading.load_draft(_from_root(spec), config, params, args.dtype)
      for k in ks:
        out, tps = decode(draft, dparams, k)
        differing = _margins(target, params, prompts, plain, out)
        rows.append(dict(mode=mode, draft=spec, k=k, differing=len(differing), rows=len(prompts),
                         where_margin=differing, tokens_per_second=tps, plain_tps=plain_tps))
        print(f'| {mode} | {spec} | {k} | {len(differing)}/{len(prompts)} | {differing} | '
              f'{tps:.1f} | {plain_tps:.1f} |', flush=True)
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(rows, f, indent=1)


if __name__ == '__main__':
  main()
