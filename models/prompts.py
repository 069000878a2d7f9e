"""The repository's prompt files and reading them.

`data/dev_prompts.jsonl` is the evaluation set (every line `"split": "evaluation"`): scripts
default to it for benchmarks and demos, and training data must never come from it
(`check_not_evaluation`). `data/train_prompts.jsonl` is what draft-training data is made from.
"""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV_PROMPTS = os.path.join(ROOT, 'data', 'dev_prompts.jsonl')
TRAIN_PROMPTS = os.path.join(ROOT, 'data', 'train_prompts.jsonl')
EVALUATION = 'evaluation'
KINDS = ('chat', 'grounded', 'code', 'multilingual')  # the "kind" field of the prompt files


def read_rows(path: str) -> list[dict]:
  """The rows of a prompts file: JSON lines with a "prompt" field (other fields kept), or one
  plain-text prompt a line (`{'prompt': line}`); blank lines skipped. Raises FileNotFoundError."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'prompts file not found: {path}')
  rows = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      line = line.rstrip('\n')
      if line.strip():
        rows.append(json.loads(line) if line.lstrip().startswith('{') else {'prompt': line})
  return rows


def select(rows: list[dict], kinds: list[str], num: int = 0) -> list[dict]:
  """The rows of the given kinds; with `num` > 0 the first `num`, kinds mixed round-robin."""
  rows = [r for r in rows if r.get('kind') in kinds]
  if num:
    by_kind = [[r for r in rows if r['kind'] == k] for k in kinds]
    mixed = [r for group in zip(*by_kind) for r in group]
    rows = (mixed + [r for r in rows if r not in mixed])[:num]
  return rows


def check_not_evaluation(rows: list[dict], path: str) -> None:
  """Raises ValueError when `rows` (from `path`) hold an evaluation line or any prompt of
  `data/dev_prompts.jsonl`: training data must never come from the evaluation set."""
  marked = [i for i, r in enumerate(rows) if r.get('split') == EVALUATION]
  dev = {r['prompt'] for r in read_rows(DEV_PROMPTS)}
  shared = [i for i, r in enumerate(rows) if r['prompt'] in dev]
  if marked or shared:
    raise ValueError(f'{path}: lines {(marked or shared)[:5]} are evaluation prompts '
                     f'({os.path.relpath(DEV_PROMPTS, ROOT)}); never train on them')
