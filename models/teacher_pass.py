"""One target prefill pass over generated text: the teacher distributions a draft is distilled
from (DistillSpec, Zhou et al. 2024) and, for EAGLE, the target's features (Li et al. 2024).

The corpus in the repository keeps only token ids (`models.corpus`); what training needs besides
is recomputed here, once per machine, and cached next to the training run: one `.npz` per corpus
shard in the layout `models.draft_training.load_rows` reads (`tokens` [N] int32, `offsets`
[R+1], `prompt_lengths` [R], `sampled` [R], `teacher_ids` [N,k] int32, `teacher_logp` [N,k]
float16: position i predicts token i+1 of its row), and with `features` the target's final-normed
features `[R,T,D]` float16 in the row layout `load_rows` gives for T = `seq_len` (rows longer than
T keep their end), saved as `<shard>_features_<T>.npy`, where `draft_training.eagle_recipe` looks.
Each position's numbers come from the whole sequence before it, never from a cropped window.

Shape letters: R rows, N tokens of all rows, B batch, P padded length, k top-k, D width, T seq_len.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from models import corpus, files


def _programs(forward, params, top_k: int, features: bool):
  """One jitted pass `tokens [B,P] int32 -> (ids [B,P,k] int32, logp [B,P,k] float16[,
  features [B,P,D] float16])`, compiled once per P."""

  @jax.jit
  def run(tokens_BP):
    b, p = tokens_BP.shape
    cache, start = forward.init_cache(b, p), jnp.zeros((b,), jnp.int32)
    if features:
      logits, _, feats = forward.with_features(params, tokens_BP, cache, start)
    else:
      logits, _ = forward(params, tokens_BP, cache, start)
    logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), top_k)
    out = (ids.astype(jnp.int32), logp.astype(jnp.float16))
    return out + ((feats.astype(jnp.float16),) if features else ())

  return run


def teacher_pass(forward, params, sequences: Sequence[np.ndarray], prompt_lengths, *,
                 top_k: int = 16, batch_size: int = 8, bucket: int = 64,
                 features_seq_len: int | None = None, desc: str = 'teacher') -> dict:
  """The target over every sequence, batched by length.

  Args:
    forward: the target (`jaxspec.contracts.Model`; a `FeatureModel` when features are asked).
    sequences: R token arrays (prompt then answer).
    prompt_lengths: `[R]` prompt tokens of each sequence.
    top_k: teacher log-probs kept per position.
    batch_size, bucket: B, and P rounded up to a multiple of `bucket` (one program per P).
    features_seq_len: T; when given, also the features in `load_rows`' layout `[R,T,D]`.
  Returns:
    A dict of the arrays above (`features` only with features_seq_len).
  Raises:
    ValueError: an empty sequence, or a prompt length outside [1, len(sequence)].
  """
  lengths = np.asarray([len(s) for s in sequences], np.int64)
  plens = np.asarray(prompt_lengths, np.int64)
  if len(sequences) == 0 or np.any(lengths == 0) or np.any((plens < 1) | (plens > lengths)):
    raise ValueError('every sequence needs a prompt of 1..len(sequence) tokens')
  run = _programs(forward, params, top_k, features_seq_len is not None)
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  ids = np.zeros((offsets[-1], top_k), np.int32)
  logp = np.zeros((offsets[-1], top_k), np.float16)
  feats = None
  order = np.argsort(lengths, kind='stable')
  for i in tqdm(range(0, len(order), batch_size), desc=desc):
    rows = order[i:i + batch_size]
    p = int(-(-lengths[rows].max() // bucket) * bucket)
    tokens = np.zeros((batch_size, p), np.int32)  # the last batch padded with empty rows
    for b, r in enumerate(rows):
      tokens[b, :lengths[r]] = sequences[r]
    out = [np.asarray(a) for a in run(jnp.asarray(tokens))]
    for b, r in enumerate(rows):
      n, lo = lengths[r], offsets[r]
      ids[lo:lo + n], logp[lo:lo + n] = out[0][b, :n], out[1][b, :n]
      if features_seq_len is not None:
        if feats is None:
          feats = np.zeros((len(sequences), features_seq_len, out[2].shape[-1]), np.float16)
        crop = max(0, n - features_seq_len)  # keep the end, as load_rows does
        feats[r, :n - crop] = out[2][b, crop:n]
  result = dict(tokens=np.concatenate(sequences).astype(np.int32), offsets=offsets,
                prompt_lengths=plens.astype(np.int32), teacher_ids=ids, teacher_logp=logp)
  if feats is not None:
    result['features'] = feats
  return result


def features_path(npz_path: str, seq_len: int) -> str:
  """Where `draft_training.eagle_recipe` reads the features cached for a data file."""
  return f'{os.path.splitext(npz_path)[0]}_features_{seq_len}.npy'


def write(path: str, arrays: dict, seq_len: int | None = None, **columns) -> None:
  """Saves a teacher-pass result (and its features, next to it), each file written whole under
  a temporary name first, so that an interrupted run leaves no half-written shard."""
  arrays = dict(arrays)
  feats = arrays.pop('features', None)
  if feats is not None:
    with files.atomic_path(features_path(path, seq_len), suffix='.npy') as tmp:
      np.save(tmp, feats)
  with files.atomic_path(path, suffix='.npz') as tmp:
    np.savez(tmp, **arrays, **columns)


def corpus_cache_dir(teacher_dir: str, corpus_dir: str) -> str:
  """Where `for_corpus` keeps a corpus's teacher files: `teacher_dir/<corpus folder name>`."""
  return os.path.join(teacher_dir, os.path.basename(os.path.normpath(corpus_dir)))


