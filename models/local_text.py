"""Real English text that ships on the machine, as documents of plain-text sections.

Nothing is downloaded: every source reads files that the operating system or the installed
Python packages put there, and a source whose files are missing yields nothing. Sources
(`SOURCES`, name -> reader):

- `licenses`: `/usr/share/common-licenses/*` and the licence files of installed packages;
- `package-descriptions`: the long description (PyPI page) in each installed distribution's
  METADATA;
- `python-docstrings`: docstrings of the standard library's modules, classes and functions,
  read with `ast` (no module is imported);
- `man-pages`: English manual pages, `/usr/share/man/man[1-8]`, troff stripped by
  `troff_to_text`;
- `docs`: README / `.txt` / `.md` / `.rst` files under `/usr/share/doc` and CMake's help
  (`/usr/share/cmake-*/Help`).

Each reader takes a `numpy.random.Generator` and yields `Document`s in an order shuffled by it
(file lists sorted first, so the order depends only on the seed and the files present). Markup
(troff, Markdown, reStructuredText) is stripped by heuristics; what survives badly is left to
the passage filters (`models.grounded`).
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import gzip
import importlib.metadata
import os
import re
import sys
import sysconfig
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class Document:
  """One file's text: `source` (a `SOURCES` name), `name` (file path or distribution) and
  `sections`, plain-text blocks that passages never straddle (paragraphs split by blank lines)."""

  source: str
  name: str
  sections: tuple[str, ...]


def _read(path: str) -> str:
  opener = gzip.open if path.endswith('.gz') else open
  try:
    with opener(path, 'rt', encoding='utf-8', errors='replace') as f:
      return f.read(2_000_000)
  except (OSError, EOFError):
    return ''


def _shuffled(paths, rng) -> list[str]:
  paths = sorted(set(paths))
  return [paths[i] for i in rng.permutation(len(paths))]


_TROFF_ESCAPES = [
    (re.compile(r'\\f(\(..|\[[^]]*\]|.)'), ''),    # font changes
    (re.compile(r'\\s[-+]?\d+'), ''),               # size changes
    (re.compile(r'\\\*(\(..|\[[^]]*\]|.)'), ''),   # strings
    (re.compile(r'\\\((em|en|hy)'), '-'),
    (re.compile(r'\\\((lq|rq|dq)'), '"'),
    (re.compile(r'\\\((oq|cq|aq)'), "'"),
    (re.compile(r'\\(\(..|\[[^]]*\])'), ''),        # other named characters
    (re.compile(r'\\[-e]'), lambda m: '-' if m.group() == '\\-' else '\\'),
    (re.compile(r'\\[&|^,/%:c]'), ''),
    (re.compile(r'\\ '), ' '),
]
_PARAGRAPH_MACROS = {'PP', 'LP', 'P', 'TP', 'IP', 'SH', 'SS', 'HP', 'sp', 'br', 'RS', 'RE', 'nf',
                     'fi', 'EX', 'EE', 'TQ'}
_TEXT_MACROS = {'B', 'I', 'BR', 'RB', 'IR', 'RI', 'BI', 'IB', 'SM', 'SB'}


def troff_to_text(source: str) -> str:
  """Plain text of a manual page (man macros): paragraph macros become blank lines, font macros
  keep their words, other requests and comments go, inline escapes are dropped or spelled."""
  out = []
  for line in source.splitlines():
    if line.startswith(('.', "'")):
      parts = line[1:].strip().split(None, 1)
      name = parts[0] if parts else ''
      if name in _TEXT_MACROS and len(parts) > 1:
        line = ' '.join(a.strip('"') for a in parts[1].split())
      else:
        if name in _PARAGRAPH_MACROS:
          out.append('')
        continue
    for pattern, repl in _TROFF_ESCAPES:
      line = pattern.sub(repl, line)
    out.append(line)
  return '\n'.join(out)


_MARKUP_LINE = re.compile(r'^\s*([=\-~^*#+`_]{3,}|\.\. |\|.*\||\+[-=+]+\+|<[^>]+>$|!\[|\[!\[)')
_INLINE = [
    (re.compile(r'!?\[([^\]]*)\]\([^)]*\)'), r'\1'),   # Markdown links and images
    (re.compile(r'`([^`]*)`_?'), r'\1'),                  # inline code, rst links
    (re.compile(r'\*\*|__|(?<!\w)[*_](?=\w)|(?<=\w)[*_](?!\w)'), ''),
    (re.compile(r'<[^>]+>'), ''),                         # HTML tags
    (re.compile(r':[a-z_]+:(?=\S)'), ''),                # rst roles (:class:)
    (re.compile(r'^#+\s*'), ''),                          # Markdown headings
]


CUT = '\f'  # where markup_to_text removed a block: passages do not straddle it


def markup_to_text(source: str) -> str:
  """Prose of a Markdown or reStructuredText file: fenced and indented code blocks, tables,
  directives and underlines replaced by a `CUT` line each, links, roles and emphasis reduced to
  their words."""
  out, fenced = [], False
  for line in source.splitlines():
    if line.lstrip().startswith(('```', '~~~')):
      fenced = not fenced
      out.append(CUT)
      continue
    if fenced or line.startswith(('    ', '\t', '>>>')) or _MARKUP_LINE.match(line):
      out.append(CUT)
      continue
    for pattern, repl in _INLINE:
      line = pattern.sub(repl, line)
    out.append(line)
  return '\n'.join(out)


def licenses(rng) -> Iterator[Document]:
  """Common licences and the licence files of installed Python distributions."""
  paths = [p for p in glob.glob('/usr/share/common-licenses/*') if os.path.isfile(p)]
  for root in _site_dirs():
    paths += glob.glob(os.path.join(root, '*.dist-info', 'LICENSE*'))
    paths += glob.glob(os.path.join(root, '*.dist-info', 'licenses', '**', '*'), recursive=True)
  for path in _shuffled((p for p in paths if os.path.isfile(p)), rng):
    yield Document('licenses', _shown(path), (_read(path),))


def _shown(path: str) -> str:
  """A file's name as recorded: under a site-packages directory, from `site-packages/` on."""
  for root in _site_dirs():
    if path.startswith(root + os.sep):
      return os.path.join('site-packages', os.path.relpath(path, root))
  return path


