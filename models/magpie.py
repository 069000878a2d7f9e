"""Chat prompts written by the target itself: Magpie (Xu et al. 2024, "Magpie: Alignment Data
Synthesis from Scratch by Prompting Aligned LLMs with Nothing", arXiv 2406.08464).

An instruction-tuned model fed its chat template up to the start of a user turn (for SmolLM2's
ChatML: the system turn, then `<|im_start|>user\\n`) writes a plausible user message and ends
it with the turn's end token (`<|im_end|>`, SmolLM2's EOS). `user_turn_prefix` builds that
prefix from the tokenizer's own chat template, so it is token for token the start of what
`Tokenizer.encode_chat` produces for a user message. Diversity comes from the row seeds, a grid
of temperatures and top-p values (`SETTINGS`, one per shard, in turn) and a set of system
prompts (`SYSTEM_PROMPTS`, one per row, in turn; None is the template's default system turn,
the one `encode_chat` uses). Generation stops at `Tokenizer.chat_eos_id`. Only the user
message is kept: the answers are then written for it under the default system turn, as
evaluation prompts are.

`message` turns a sampled row into text or None: a row cut by the token budget, or holding a
special token, is dropped, as is one that reads like an assistant's reply (`_REPLY_OPENINGS`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SYSTEM_PROMPTS = (
    None,
    'You are a helpful assistant.',
    'You are a patient tutor who explains science and mathematics to students.',
    'You are an expert programmer who helps users write, explain and debug code.',
    'You are a creative writing assistant who helps with stories, poems and scripts.',
    'You are a friendly assistant for cooking, recipes and nutrition.',
    'You are a travel planning assistant.',
    'You help people write emails, letters, reports and other professional documents.',
    'You are a knowledgeable teacher of history, geography and culture.',
    'You are a personal coach for fitness, health and everyday habits.',
    'You are an assistant for questions about money, budgeting and small businesses.',
    'You answer questions about computers, Linux and the command line.',
    'You are good at puzzles, logic and math word problems, and explain your reasoning.',
)


@dataclasses.dataclass(frozen=True)
class Setting:
  """A shard's sampling: temperature and nucleus top-p."""

  temperature: float
  top_p: float


# 0.6 to 1.1: SmolLM2-135M at temperature 1.3, top-p 0.9 wrote mostly nonsense (8 of 32 rows
# passed the filters, and read badly); at 1.0/0.9 and 1.1/0.8, 25 and 22 of 32 passed.
SETTINGS = (Setting(0.6, 1.0), Setting(0.7, 0.95), Setting(0.8, 0.95), Setting(0.9, 0.9),
            Setting(1.0, 0.9), Setting(1.1, 0.8))

_SENTINEL = '\x00MAGPIE\x00'

_REPLY_OPENINGS = ('sure', 'certainly', 'of course', 'absolutely', "i'd be happy",
                   'i would be happy', "i'm happy to", 'as an ai', 'hello! how can i',
                   'hi! how can i', 'how can i help', 'how can i assist')


def user_turn_prefix(tok, system: str | None = None) -> list[int]:
  """Token ids of the chat template up to where a user message begins, with `system` as the
  system turn (None: the template's default). Raises ValueError when the template does not
  render a user message after a fixed prefix, or when the prefix's tokens are not the start of
  a full rendering's tokens (the cut would then fall inside a token)."""
  messages = [{'role': 'user', 'content': _SENTINEL}]
  if system is not None:
    messages.insert(0, {'role': 'system', 'content': system})
  text = tok.apply_chat_template(messages)
  if text.count(_SENTINEL) != 1:
    raise ValueError('the chat template does not render the user message once')
  prefix = tok.encode(text[:text.index(_SENTINEL)])
  probe = tok.encode(text.replace(_SENTINEL, 'Hello, how are you?'))
  if probe[:len(prefix)] != prefix:
    raise ValueError('the user-turn prefix does not tokenize as the start of a full chat')
  return prefix


def shard_plan(shard: int, shard_size: int, seed: int) -> dict[str, np.ndarray]:
  """What shard `shard` samples: per row `seed` (int64, < 2**31, drawn from (seed, shard)),
  `system` (index into `SYSTEM_PROMPTS`, in turn over global row numbers), and the shard's
  `temperature` and `top_p` (float32, repeated per row; `SETTINGS` in turn over shards)."""
  rows = shard * shard_size + np.arange(shard_size)
  setting = SETTINGS[shard % len(SETTINGS)]
  return {'seed': np.random.default_rng([seed, 1, shard]).integers(0, 2**31, shard_size),
          'system': (rows % len(SYSTEM_PROMPTS)).astype(np.int16),
          'temperature': np.full(shard_size, setting.temperature, np.float32),
          'top_p': np.full(shard_size, setting.top_p, np.float32)}


def message(tok, new_ids, finished_by_eos: bool) -> str | None:
  """The user message of a sampled row (its new tokens, ending with the turn's end token
  `tok.chat_eos_id` when it ended by it), or None when it was cut by the budget, holds a
  special token, is empty, or opens like an assistant's reply."""
  ids = [int(i) for i in new_ids]
  if not finished_by_eos or not ids or ids[-1] != tok.chat_eos_id:
    return None
  ids = ids[:-1]
  if any(i in tok.special_ids for i in ids):
    return None
  text = tok.decode(ids).strip()
  if not text or text.lower().startswith(_REPLY_OPENINGS):
    return None
  return text