def for_corpus(forward, params, corpus_dir: str, out_dir: str, *, seq_len: int,
               features: bool, top_k: int = 16, batch_size: int = 8, part=None,
               shards: range | None = None) -> list[str]:
  """The teacher pass of every answer shard of a draft corpus (`models.corpus`; `corpus_dir` is
  the corpus, with its shards in `answers/`, or a folder of shards), each written to `out_dir`
  under the shard's name and skipped when already there (with its features when `features`), so
  an interrupted run resumes. With `shards` only the shards numbered in that range are taken
  (a training run over a slice of the corpus); with `part` (`models.draft_corpus.Part`) only
  those it owns are made here (processes side by side). Returns the data files of the shards
  taken, in shard order.

  Raises:
    FileNotFoundError: the corpus has no shards, or none in `shards`.
  """
  answers = os.path.join(corpus_dir, 'answers')
  paths = corpus.shard_paths(answers if os.path.isdir(answers) else corpus_dir)
  if not paths:
    raise FileNotFoundError(f'no corpus shards in {corpus_dir} (scripts/make_draft_corpus.py)')
  taken = [(i, s) for i, s in enumerate(paths) if shards is None or i in shards]
  if not taken:
    raise FileNotFoundError(f'none of the {len(paths)} shards of {corpus_dir} is in shards '
                            f'{shards.start}:{shards.stop if shards.stop != corpus.OPEN_END else ""}')
  outs = []
  for i, shard in taken:
    out = os.path.join(out_dir, os.path.basename(shard))
    outs.append(out)
    if os.path.isfile(out) and (not features or os.path.isfile(features_path(out, seq_len))):
      continue
    if part is not None and not part.owns(i):
      continue
    data = corpus.read_shard(shard)
    tokens, offsets = data['tokens'].astype(np.int32), data['offsets']
    seqs = [tokens[offsets[r]:offsets[r + 1]] for r in range(len(offsets) - 1)]
    result = teacher_pass(forward, params, seqs, data['prompt_lengths'], top_k=top_k,
                          batch_size=batch_size, features_seq_len=seq_len if features else None,
                          desc=f'teacher pass, shard {i + 1}/{len(paths)}')
    columns = {c: data[c] for c in ('sampled', 'prompt_id') if c in data}
    write(out, result, seq_len=seq_len, **columns)
  return outs
