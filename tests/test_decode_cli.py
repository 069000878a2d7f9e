"""scripts/decode.py rejects bad flags before any model loads, naming the flag, and reads per-line
seeds from a prompts file."""

import importlib.util
import json
import os

import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts',
                     'decode.py')
_spec = importlib.util.spec_from_file_location('decode_cli', _PATH)
decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode)


@pytest.mark.parametrize('flags, flag', [
    (['--max-new-tokens', '0'], '--max-new-tokens'), (['--num-draft-tokens', '0'],
                                                       '--num-draft-tokens'),
    (['--draft', '/missing'], '--draft'), (['--draft', 'ngram:0'], '--draft'),
    (['--draft', 'early-exit:x'], '--draft'), (['--dtype', 'nonsense'], '--dtype'),
    (['--verifier', 'bogus'], '--verifier'), (['--verifier', 'mixture:2'], '--verifier'),
    (['--num-draft-tokens', 'sometimes'], '--num-draft-tokens'),
    (['--max-draft-tokens', '0'], '--max-draft-tokens'),
    (['--min-draft-confidence', '1.5'], '--min-draft-confidence'),
    (['--mesh', 'foo=1'], '--mesh'), (['--mesh', 'data=x'], '--mesh'),
])
def test_bad_flags_rejected_before_loading(flags, flag, capsys):
  with pytest.raises(SystemExit):
    decode.parse_args(['--prompt', 'hi'] + flags)
  assert flag in capsys.readouterr().err


def test_draft_directory_that_is_no_checkpoint_rejected_before_loading(tmp_path, capsys):
  """A --draft path that exists but holds neither a trained draft nor a checkpoint is refused
  by the parser (it used to be found out after the target had loaded)."""
  (tmp_path / 'notes.txt').write_text('not a model')
  with pytest.raises(SystemExit):
    decode.parse_args(['--prompt', 'hi', '--draft', str(tmp_path)])
  err = capsys.readouterr().err
  assert '--draft' in err and 'draft.json' in err and 'config.json' in err


def test_early_exit_past_the_layer_count_rejected_before_loading(monkeypatch):
  """The layer bound of early-exit:N comes from the checkpoint's metadata, before any weights."""
  from models import gguf_loader, loading  # pylint: disable=g-import-not-at-top
  try:
    gguf_loader.default_model_path()
  except FileNotFoundError as e:
    pytest.skip(f'SmolLM2 GGUF unavailable: {e}')

  def no_loading(*args, **kwargs):
    raise AssertionError('the model was loaded before the flag was checked')

  monkeypatch.setattr(loading, 'load_model', no_loading)
  for n in (30, 999):
    with pytest.raises(ValueError, match=f'--draft: early-exit:{n} needs 1 <= N < 30'):
      decode.main(['--prompt', 'hi', '--draft', f'early-exit:{n}'])
  assert loading.num_layers(None) == 30


def test_prompts_file_seeds(tmp_path):
  path = tmp_path / 'prompts.jsonl'
  path.write_text('\n'.join([json.dumps({'prompt': 'a', 'seed': 5}), json.dumps({'prompt': 'b'}),
                             'plain line']) + '\n', encoding='utf-8')
  args = decode.parse_args(['--prompt', 'first', '--prompts-file', str(path), '--seed', '9'])
  assert decode.read_prompts(args) == (['first', 'a', 'b', 'plain line'], [9, 5, 9, 9])
  assert decode.parse_args(['--verifier', 'mixture:0.5']).verifier.lossy
  assert decode.parse_args(['--num-draft-tokens', 'auto']).num_draft_tokens == 'auto'
  assert decode.parse_args(['--num-draft-tokens', 'heuristic']).num_draft_tokens == 'heuristic'


def _report(**kw):
  return {'results': [], 'draft': 'ngram', 'num_draft_tokens': 'auto', 'temperature': 0.0,
          'verifier': 'exact', 'lossy': False, 'finish_reasons': ['eos'],
          'acceptance_rate': 0.0, 'drafted_tokens': 0, 'position_acceptance': [None],
          'rounds_by_k': [8, 0], 'mean_accepted_length': 1.0, 'target_forward_passes': 8,
          'new_tokens': 8, 'tokens_per_second': 10.0, 'compile_seconds': 1.0, **kw}


def test_report_says_nothing_drafted_rather_than_a_zero_rate(capsys):
  """An `auto` run that drafted nothing has no acceptance rate: the report says so instead of
  printing 0.000, which reads as every drafted token rejected."""
  decode.print_report(_report(), streamed=True)
  line = next(l for l in capsys.readouterr().out.splitlines() if 'acceptance rate' in l)
  assert 'nothing drafted' in line and '0.000' not in line
  decode.print_report(_report(drafted_tokens=6), streamed=True)
  line = next(l for l in capsys.readouterr().out.splitlines() if 'acceptance rate' in l)
  assert '0.000' in line
