"""Builds the optional C++ CPU matmul kernel (`models/_small_matmul*.so`, see models/cpu_matmul.py).

All metadata lives in pyproject.toml. The extension is `optional`: if the compiler or the XLA FFI
headers (shipped in jaxlib, a build requirement) are missing, `pip install` still succeeds and the
models use XLA's matmul. It is a plain shared library loaded with ctypes, not a Python module.
"""

import os
import runpy

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildKernel(build_ext):
  """Adds jaxlib's FFI headers at build time (jaxlib is importable only inside the build)."""

  def build_extensions(self):
    try:
      import jaxlib  # pylint: disable=g-import-not-at-top
      include = os.path.join(os.path.dirname(jaxlib.__file__), 'include')
    except ImportError:
      include = None
    for ext in self.extensions:
      if include:
        ext.include_dirs.append(include)
    super().build_extensions()

  def get_export_symbols(self, ext):
    return []  # no PyInit_ function: the library exports the FFI handler only


# Compiled into the library; models/cpu_matmul.py refuses a library built from other sources.
_HASH = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'models',
                                    'kernel_sources.py'))['source_hash']()

setup(
    ext_modules=[
        Extension(
            'models._small_matmul',
            sources=['models/csrc/small_matmul.cc', 'models/csrc/small_attention.cc',
                     'models/csrc/ffi_handlers.cc'],
            include_dirs=['models/csrc'],
            define_macros=[('JAXSPEC_SOURCE_HASH', f'"{_HASH}"')],
            language='c++',
            extra_compile_args=['-O3', '-std=c++17', '-w'],
            optional=True,
        )
    ],
    cmdclass={'build_ext': BuildKernel},
)
