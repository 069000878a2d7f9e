"""Byte-level BPE tokenizer and chat template from a GGUF file (SmolLM2's `smollm` vocabulary).

The vocabulary, merges and special tokens come from the GGUF metadata and go to the Hugging Face
`tokenizers` library, so the BPE itself is theirs. The chat template is rendered with jinja2 the
way `transformers` renders it.
"""

import dataclasses
import os
from typing import Any

import gguf
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, pre_tokenizers

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
    'tokenizer.chat_template',
)


def read_tokenizer_metadata(gguf_path: str) -> dict[str, Any]:
  """The `tokenizer.*` metadata of a GGUF file as Python values; absent keys are left out.

  Raises FileNotFoundError naming the path when there is no such file.
  """
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f'GGUF file not found: {gguf_path!r}')
  fields = gguf.GGUFReader(gguf_path).fields
  return {key: fields[key].contents() for key in _METADATA_KEYS if key in fields}


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
    bos_id, eos_id, pad_id: special token ids (SmolLM2: 1, 2, 2).
    chat_template: the jinja2 source from `tokenizer.chat_template`, or None.
  """

  backend: tokenizers.Tokenizer
  bos_id: int
  eos_id: int
  pad_id: int
  chat_template: str | None = None
  _template: jinja2.Template | None = dataclasses.field(default=None, repr=False)

  @property
  def vocab_size(self) -> int:
    """Number of token ids, special tokens included (SmolLM2: 49152)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

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

  Byte-level BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`; tokens of type 3
  (control) become special tokens that are matched whole and never split. The pre-tokenizer is
  the `smollm` one: every digit on its own, then the GPT-2 regex, then the byte-level alphabet.
  Raises ValueError for any other kind of vocabulary or pre-tokenizer, FileNotFoundError for a
  missing file.
  """
  meta = read_tokenizer_metadata(gguf_path)
  kind = (meta.get('tokenizer.ggml.model'), meta.get('tokenizer.ggml.pre'))
  if kind != ('gpt2', 'smollm'):
    raise ValueError(f'{gguf_path!r}: only the byte-level BPE with the smollm pre-tokenizer '
                     f'is supported, got tokenizer.ggml.model/pre = {kind}')
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
      _template=_compile_chat_template(source) if source else None)
