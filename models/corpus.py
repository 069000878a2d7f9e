"""The draft-training corpus on disk: token sequences in compressed `.npz` shards, and reading
them back.

A shard holds R rows (sequences):

| array | shape, dtype | what |
|---|---|---|
| `tokens` | [N] uint16 | every row's token ids, concatenated (vocabularies up to 65,536 ids) |
| `offsets` | [R+1] int64 | row r is `tokens[offsets[r]:offsets[r+1]]` |
| `prompt_lengths` | [R] int32 | the first `prompt_lengths[r]` tokens of row r are its prompt |
| (columns) | [R] any | per-row facts the writer adds: `prompt_id`, `sampled`, `seed`, ... |

Shards are named `shard_00000.npz`, ... and written atomically (a temporary file renamed), so
a shard that exists is complete: `missing_shards` is what a resumed run still has to make.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import numpy as np

from models import files

TOKEN_DTYPE = np.uint16
# The stop of a shard range left open ('A:'): past any shard number.
OPEN_END = 1 << 30


def shard_path(directory: str, index: int) -> str:
  return os.path.join(directory, f'shard_{index:05d}.npz')


def shard_paths(directory: str) -> list[str]:
  """The shards present, in index order."""
  return sorted(glob.glob(os.path.join(directory, 'shard_[0-9][0-9][0-9][0-9][0-9].npz')))


def missing_shards(directory: str, num_shards: int) -> list[int]:
  """Indices in [0, num_shards) with no shard file yet."""
  return [i for i in range(num_shards) if not os.path.exists(shard_path(directory, i))]


def write_shard(path: str, sequences: list, prompt_lengths, **columns) -> None:
  """Writes R rows (token-id sequences, each a list or 1-D array) and their per-row columns.

  Raises ValueError when an id does not fit in uint16 or a column does not have R entries.
  """
  lengths = np.array([len(s) for s in sequences], np.int64)
  flat = np.concatenate([np.asarray(s, np.int64) for s in sequences]) if sequences else (
      np.zeros(0, np.int64))
  if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(TOKEN_DTYPE).max):
    raise ValueError(f'token ids must lie in [0, {np.iinfo(TOKEN_DTYPE).max}] to be stored as '
                     f'uint16, got [{flat.min()}, {flat.max()}]')
  arrays = dict(tokens=flat.astype(TOKEN_DTYPE), offsets=np.concatenate([[0], np.cumsum(lengths)]),
                prompt_lengths=np.asarray(prompt_lengths, np.int32))
  for name, value in columns.items():
    arrays[name] = np.asarray(value)
  bad = [k for k, v in arrays.items() if k not in ('tokens', 'offsets') and len(v) != len(lengths)]
  if bad:
    raise ValueError(f'columns {bad} need one entry per row ({len(lengths)})')
  with files.atomic_path(path, suffix='.npz') as tmp:
    np.savez_compressed(tmp, **arrays)


def read_shard(path: str) -> dict[str, np.ndarray]:
  """A shard's arrays (see the module docstring)."""
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def load(directory: str) -> dict[str, np.ndarray]:
  """Every shard of `directory` as one: `tokens` [N] int32, `offsets` [R+1], `prompt_lengths`
  and the per-row columns concatenated, plus `shard` [R] (each row's shard index)."""
  parts = [read_shard(p) for p in shard_paths(directory)]
  if not parts:
    raise FileNotFoundError(f'no shards in {directory}')
  out = {'tokens': np.concatenate([p['tokens'] for p in parts]).astype(np.int32)}
  lengths = np.concatenate([np.diff(p['offsets']) for p in parts])
  out['offsets'] = np.concatenate([[0], np.cumsum(lengths)])
  for name in parts[0]:
    if name not in ('tokens', 'offsets'):
      out[name] = np.concatenate([p[name] for p in parts])
  out['shard'] = np.concatenate([np.full(len(p['prompt_lengths']), i, np.int32)
                                 for i, p in enumerate(parts)])
  return out


def sequences(directory: str) -> list[np.ndarray]:
  """Every row as an int32 array (prompt then answer), shard by shard (training input)."""
  data = load(directory)
  t, o = data['tokens'], data['offsets']
  return [t[o[r]:o[r + 1]] for r in range(len(o) - 1)]


def pairs(directory: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(prompt ids, answer ids) of every row, int32 arrays, shard by shard."""
  for path in shard_paths(directory):
    shard = read_shard(path)
    t, o, p = shard['tokens'].astype(np.int32), shard['offsets'], shard['prompt_lengths']
    for r in range(len(p)):
      yield t[o[r]:o[r] + p[r]], t[o[r] + p[r]:o[r + 1]]
