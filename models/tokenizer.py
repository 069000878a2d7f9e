"""Tokenizers and chat templates from a GGUF file: SmolLM2's byte-level BPE (`gpt2`/`smollm`)
and Gemma's SentencePiece BPE (`llama` model, architecture `gemma*`).

The vocabulary, merges and special tokens come from the GGUF metadata and go to the Hugging Face
`tokenizers` library, so the BPE itself is theirs. The chat template is rendered with jinja2 the
way `transformers` renders it.
"""

import dataclasses
import os
from typing import Any

import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, pre_tokenizers

from models import gguf_file

_TOKEN_TYPE_CONTROL = 3  # llama.cpp's CONTROL: special tokens such as <|im_start|>.

_METADATA_KEYS = (
    'tokenizer.ggml.model',
    'tokenizer.ggml.pre',
    'tokenizer.ggml.tokens',
    'tokenizer.ggml.merges',
    'tokenizer.ggml.token_type',
    'tokenizer.ggml.bos_token_id',
    'tokenizer.ggml.eos_token_id',
    'tokenizer.ggml.padding_token_id',
    'tokenizer.ggml.unknown_token_id',
    'tokenizer.chat_template',
    'general.architecture',
)

_TOKEN_TYPE_USER_DEFINED = 4  # llama.cpp's USER_DEFINED: matched whole, not special.

# Gemma's turn format (the Gemma 3 chat template without its system-prompt and image handling),
# used when a Gemma GGUF carries no `tokenizer.chat_template` (base models).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def read_tokenizer_metadata(gguf_path: str) -> dict[str, Any]:
  """The `tokenizer.*` metadata of a GGUF file as Python values; absent keys are left out.

  Raises FileNotFoundError naming the path when there is no such file, ValueError when it is not
  a GGUF v2/v3 file.
  """
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f'GGUF file not found: {gguf_path!r}')
  return gguf_file.read_metadata(gguf_path, _METADATA_KEYS)


def _raise_exception(message: str):
  raise jinja2.exceptions.TemplateError(message)


def _compile_chat_template(source: str) -> jinja2.Template:
  """Compiles a chat template in a sandbox, with the options `transformers` uses."""
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
  env.globals['raise_exception'] = _raise_exception
  return env.from_string(source)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Tokenizer:
  """A text <-> token-id codec with the model's special ids and chat template.

  Attributes:
    backend: the `tokenizers.Tokenizer` doing the BPE.
    bos_id, eos_id, pad_id: special token ids (SmolLM2: 1, 2, 2; Gemma 3: 2, 1, 0).
    chat_template: the jinja2 source from `tokenizer.chat_template`, or None.
    kind: how `tokens` spell text: 'byte_level' (GPT-2 byte-to-unicode alphabet, `Ġ` = space)
      or 'sentencepiece' (`▁` = space, `<0xNN>` byte-fallback tokens).
    tokens: the token string of each id as the GGUF spells it (`tokenizer.ggml.tokens`).
    special_ids: ids of control tokens (GGUF token type 3), e.g. `<|im_start|>`, `<bos>`.
  """

  backend: tokenizers.Tokenizer
  bos_id: int
  eos_id: int
  pad_id: int
  chat_template: str | None = None
  kind: str = 'byte_level'
  tokens: tuple[str, ...] = ()
  special_ids: frozenset[int] = frozenset()
  _template: jinja2.Template | None = dataclasses.field(default=None, repr=False)

  @property
  def vocab_size(self) -> int:
    """Number of token ids, special tokens included (SmolLM2: 49152)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  @property
  def chat_eos_id(self) -> int:
    """The token that ends an assistant turn of the chat template: Gemma's `<end_of_turn>` where
    the vocabulary has it (its `eos_id` ends a document, not a turn), else `eos_id`."""
    if self.kind == 'sentencepiece' and '<end_of_turn>' in self.tokens:
      return self.tokens.index('<end_of_turn>')
    return self.eos_id

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; no BOS/EOS added. Special-token strings in `text` map to their ids."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    """The text of `ids` (any int sequence or 1-D array); special tokens kept unless skipped."""
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Renders `messages` (dicts with `role` and `content`) with the model's chat template."""
    if self._template is None:
      raise ValueError('this tokenizer has no chat template')
    return self._template.render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=self.backend.id_to_token(self.bos_id),
        eos_token=self.backend.id_to_token(self.eos_id))

  def encode_chat(self, prompt: str) -> list[int]:
    """Token ids of a one-message user chat, ending with the assistant's generation prompt."""
    return self.encode(self.apply_chat_template([{'role': 'user', 'content': prompt}]))


