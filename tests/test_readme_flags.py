"""The README's commands and flags match the scripts' own `--help` (issue 14): every `--flag`
written after `scripts/NAME.py` in a README command, in a row of the scripts table naming
NAME.py, or in decode.py's flag table is one that NAME.py's parser knows; and the scripts the
README says take `--dtype` are exactly those that do."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
FLAG = re.compile(r'(?<![\w-])--[a-z][a-z0-9-]*')
SCRIPT = re.compile(r'\b(\w+\.py)\b')

# One process (one jax import) prints every script's --help as JSON.
_HELP_ALL = r'''
import contextlib, io, json, os, runpy, sys
out = {}
for name in sorted(os.listdir('scripts')):
  if not name.endswith('.py'):
    continue
  buf, sys.argv = io.StringIO(), [name, '--help']
  with contextlib.redirect_stdout(buf):
    try:
      runpy.run_path(os.path.join('scripts', name), run_name='__main__')
    except SystemExit:
      pass
  out[name] = buf.getvalue()
sys.stdout.write(json.dumps(out))
'''


@pytest.fixture(scope='module')
def helps():
  proc = subprocess.run([sys.executable, '-c', _HELP_ALL], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=True,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  return {name: set(FLAG.findall(text)) for name, text in json.loads(proc.stdout).items()}


def _commands():
  """(script, flags) for every command line of the README's code blocks: continuation lines
  joined, shell comments dropped, split at `&&`, `;` and `|`."""
  text = README.replace('\\\n', ' ')
  blocks = [body for lang, body in re.findall(r'```(\w*)\n(.*?)```', text, re.S)
            if lang in ('', 'bash')]
  blocks += re.findall(r'\n\n((?:    .*\n)+)', text)  # indented blocks
  out = []
  for block in blocks:
    for line in block.splitlines():
      line = re.sub(r'\s#\s.*$', '', line)
      for part in re.split(r'&&|;|\|', line):
        m = re.search(r'scripts/(\w+\.py)(.*)', part)
        if m:
          out.append((m.group(1), set(FLAG.findall(m.group(2)))))
  return out


def _table_rows():
  """(scripts named, flags) for each row of the scripts table, and decode.py's flag table."""
  out = []
  for line in README.splitlines():
    cells = re.split(r'(?<!\\)\|', line)  # `\|` inside a cell is not a column
    if line.startswith('| `') and '.py' in cells[1]:
      out.append((set(SCRIPT.findall(cells[1])), set(FLAG.findall(line))))
  flag_table = README.split('| flag | meaning |', 1)[1].split('\n\n', 1)[0]
  for line in flag_table.splitlines()[2:]:
    out.append(({'decode.py'}, set(FLAG.findall(re.split(r'(?<!\\)\|', line)[1]))))
  return out


def test_readme_commands_use_known_flags(helps):
  commands = _commands()
  assert len(commands) >= 15  # the parsing found the README's commands
  for script, flags in commands:
    assert script in helps, f'README runs scripts/{script}, which does not exist'
    assert not flags - helps[script], f'scripts/{script}: README uses {flags - helps[script]}'


def test_readme_tables_name_known_flags(helps):
  rows = _table_rows()
  assert len(rows) >= 20
  for scripts, flags in rows:
    known = set().union(*(helps.get(s, set()) for s in scripts))
    assert scripts <= set(helps), f'README names {scripts - set(helps)}'
    assert not flags - known - {'--help'}, f'{sorted(scripts)}: {flags - known}'


def test_dtype_flag_where_the_readme_says(helps):
  said = re.search(r'`--dtype` \(on\s(.*?);\sthe other scripts', README, re.S).group(1)
  assert set(SCRIPT.findall(said)) == {s for s, f in helps.items() if '--dtype' in f}


def test_every_script_has_help(helps):
  assert all(flags for flags in helps.values()), [s for s, f in helps.items() if not f]
