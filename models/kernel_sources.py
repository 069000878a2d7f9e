"""The fingerprint of the C++ kernel's sources (`models/csrc/`), shared by the build and the
loader: `setup.py` compiles it into the library, and `models/cpu_matmul.py` refuses a library
built from other sources (a checkout updated without rebuilding), falling back to XLA. No imports
beyond the standard library: `setup.py` runs this file before the package is importable."""

import hashlib
import os

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'csrc')


def source_hash(csrc: str = CSRC) -> str | None:
  """16 hex digits of SHA-256 over the names and bytes of csrc's .cc and .h files; None if the
  directory is absent (an installed copy without sources)."""
  if not os.path.isdir(csrc):
    return None
  digest = hashlib.sha256()
  for name in sorted(os.listdir(csrc)):
    if name.endswith(('.cc', '.h')):
      digest.update(name.encode())
      with open(os.path.join(csrc, name), 'rb') as f:
        digest.update(f.read())
  return digest.hexdigest()[:16]
