"""Files written whole or not at all: a writer that fails or is stopped leaves no partial file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = '') -> Iterator[str]:
  """Yields a temporary file name next to `path` (its own for each writer, so processes or
  threads writing the same file do not collide) ending in `suffix` (`.npz` for `np.savez`, which
  would otherwise append it); once the block ends without error the file is made readable by all
  (0o644) and moved onto `path` with `os.replace` (atomic on POSIX); on an error it is removed.
  Creates `path`'s directory if missing."""
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + '.',
                             suffix='.tmp' + suffix)
  os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
