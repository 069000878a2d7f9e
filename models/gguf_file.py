"""A fast reader of GGUF files (ggml `docs/gguf.md`, versions 2 and 3): metadata as Python values,
tensors as memory-mapped numpy views shaped as `gguf.GGUFReader` shapes them, ready for
`gguf.quants.dequantize`.

`gguf.GGUFReader` builds a Python object for every array element of the metadata, which takes
tens of seconds on Gemma's 262144-token vocabulary (and ~5-20 s on SmolLM2's); this reads the
same bytes in about a second.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Collection

import numpy as np

_SCALARS = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q',
            11: '<q', 12: '<d'}  # GGUF value type -> struct format (8 string, 9 array)
_DEFAULT_ALIGNMENT = 32


def _read_value(buf, pos: int, kind: int) -> tuple[Any, int]:
  """One metadata value of GGUF type `kind` at byte `pos`: (value, next position)."""
  if kind in _SCALARS:
    fmt = _SCALARS[kind]
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
  if kind == 8:
    (n,) = struct.unpack_from('<Q', buf, pos)
    return bytes(buf[pos + 8:pos + 8 + n]).decode('utf-8'), pos + 8 + n
  if kind == 9:
    item, count = struct.unpack_from('<IQ', buf, pos)
    pos += 12
    if item in _SCALARS:  # numbers: one numpy read
      dtype = np.dtype(_SCALARS[item])
      return np.frombuffer(buf, dtype, count, pos).tolist(), pos + count * dtype.itemsize
    values = []
    for _ in range(count):
      value, pos = _read_value(buf, pos, item)
      values.append(value)
    return values, pos
  raise ValueError(f'unknown GGUF metadata value type {kind}')


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One tensor: `shape` in ggml order (innermost first), `data` a read-only view of the file:
  float types as `[..., shape[0]]` arrays of their dtype, quantized types as uint8 rows of
  blocks (what `gguf.quants.dequantize(data, tensor_type)` takes)."""

  name: str
  tensor_type: Any  # gguf.GGMLQuantizationType
  shape: tuple[int, ...]
  data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  """`metadata`: key -> value (int, float, bool, str or list); `tensors`: in file order."""

  metadata: dict[str, Any]
  tensors: list[Tensor]


def _header(buf, path: str, keys: Collection[str] | None) -> tuple[dict[str, Any], int, int]:
  magic, version, n_tensors, n_kv = struct.unpack_from('<4sIQQ', buf, 0)
  if magic != b'GGUF' or version not in (2, 3):
    raise ValueError(f'{path!r} is not a GGUF v2/v3 file')
  metadata, pos = {}, 24
  for _ in range(n_kv):
    key, pos = _read_value(buf, pos, 8)
    (kind,) = struct.unpack_from('<I', buf, pos)
    value, pos = _read_value(buf, pos + 4, kind)
    if keys is None or key in keys:
      metadata[key] = value
  return metadata, n_tensors, pos


def read_metadata(path: str, keys: Collection[str] | None = None) -> dict[str, Any]:
  """The metadata of the GGUF file at `path` (only `keys`, when given; absent keys left out).

  Raises FileNotFoundError (no such file), ValueError (not a GGUF v2/v3 file).
  """
  buf = np.memmap(path, np.uint8, mode='r')
  return _header(buf, path, keys)[0]


def read_gguf(path: str) -> GGUFFile:
  """All metadata and tensor views of the GGUF file at `path` (memory-mapped, nothing copied).

  Raises FileNotFoundError (no such file), ValueError (not a GGUF v2/v3 file, a tensor past the
  end of the file).
  """
  import gguf  # pylint: disable=g-import-not-at-top
  buf = np.memmap(path, np.uint8, mode='r')
  metadata, n_tensors, pos = _header(buf, path, None)
  infos = []
  for _ in range(n_tensors):
    name, pos = _read_value(buf, pos, 8)
    (n_dims,) = struct.unpack_from('<I', buf, pos)
    dims = struct.unpack_from(f'<{n_dims}Q', buf, pos + 4)
    kind, offset = struct.unpack_from('<IQ', buf, pos + 4 + 8 * n_dims)
    pos += 4 + 8 * n_dims + 12
    infos.append((name, tuple(dims), gguf.GGMLQuantizationType(kind), offset))
  alignment = int(metadata.get('general.alignment', _DEFAULT_ALIGNMENT))
  start = -(-pos // alignment) * alignment
  floats = {'F32': np.float32, 'F16': np.float16, 'F64': np.float64}
  tensors = []
  for name, dims, kind, offset in infos:
    np_dims = tuple(reversed(dims))
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    n_bytes = int(np.prod(dims)) * type_size // block
    begin = start + offset
    if begin + n_bytes > len(buf):
      raise ValueError(f'{path!r}: tensor {name} ends past the end of the file')
    raw = buf[begin:begin + n_bytes]
    if kind.name in floats:
      data = raw.view(floats[kind.name]).reshape(np_dims)
    else:
      data = raw.reshape(gguf.quants.quant_shape_to_byte_shape(np_dims, kind))
    tensors.append(Tensor(name=name, tensor_type=kind, shape=dims, data=data))
  return GGUFFile(metadata=metadata, tensors=tensors)
