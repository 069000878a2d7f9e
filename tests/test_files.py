"""`models.files.atomic_path`: the file appears whole or not at all."""

import os

import numpy as np
import pytest

from models import files


def test_written_whole_and_readable(tmp_path):
  path = str(tmp_path / 'sub' / 'a.npz')
  with files.atomic_path(path, suffix='.npz') as tmp:
    assert tmp.endswith('.npz') and os.path.dirname(tmp) == os.path.dirname(path)
    np.savez(tmp, x=np.arange(3))
    assert not os.path.exists(path)  # not there until the block ends
  np.testing.assert_array_equal(np.load(path)['x'], np.arange(3))
  assert os.stat(path).st_mode & 0o777 == 0o644
  assert os.listdir(os.path.dirname(path)) == ['a.npz']  # no temp file left


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
  path = str(tmp_path / 'm.json')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('old')
  with pytest.raises(RuntimeError):
    with files.atomic_path(path) as tmp, open(tmp, 'w', encoding='utf-8') as f:
      f.write('half')
      raise RuntimeError('stopped')
  assert open(path, encoding='utf-8').read() == 'old'
  assert os.listdir(tmp_path) == ['m.json']


def test_two_writers_get_their_own_temp_file(tmp_path):
  path = str(tmp_path / 'm.json')
  with files.atomic_path(path) as a, files.atomic_path(path) as b:
    assert a != b
