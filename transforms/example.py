"""tf.train.Example serialization without importing TensorFlow.

`serialize_example` writes the protobuf wire format of `tf.train.Example` directly. Its
output is byte-identical to `tf.train.Example(...).SerializeToString(deterministic=True)`
(map keys sorted), which the tests check, so the hot path needs neither TensorFlow (seconds
of import) nor a protobuf message per image. `make_example` returns the real message for
callers that want one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

FeatureValue = int | float | str | bytes
# A feature is a homogeneous list: ints -> Int64List, floats -> FloatList,
# str/bytes -> BytesList (str is UTF-8 encoded; undecodable file-name bytes survive).
Features = Mapping[str, FeatureValue | Iterable[FeatureValue]]


def _varint_slow(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = tuple(bytes((v,)) for v in range(0x80))


def _varint(value: int) -> bytes:
    # Fast paths: tags, small ints and short lengths (about 100 varints per image).
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0 <= value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    return _varint_slow(value)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _as_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape")


def _as_list(value) -> list:
    if isinstance(value, (str, bytes, int, float)):
        return [value]
    return list(value)


def _feature(values: list, kind: str | None = None) -> bytes:
    """The serialized `tf.train.Feature` for one homogeneous list."""
    if kind is None:
        if not values:
            raise ValueError("an empty feature needs an explicit kind")
        first = values[0]
        kind = (
            "bytes" if isinstance(first, (str, bytes)) else "float" if isinstance(first, float) else "int64"
        )
    if kind == "bytes":
        body = b"".join(_field(1, _as_bytes(v)) for v in values)
        return _field(1, body)
    if kind == "float":
        body = _field(1, struct.pack(f"<{len(values)}f", *values)) if values else b""
        return _field(2, body)
    if kind == "int64":
        if any(isinstance(v, (float, str, bytes)) for v in values):
            raise TypeError(f"int64 feature with non-integer values: {values!r}")
        body = _field(1, b"".join(_varint(int(v)) for v in values)) if values else b""
        return _field(3, body)
    raise ValueError(f"unknown feature kind {kind!r}")


def serialize_example(features: Features, kinds: Mapping[str, str] | None = None) -> bytes:
    """Serializes a feature dict as a `tf.train.Example`, keys in sorted order.

    Args:
      features: feature name -> value or list of values (int, float, str or bytes).
      kinds: optional name -> 'int64' | 'float' | 'bytes', needed for empty lists.

    Returns:
      The Example's wire bytes.
    """
    kinds = kinds or {}
    entries = []
    for name in sorted(features):
        entry = _field(1, name.encode("utf-8")) + _field(
            2, _feature(_as_list(features[name]), kinds.get(name))
        )
        entries.append(_field(1, entry))
    return _field(1, b"".join(entries))


def make_example(features: Features, kinds: Mapping[str, str] | None = None):
    """Returns the `tf.train.Example` message for `features` (imports TensorFlow)."""
    import tensorflow as tf

    return tf.train.Example.FromString(serialize_example(features, kinds))
