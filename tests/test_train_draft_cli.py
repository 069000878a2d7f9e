"""scripts/train_draft.py refuses contradicting flags before any model loads, naming the flag:
--shards without --corpus, and --init-from with a draft of another kind or config."""

import importlib.util
import os

import numpy as np
import pytest

from models import draft_heads, registry

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts',
                     'train_draft.py')
_spec = importlib.util.spec_from_file_location('train_draft_cli', _PATH)
train_draft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_draft)


@pytest.fixture
def saved_eagle(tmp_path):
  """A saved EAGLE draft (its arrays do not matter to the flag checks): source block 29, W=64."""
  directory = str(tmp_path / 'eagle')
  config = draft_heads.EagleDraftConfig(source_layer=29, draft_vocab_size=64)
  registry.save_draft(directory, 'eagle', config, {'w': np.zeros((2, 2), np.float32)},
                      np.arange(64))
  return directory


@pytest.mark.parametrize('flags, message', [
    (['--shards', '0:4'], '--shards'),
    (['--corpus', '.', '--shards', '4:2'], '--shards'),
    (['--corpus', '.', '--shards', 'x'], '--shards'),
    (['--kind', 'exit', '--init-from', '{eagle}'], 'is a eagle draft, not --kind exit'),
    (['--kind', 'eagle', '--init-from', '{eagle}'], 'draft_vocab_size 64'),
    (['--kind', 'eagle', '--init-from', '{eagle}', '--draft-vocab-size', '64',
      '--source-layers', '28'], 'source_layer 29'),
    (['--kind', 'eagle', '--init-from', '/missing'], '--init-from'),
])
def test_contradicting_flags_rejected(flags, message, saved_eagle, capsys):
  flags = [f.format(eagle=saved_eagle) for f in flags]
  with pytest.raises(SystemExit):
    train_draft._parse(['--data', _PATH] + flags if '--corpus' not in flags else flags)
  assert message in capsys.readouterr().err


def test_matching_init_from_accepted(saved_eagle):
  args = train_draft._parse(['--data', _PATH, '--kind', 'eagle', '--init-from', saved_eagle,
                             '--draft-vocab-size', '64'])
  assert args.init_from == saved_eagle and args.source_layers == [29]
  meta, trainable, vocab_ids = registry.read_trainable(saved_eagle)
  assert meta['kind'] == 'eagle' and vocab_ids.dtype == np.int32 and len(vocab_ids) == 64
  assert trainable['w'].dtype == np.float32
