"""Makes the draft-training corpus: prompts (Magpie and grounded), then the target's answers.

Stage `prompts` (`make_prompts`) writes `OUT/prompts.jsonl.gz`, one JSON object a line:
`id`, `prompt`, `kind` ('magpie' or 'grounded') and where it came from (Magpie: `seed`,
`temperature`, `top_p`, `system`; grounded: `task`, `source`, `document`). First the grounded
prompts (`grounded_fraction` of `num_prompts`, or as many as the machine's text gives), then
Magpie prompts for the rest: raw samples go to `WORK/magpie/shard_*.npz` (not kept in the
repository) one shard at a time, until enough pass. Every prompt passes, in order:
`text_filters` (length, language), the evaluation-overlap test (`dedupe.DevOverlap`), the
chat-encoded length bound and the de-duplication (`dedupe.Deduper`, one for all prompts); a
Magpie sample must first be a finished user message (`magpie.message`). The rows are
shuffled with the seed, so that any run of answer shards is a sample of the whole.

Stage `answers` (`make_answers`) answers every prompt with the target under the default chat
template, greedily or (`sampled_fraction` of the shards, `answer_plan`) at temperature 1,
and writes `OUT/answers/shard_*.npz` (`models.corpus`; columns `prompt_id`, `kind`, `sampled`,
`seed`, `temperature`, `finish`), `shard_size` prompts each.

Both stages resume: a shard that exists is skipped, and `OUT/manifest.json` records each
stage's settings (what decides the data, not the batch size), so that a rerun with other
settings is refused instead of mixing two corpora. Every row's tokens depend only on its
prompt and seed, so a resumed or re-batched run writes the same data.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import os
import time

import numpy as np
from tqdm import tqdm

import jaxspec as js
from models import (batched_decode, corpus, dedupe, files, grounded, magpie,
                    prompts as prompt_files, text_filters as tf)

KINDS = ('magpie', 'grounded')
MAGPIE_RULE = tf.LanguageRule(min_words=2, max_words=150, min_chars=12, max_chars=1000)
GROUNDED_RULE = tf.LanguageRule(max_words=400)  # the passage passed grounded.PASSAGE_RULE


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptSpec:
  """What decides the prompts (recorded in the manifest)."""

  num_prompts: int = 22000
  grounded_fraction: float = 0.3
  magpie_shard_size: int = 1024
  magpie_max_new_tokens: int = 40  # the evaluation chat prompts are 5-14 words
  max_prompt_tokens: int = 384
  seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnswerSpec:
  """What decides the answers (recorded in the manifest)."""

  shard_size: int = 512
  max_new_tokens: int = 128
  sampled_fraction: float = 0.5
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class Part:
  """Process `index` of `count` working on one corpus side by side (one a core: a decode
  process here keeps about one core busy). It makes only the shards whose number is `index`
  modulo `count`, and waits for the others' shards where it needs them (the Magpie prompts
  are read in shard order). Part 0 writes what the stage ends with (prompts.jsonl.gz, the
  manifest's facts); the default, `Part(0, 1)`, is a run alone."""
  index: int = 0
  count: int = 1

  def __post_init__(self):
    if not 0 <= self.index < self.count:
      raise ValueError(f'part {self.index}/{self.count}: want 0 <= index < count')

  @classmethod
  def parse(cls, text: str) -> 'Part':
    """'W/N' -> Part(W, N); ValueError otherwise."""
    try:
      index, count = (int(x) for x in text.split('/'))
    except ValueError:
      raise ValueError(f'want W/N (this process W of N, 0 <= W < N), got {text!r}') from None
    return cls(index, count)

  def owns(self, shard: int) -> bool:
    return shard % self.count == self.index


POLL_SECONDS = 20


def _wait_for(path: str) -> None:
  while not os.path.exists(path):
    time.sleep(POLL_SECONDS)


class SettingsMismatch(ValueError):
  """A stage was begun in this output directory with other settings."""


def _check_manifest(out_dir: str, stage: str, spec) -> None:
  """Records `spec` (a dataclass or dict) under `stage` in `out_dir/manifest.json`; raises
  SettingsMismatch when the stage was begun there with other settings."""
  path = os.path.join(out_dir, 'manifest.json')
  manifest = json.load(open(path, encoding='utf-8')) if os.path.exists(path) else {}
  want = spec if isinstance(spec, dict) else dataclasses.asdict(spec)
  have = manifest.get(stage, {}).get('settings')
  if have is not None and have != want:
    diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    raise SettingsMismatch(f'{out_dir}: its {stage} stage was made with other settings '
                     f'(recorded, asked): {diff}; use another output directory or remove it')
  manifest.setdefault(stage, {})['settings'] = want
  _write_json(path, manifest)


def _record(out_dir: str, stage: str, **facts) -> None:
  path = os.path.join(out_dir, 'manifest.json')
  manifest = json.load(open(path, encoding='utf-8'))
  manifest[stage].update(facts)
  _write_json(path, manifest)


def _write_json(path, value):
  # Parts of one run (processes or threads) may write it together: each its own temp file.
  with files.atomic_path(path) as tmp, open(tmp, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=1, sort_keys=True)
    f.write('\n')


def prompts_path(out_dir: str) -> str:
  return os.path.join(out_dir, 'prompts.jsonl.gz')


def read_prompts(out_dir: str) -> list[dict]:
  """The rows of `OUT/prompts.jsonl.gz`."""
  with gzip.open(prompts_path(out_dir), 'rt', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def write_prompts(path: str, rows: list[dict]) -> None:
  """Gzipped JSON lines, byte for byte the same for the same rows (no name or time stamp in
  the header), atomically."""
  with (files.atomic_path(path) as tmp, open(tmp, 'wb') as raw,
        gzip.GzipFile(filename='', fileobj=raw, mode='wb', mtime=0) as f):
    for row in rows:
      f.write((json.dumps(row, ensure_ascii=False) + '\n').encode('utf-8'))


class PromptFilter:
  """The checks every prompt passes, in order; `reasons` counts what each one dropped."""

  def __init__(self, tok, max_prompt_tokens: int, dev_texts: list[str]):
    self.tok, self.max_prompt_tokens = tok, max_prompt_tokens
    self.dev = dedupe.DevOverlap(dev_texts)
    self.seen = dedupe.Deduper()
    self.reasons = collections.Counter()

  def __call__(self, text: str, rule: tf.LanguageRule) -> bool:
    why = None
    if not tf.length_ok(text, rule):
      why = 'length'
    elif not tf.looks_english(text, rule):
      why = 'language'
    elif self.dev.reason(text):
      why = 'evaluation overlap'
    elif len(self.tok.encode_chat(text)) > self.max_prompt_tokens:
      why = 'too many tokens'
    else:
      duplicate = self.seen.add(text)  # remembers the text when it is new
      why = duplicate and f'{duplicate} duplicate'
    self.reasons[why or 'kept'] += 1
    return why is None


def _magpie_shard(decoder, tok, prefixes, index, spec, path):
  plan = magpie.shard_plan(index, spec.magpie_shard_size, spec.seed)
  setting = js.SamplingConfig(temperature=float(plan['temperature'][0]),
                              top_p=float(plan['top_p'][0]))
  prompts = [prefixes[s] for s in plan['system']]
  bar = tqdm(total=len(prompts), desc=f'magpie shard {index}', unit='row', leave=False)
  new, reasons = decoder.run(prompts, plan['seed'], setting, spec.magpie_max_new_tokens, bar)
  bar.close()
  finish = np.array([js.FINISH_REASONS.index(r) for r in reasons], np.uint8)
  corpus.write_shard(path, [p + n for p, n in zip(prompts, new)], [len(p) for p in prompts],
                     finish=finish, **plan)


def magpie_rows(decoder, tok, spec: PromptSpec, work_dir: str, keep: PromptFilter,
                num: int, part: Part = Part()) -> list[dict]:
  """`num` Magpie prompts that pass `keep`, from raw shards made (or found) in order in
  `work_dir/magpie` (whose manifest records the settings that made them); of the shards
  missing, `part` makes those it owns and waits for the others."""
  prefixes = [magpie.user_turn_prefix(tok, s) for s in magpie.SYSTEM_PROMPTS]
  rows, raw = [], os.path.join(work_dir, 'magpie')
  _check_manifest(raw, 'magpie', {'magpie_shard_size': spec.magpie_shard_size, 'seed': spec.seed,
                                  'magpie_max_new_tokens': spec.magpie_max_new_tokens})
  max_shards = 20 * math.ceil(num / spec.magpie_shard_size)
  bar = tqdm(total=num, desc='magpie prompts kept', unit='prompt')
  for index in range(max_shards):
    path = corpus.shard_path(raw, index)
    while not os.path.exists(path):
      # Make this shard if it is ours; else the next one of ours the count still needs
      # (estimated at the keep rate so far), and wait only when there is none.
      seen = index * spec.magpie_shard_size
      rate = max(len(rows) / seen if seen else 0.5, 0.1)
      need = index + math.ceil((num - len(rows)) / (rate * spec.magpie_shard_size))
      mine = [j for j in range(index, need) if part.owns(j)
              and not os.path.exists(corpus.shard_path(raw, j))]
      if mine:
        _magpie_shard(decoder, tok, prefixes, mine[0], spec, corpus.shard_path(raw, mine[0]))
      else:
        bar.set_postfix_str(f'waiting for shard {index} (part {index % part.count})')
        time.sleep(POLL_SECONDS)
    shard = corpus.read_shard(path)
    t, o, p = shard['tokens'], shard['offsets'], shard['prompt_lengths']
    for r in range(len(p)):
      text = magpie.message(tok, t[o[r] + p[r]:o[r + 1]],
                            js.FINISH_REASONS[shard['finish'][r]] == 'eos')
      if text is None:
        keep.reasons['unfinished or reply-like'] += 1
      elif keep(text, MAGPIE_RULE):
        rows.append({'prompt': text, 'kind': 'magpie', 'seed': int(shard['seed'][r]),
                     'temperature': round(float(shard['temperature'][r]), 3),
                     'top_p': round(float(shard['top_p'][r]), 3),
                     'system': int(shard['system'][r])})
        bar.update(1)
        if len(rows) == num:
          bar.close()
          return rows
  bar.close()
  raise RuntimeError(f'{max_shards} Magpie shards gave only {len(rows)} of {num} prompts')


def grounded_rows(spec: PromptSpec, keep: PromptFilter, num: int) -> list[dict]:
  """`num` grounded prompts that pass `keep`, from 25% more passages than asked for (fewer
  when the machine's text runs out: said, and `make_prompts` makes more Magpie prompts)."""
  passages = grounded.collect(int(num * 1.25) + 10, spec.seed, exclude=keep.dev)
  rows = []
  for row in tqdm(grounded.make_prompts(passages, spec.seed), desc='grounded prompts',
                  unit='prompt'):
    if len(rows) < num and keep(row['prompt'], GROUNDED_RULE):
      rows.append(row)
  if len(rows) < num:
    print(f'only {len(rows)} of {num} grounded prompts (the text found ran out): Magpie '
          'prompts make up the rest')
  return rows


def make_prompts(params, forward, tok, spec: PromptSpec, out_dir: str, work_dir: str,
                 batch_size: int, context_length: int | None = None,
                 part: Part = Part()) -> list[dict]:
  """Stage `prompts` (module docstring); returns the rows (read back when already made).
  A `part` other than 0 stops when its share of the Magpie shards is made and returns []."""
  _check_manifest(out_dir, 'prompts', spec)
  if os.path.exists(prompts_path(out_dir)):
    print(f'{prompts_path(out_dir)} exists: the prompts stage is done')
    return read_prompts(out_dir)
  dev = [r['prompt'] for r in prompt_files.read_rows(prompt_files.DEV_PROMPTS)]
  keep = PromptFilter(tok, spec.max_prompt_tokens, dev)
  decoder = batched_decode.Decoder(params, forward, batch_size=batch_size, bucket=32,
                                   eos_id=tok.chat_eos_id, pad_id=tok.pad_id,
                                   context_length=context_length)
  rows = grounded_rows(spec, keep, round(spec.num_prompts * spec.grounded_fraction))
  keep.reasons.clear()
  rows += magpie_rows(decoder, tok, spec, work_dir, keep, spec.num_prompts - len(rows), part)
  if part.index:
    print(f'part {part.index}/{part.count}: its Magpie shards are made; part 0 writes the prompts')
    return []
  magpie_reasons = dict(keep.reasons)
  order = np.random.default_rng([spec.seed, 3]).permutation(len(rows))
  rows = [{'id': i, **rows[j]} for i, j in enumerate(order)]
  prompt_files.check_not_evaluation(rows, prompts_path(out_dir))
  makeup = collections.Counter(r['kind'] if r['kind'] == 'magpie' else
                               f"grounded/{r['source']}" for r in rows)
  _record(out_dir, 'prompts', num_prompts=len(rows), makeup=dict(makeup),
          magpie_raw_rows=sum(magpie_reasons.values()), magpie_filter=magpie_reasons,
          tasks=dict(collections.Counter(r['task'] for r in rows if r['kind'] == 'grounded')))
  # The prompts file last: the other parts wait for it before they touch the manifest.
  write_prompts(prompts_path(out_dir), rows)
  print(f'{len(rows)} prompts -> {prompts_path(out_dir)}: {dict(makeup)}; Magpie filter '
        f'{magpie_reasons}')
  if decoder.new_tokens:
    print(f'Magpie: {decoder.new_tokens} tokens in {decoder.decode_seconds:.0f} s '
          f'({decoder.tokens_per_second:.1f} tok/s) + {decoder.compile_seconds:.0f} s compiling')
  return rows


def answer_plan(num_rows: int, spec: AnswerSpec) -> tuple[np.ndarray, np.ndarray]:
  """(sampled [N] bool, seed [N] int64 < 2**31 drawn from the seed). A shard is sampled or
  greedy as a whole (a batch has one sampling rule, so a shard of one rule pads no extra
  batch), `sampled_fraction` of the shards spread evenly: 0.5 alternates greedy, sampled."""
  shard = np.arange(num_rows) // spec.shard_size
  f = spec.sampled_fraction
  sampled = np.floor((shard + 1) * f) > np.floor(shard * f)
  return sampled, np.random.default_rng([spec.seed, 2]).integers(0, 2**31, num_rows)


def answer_shard(decoder, rows, ids, sampled, seeds, spec: AnswerSpec, path, progress=None):
  """Answers rows `ids` (chat-encoded prompts `rows[i]['ids']`) and writes their shard."""
  prompts = [rows[i]['ids'] for i in ids]
  new, finish = [None] * len(ids), np.zeros(len(ids), np.uint8)
  for is_sampled in (False, True):
    part = [k for k, i in enumerate(ids) if sampled[i] == is_sampled]
    if part:
      sampling = js.SamplingConfig(temperature=1.0 if is_sampled else 0.0)
      out, why = decoder.run([prompts[k] for k in part], seeds[ids[part]], sampling,
                             spec.max_new_tokens, progress)
      for k, n, w in zip(part, out, why):
        new[k], finish[k] = n, js.FINISH_REASONS.index(w)
  corpus.write_shard(path, [p + n for p, n in zip(prompts, new)], [len(p) for p in prompts],
                     prompt_id=ids.astype(np.int32), sampled=sampled[ids], seed=seeds[ids],
                     temperature=sampled[ids].astype(np.float32), finish=finish,
                     kind=np.array([KINDS.index(rows[i]['kind']) for i in ids], np.uint8))


def make_answers(params, forward, tok, spec: AnswerSpec, out_dir: str, batch_size: int,
                 bucket: int = 64, context_length: int | None = None,
                 part: Part = Part()) -> None:
  """Stage `answers` (module docstring): writes the shards still missing (of them, those
  `part` owns; part 0 then waits for the rest and records the stage's facts)."""
  if part.index:
    _wait_for(prompts_path(out_dir))  # part 0 writes it, after its facts in the manifest
  _check_manifest(out_dir, 'answers', spec)
  rows = read_prompts(out_dir)
  prompt_files.check_not_evaluation(rows, prompts_path(out_dir))
  for r in rows:
    r['ids'] = tok.encode_chat(r['prompt'])
  sampled, seeds = answer_plan(len(rows), spec)
  shards_dir = os.path.join(out_dir, 'answers')
  num_shards = math.ceil(len(rows) / spec.shard_size)
  missing = corpus.missing_shards(shards_dir, num_shards)
  todo = [i for i in missing if part.owns(i)]
  shard_rows = lambda i: np.arange(i * spec.shard_size, min(len(rows), (i + 1) * spec.shard_size))
  print(f'{num_shards - len(missing)} of {num_shards} answer shards exist; {len(todo)} to make '
        f'(part {part.index}/{part.count})')
  decoder = batched_decode.Decoder(params, forward, batch_size=batch_size, bucket=bucket,
                                   eos_id=tok.chat_eos_id, pad_id=tok.pad_id,
                                   context_length=context_length)
  bar = tqdm(total=sum(len(shard_rows(i)) for i in todo), unit='prompt',
             desc='answers' + (f' (part {part.index}/{part.count})' if part.count > 1 else ''))
  for index in todo:
    answer_shard(decoder, rows, shard_rows(index), sampled, seeds, spec,
                 corpus.shard_path(shards_dir, index), bar)
    bar.set_postfix(tok_s=f'{decoder.tokens_per_second:.0f}')
  bar.close()
  if todo:
    print(f'{decoder.new_tokens} answer tokens in {decoder.decode_seconds:.0f} s '
          f'({decoder.tokens_per_second:.1f} tok/s) + {decoder.compile_seconds:.0f} s compiling')
  if part.index:
    return
  for i in missing:
    _wait_for(corpus.shard_path(shards_dir, i))
  data = corpus.load(shards_dir)
  answer_tokens = int(data['offsets'][-1] - data['prompt_lengths'].sum())
  _record(out_dir, 'answers', num_rows=len(data['prompt_lengths']), answer_tokens=answer_tokens,
          total_tokens=int(data['offsets'][-1]), sampled_rows=int(data['sampled'].sum()))
  print(f'{len(data["prompt_lengths"])} rows, {answer_tokens} answer tokens in {shards_dir}')