def _site_dirs() -> list[str]:
  dirs = [sysconfig.get_paths()['purelib'],
          sysconfig.get_paths(vars={'base': sys.base_prefix})['purelib']]
  return sorted({d for d in dirs if os.path.isdir(d)})


def package_descriptions(rng) -> Iterator[Document]:
  """The long description of every installed distribution (first copy of each name)."""
  by_name = {}
  for dist in importlib.metadata.distributions(path=_site_dirs()):
    name = (dist.metadata.get('Name') or '').lower()
    body = dist.metadata.get_payload() or dist.metadata.get('Description') or ''
    if name and name not in by_name and body.strip():
      by_name[name] = body
  for name in _shuffled(by_name, rng):
    yield Document('package-descriptions', name, (markup_to_text(by_name[name]),))


def python_docstrings(rng) -> Iterator[Document]:
  """Each standard-library module's docstrings (module, classes, functions), one section each;
  tests, `idlelib`, `lib2to3` and site-packages left out."""
  stdlib = sysconfig.get_paths()['stdlib']
  skip = ('site-packages', 'test', 'tests', 'idlelib', 'lib2to3')
  paths = [p for p in glob.glob(os.path.join(stdlib, '**', '*.py'), recursive=True)
           if not set(os.path.relpath(p, stdlib).split(os.sep)[:-1]) & set(skip)]
  for path in _shuffled(paths, rng):
    try:
      tree = ast.parse(_read(path))
    except (SyntaxError, ValueError):
      continue
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    docs = tuple(markup_to_text(d) for d in (ast.get_docstring(n) for n in nodes) if d)
    if docs:
      yield Document('python-docstrings', os.path.relpath(path, stdlib), docs)


def man_pages(rng, per_family: int = 100) -> Iterator[Document]:
  """English manual pages (sections 1-8), redirects (`.so`) skipped; at most `per_family` pages
  of one family (the name up to its first `_`: this machine has 16,631 `gcloud_*` pages)."""
  paths, families = [], {}
  for path in _shuffled(glob.glob('/usr/share/man/man[1-8]/*'), rng):
    family = os.path.basename(path).split('_')[0].split('.')[0]
    families[family] = families.get(family, 0) + 1
    if families[family] <= per_family:
      paths.append(path)
  for path in paths:
    text = _read(path)
    if text and not text.lstrip().startswith('.so '):
      yield Document('man-pages', path, (troff_to_text(text),))


def doc_files(rng) -> Iterator[Document]:
  """README, text, Markdown and reStructuredText files of `/usr/share/doc` and CMake's help."""
  paths = []
  for pattern in ('README*', '*.txt', '*.md', '*.rst', '*.txt.gz', '*.md.gz'):
    paths += glob.glob(os.path.join('/usr/share/doc', '**', pattern), recursive=True)
  paths += glob.glob('/usr/share/cmake-*/Help/**/*.rst', recursive=True)
  for path in _shuffled((p for p in paths if os.path.isfile(p)), rng):
    yield Document('docs', path, (markup_to_text(_read(path)),))


SOURCES = {
    'licenses': licenses,
    'package-descriptions': package_descriptions,
    'python-docstrings': python_docstrings,
    'man-pages': man_pages,
    'docs': doc_files,
}


def documents(name: str, seed: int) -> Iterator[Document]:
  """The documents of source `name`, shuffled by `seed` (the same seed, the same order)."""
  return SOURCES[name](np.random.default_rng([seed, list(SOURCES).index(name)]))
