"""How often a draft's tokens are accepted, on the evaluation prompts and on prompts it trained on.

Acceptance is measured by decoding, as a user runs the draft: every prompt of a set in one batch
(ragged acceptance, `jaxspec.generate`), the target's chat template applied, at each K and
temperature asked for. Per prompt set it reports the acceptance rate (accepted / drafted) and
the per-position (conditional) acceptance: of the rounds whose drafted token i was examined,
the share accepted (`jaxspec.summarize`). A trained draft's `draft.json` records the corpus
prompts it trained on (`train_prompt_ids`, `scripts/train_draft.py --corpus`); a sample of them
is the "train" set, so that the train/held-out gap is measured the same way.

Shapes: B prompts a batch, K drafted tokens a round.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

import jaxspec as js
from models import loading, prompts as prompt_files


def draft_info(path: str) -> dict:
  """The `info` a trained draft was saved with (`draft.json`), or {} (n-gram, early exit)."""
  meta = os.path.join(path, 'draft.json')
  if not os.path.isfile(meta):
    return {}
  with open(meta, encoding='utf-8') as f:
    return json.load(f).get('info', {})


def train_prompts(info: dict, num: int) -> list[dict]:
  """The first `num` corpus prompts a draft trained on (rows of `prompts.jsonl.gz`), or [] when
  its info records none. Raises FileNotFoundError when the recorded corpus is missing."""
  ids, corpora = info.get('train_prompt_ids'), info.get('corpus')
  if not ids or not corpora:
    return []
  from models import draft_corpus  # pylint: disable=g-import-not-at-top
  rows = {r['id']: r for r in draft_corpus.read_prompts(corpora[0])}
  return [rows[i] for i in ids[:num]]


def measure(params, config, tok, draft, draft_params, sets: dict[str, list[str]], *,
            num_draft_tokens: int, temperature: float, max_new_tokens: int, seed: int = 0,
            bucket: int = 64) -> dict[str, dict]:
  """Decodes every prompt of `sets` ({name: texts}; chat template applied) in one batch with the
  draft (and its params, as `loading.load_draft` gives them) at K = `num_draft_tokens`, row r
  seeded `seed + r`.

  Returns:
    {name: `jaxspec.summarize` of that set's rows (acceptance_rate, position_acceptance [K],
    mean_accepted_length, ...)}, and under 'dev' the sets named 'dev ...' together.
  Raises:
    FloatingPointError: the decode met non-finite logits (reported, not turned into tokens).
  """
  names = [n for n, texts in sets.items() for _ in texts]
  ids = [tok.encode_chat(p) for texts in sets.values() for p in texts]
  tokens, lengths = js.pad_prompts(ids, pad_id=tok.pad_id, bucket=bucket)
  keys = js.row_keys(np.arange(len(ids)) + seed)
  dc = js.DecodeConfig(num_draft_tokens=num_draft_tokens, max_new_tokens=max_new_tokens,
                       sampling=js.SamplingConfig(temperature=temperature),
                       eos_id=tok.chat_eos_id, pad_id=tok.pad_id,
                       context_length=config.context_length)
  out = js.generate(params, draft_params, tokens, lengths, keys,
                    target=loading.forward_for(config), draft=draft, config=dc)
  if 'nonfinite' in out.finish_reasons():
    raise FloatingPointError('non-finite logits while decoding')
  metrics = jax.tree.map(np.asarray, out.metrics)
  rows = lambda name: np.array([i for i, n in enumerate(names) if n == name])
  result = {name: js.summarize(jax.tree.map(lambda a, r=rows(name): a[r], metrics))
            for name in sets}
  dev = np.array([i for i, n in enumerate(names) if n.startswith('dev ')])
  if len(dev):
    result['dev'] = js.summarize(jax.tree.map(lambda a: a[dev], metrics))
  return result


def prompt_sets(kinds: list[str], num_dev: int, info: dict, num_train: int) -> dict:
  """{set name: prompt texts}: each evaluation kind of `data/dev_prompts.jsonl` (its first
  `num_dev`, 0 = all), and 'train' (`train_prompts`) when the draft records its prompts."""
  dev = prompt_files.read_rows(prompt_files.DEV_PROMPTS)
  sets = {f'dev {k}': [r['prompt'] for r in prompt_files.select(dev, [k], num_dev)]
          for k in kinds}
  train = train_prompts(info, num_train)
  if train:
    sets['train'] = [r['prompt'] for r in train]
  return sets


def _fmt(x) -> str:
  return '' if x is None else f'{x:.3f}'


def table(results: list[dict]) -> str:
  """Markdown: a row per (draft, temperature, K, prompt set); the draft's training size (its
  answer tokens counted over the runs it continues, `train_draft.py --init-from`)."""
  k_max = max(r['num_draft_tokens'] for r in results)
  head = ['draft', 'train prompts', 'train answer tokens', 'T', 'K', 'prompts', 'rows',
          'acceptance', 'tokens / pass'] + [f'pos {i + 1}' for i in range(k_max)]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in results:
    pos = r['position_acceptance'] + [None] * (k_max - len(r['position_acceptance']))
    cells = [r['draft'], r.get('train_prompts', ''), r.get('train_answer_tokens', ''),
             f"{r['temperature']:g}", r['num_draft_tokens'], r['set'], r['rows'],
             _fmt(r['acceptance_rate']), _fmt(r['mean_accepted_length'])] + [_fmt(p) for p in pos]
    lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
  return '\n'.join(lines) + '\n'


def plot_curve(results: list[dict], path: str) -> bool:
  """Acceptance at K=1, T=0 against training answer tokens, held-out ('dev') and 'train'
  curves, for the drafts whose size is known. Returns False (nothing written) without
  matplotlib or with fewer than two such drafts."""
  points = [r for r in results if r['num_draft_tokens'] == 1 and r['temperature'] == 0
            and r.get('train_answer_tokens') and r['set'] in ('dev', 'train')]
  if len({r['draft'] for r in points}) < 2:
    return False
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, label in (('dev', 'held-out (dev chat + grounded)'), ('train', 'training prompts')):
    pts = sorted((r['train_answer_tokens'], r['acceptance_rate']) for r in points
                 if r['set'] == name)
    if pts:
      ax.plot(*zip(*pts), marker='o', label=label)
  ax.set_xscale('log')
  ax.set_xlabel('training answer tokens')
  ax.set_ylabel('acceptance rate, K=1, T=0')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True
