"""`models.gguf_file` reads the same metadata and tensor bytes as `gguf.GGUFReader`."""

import gguf
import numpy as np
import pytest

from models import gguf_file, gguf_loader


def test_same_as_gguf_reader():
  try:
    path = gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  ours, theirs = gguf_file.read_gguf(path), gguf.GGUFReader(path)
  fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith('GGUF.')}
  assert ours.metadata == fields
  assert gguf_file.read_metadata(path, ['tokenizer.ggml.bos_token_id', 'nope']) == {
      'tokenizer.ggml.bos_token_id': 1}
  assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
  for a, b in zip(ours.tensors, theirs.tensors):
    assert (a.tensor_type, a.data.shape, a.data.dtype) == (b.tensor_type, b.data.shape,
                                                           b.data.dtype), a.name
    np.testing.assert_array_equal(a.data, b.data)


def test_truncated_file(tmp_path):
  try:
    path = gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')
  with open(path, 'rb') as f:
    head = f.read(8 << 20)
  cut = tmp_path / 'cut.gguf'
  cut.write_bytes(head)
  with pytest.raises(ValueError, match='past the end of the file'):
    gguf_file.read_gguf(str(cut))