def load_tokenizer(gguf_path: str) -> Tokenizer:
  """Builds the tokenizer described by the GGUF file at `gguf_path`.

  Gemma files (`tokenizer.ggml.model` 'llama', architecture gemma/gemma2/gemma3): see
  `_gemma_tokenizer`. Otherwise byte-level BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`; tokens of type 3
  (control) become special tokens that are matched whole and never split. The pre-tokenizer is
  the `smollm` one: every digit on its own, then the GPT-2 regex, then the byte-level alphabet.
  Raises ValueError for any other kind of vocabulary or pre-tokenizer, FileNotFoundError for a
  missing file.
  """
  meta = read_tokenizer_metadata(gguf_path)
  kind = (meta.get('tokenizer.ggml.model'), meta.get('tokenizer.ggml.pre'))
  if kind[0] == 'llama' and meta.get('general.architecture') in ('gemma', 'gemma2', 'gemma3'):
    return _gemma_tokenizer(meta)
  if kind != ('gpt2', 'smollm'):
    raise ValueError(f'{gguf_path!r}: only the byte-level BPE with the smollm pre-tokenizer '
                     f'and Gemma\'s SentencePiece are supported, got tokenizer.ggml.model/pre = '
                     f'{kind}')
  tokens = meta['tokenizer.ggml.tokens']
  merges = [tuple(m.split(' ', 1)) for m in meta['tokenizer.ggml.merges']]
  bpe = tokenizers.models.BPE(
      vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges, fuse_unk=False)
  backend = tokenizers.Tokenizer(bpe)
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
  ])
  backend.decoder = decoders.ByteLevel()
  token_types = meta.get('tokenizer.ggml.token_type', [])
  backend.add_special_tokens([
      tokenizers.AddedToken(tok, special=True, normalized=False)
      for tok, token_type in zip(tokens, token_types)
      if token_type == _TOKEN_TYPE_CONTROL
  ])
  source = meta.get('tokenizer.chat_template')
  eos_id = int(meta['tokenizer.ggml.eos_token_id'])
  return Tokenizer(
      backend=backend,
      bos_id=int(meta['tokenizer.ggml.bos_token_id']),
      eos_id=eos_id,
      pad_id=int(meta.get('tokenizer.ggml.padding_token_id', eos_id)),
      chat_template=source,
      _template=_compile_chat_template(source) if source else None,
      kind='byte_level', tokens=tuple(tokens),
      special_ids=frozenset(i for i, t in enumerate(token_types) if t == _TOKEN_TYPE_CONTROL))


def _sentencepiece_merges(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
  """BPE merges implied by a vocabulary ordered best-first: every split of a token into two
  vocabulary tokens is a merge, ranked by the token's position, then longer left and right parts
  first. This is how `transformers` rebuilds Gemma's merges from a GGUF that stores none
  (`integrations/gguf/gguf_tokenizer_mapping.py`, `gemma_tokenizer` and `generate_merges`);
  Gemma's scores do not follow its merge order, the file order does."""
  ranked = []
  for rank, token in enumerate(tokens):
    for cut in range(1, len(token)):
      left, right = token[:cut], token[cut:]
      if left in vocab and right in vocab:
        ranked.append((rank, -len(left), -len(right), left, right))
  ranked.sort(key=lambda m: m[:3])
  return [(left, right) for _, _, _, left, right in ranked]


def _gemma_tokenizer(meta: dict[str, Any]) -> Tokenizer:
  """Gemma's SentencePiece BPE rebuilt in `tokenizers` as `transformers` does for a GGUF
  (`GemmaTokenizer`): spaces normalized to `▁` with no prefix space and no pre-split, BPE with
  byte fallback (`<0xNN>` tokens) and `<unk>`, decoding `▁` back to spaces. Tokens made only of
  spaces are spelled with real spaces in the GGUF and respelled as `▁`s for the BPE. Control
  tokens (type 3) are special, user-defined ones (type 4, e.g. runs of newlines) are matched
  whole. The chat template defaults to `GEMMA_CHAT_TEMPLATE`."""
  tokens = list(meta['tokenizer.ggml.tokens'])
  spelled = ['\u2581' * len(t) if ' ' in t and not t.strip() else t for t in tokens]
  vocab = {t: i for i, t in enumerate(spelled)}
  unk = tokens[int(meta.get('tokenizer.ggml.unknown_token_id', 3))]
  bpe = tokenizers.models.BPE(vocab=vocab, merges=_sentencepiece_merges(spelled, vocab),
                              fuse_unk=True, unk_token=unk, byte_fallback=True)
  backend = tokenizers.Tokenizer(bpe)
  backend.normalizer = tokenizers.normalizers.Replace(' ', '\u2581')
  backend.pre_tokenizer = pre_tokenizers.Split(' ', behavior='merged_with_previous')
  backend.decoder = decoders.Sequence(
      [decoders.Replace('\u2581', ' '), decoders.ByteFallback(), decoders.Fuse()])
  token_types = list(meta.get('tokenizer.ggml.token_type', []))
  backend.add_special_tokens([
      tokenizers.AddedToken(t, special=True, normalized=False)
      for t, kind in zip(tokens, token_types) if kind == _TOKEN_TYPE_CONTROL])
  backend.add_tokens([
      tokenizers.AddedToken(t, special=False, normalized=False)
      for t, kind in zip(tokens, token_types) if kind == _TOKEN_TYPE_USER_DEFINED and t in vocab])
  source = meta.get('tokenizer.chat_template') or GEMMA_CHAT_TEMPLATE
  eos_id = int(meta['tokenizer.ggml.eos_token_id'])
  return Tokenizer(
      backend=backend, bos_id=int(meta['tokenizer.ggml.bos_token_id']), eos_id=eos_id,
      pad_id=int(meta.get('tokenizer.ggml.padding_token_id', eos_id)), chat_template=source,
      _template=_compile_chat_template(source), kind='sentencepiece', tokens=tuple(tokens),
      special_ids=frozenset(i for i, t in enumerate(token_types) if t == _TOKEN_TYPE_CONTROL))
