"""tf.train.Example serialization without importing TensorFlow.

In: a feature dict (name -> int, float, str or bytes, or a list of them; `kinds` for empty
lists). Out: `serialize_example_chunks`, the protobuf wire format of `tf.train.Example`,
byte-identical to `SerializeToString(deterministic=True)` (map keys sorted; the tests check
it), so the hot path needs neither TensorFlow (seconds of import) nor a message per image.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping

FeatureValue = int | float | str | bytes
# A feature is a homogeneous list: ints -> Int64List, floats -> FloatList,
# str/bytes -> BytesList (str is UTF-8 encoded; undecodable file-name bytes survive).
Features = Mapping[str, FeatureValue | Iterable[FeatureValue]]


_ONE_BYTE = tuple(bytes((v,)) for v in range(0x80))


def _varint(value: int) -> bytes:
    # Fast paths: tags, small ints and short lengths (about 100 varints per image).
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0 <= value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if 0 <= value < 0x200000:  # the length of an image of up to 2 MB
        return bytes(((value & 0x7F) | 0x80, (value >> 7 & 0x7F) | 0x80, value >> 14))
    value &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _kind_of(values: list) -> str:
    if not values:
        raise ValueError("an empty feature needs an explicit kind")
    first = values[0]
    return "bytes" if isinstance(first, (str, bytes)) else "float" if isinstance(first, float) else "int64"


_LIST_FIELD = {"bytes": 1, "float": 2, "int64": 3}  # tf.train.Feature's oneof fields
_FIELD1, _FIELD2 = _varint(1 << 3 | 2), _varint(2 << 3 | 2)  # tags of length-delimited fields 1, 2


def _feature_parts(values: list, kind: str | None = None) -> tuple[list[bytes], int]:
    """The serialized `tf.train.Feature` of one homogeneous list, as (chunks, total size):
    a large value (the image) is then never copied per level of nesting."""
    kind = kind or _kind_of(values)
    if kind == "bytes":
        parts = []
        size = 0
        for value in values:
            if isinstance(value, str):
                value = value.encode("utf-8", "surrogateescape")
            head = _FIELD1 + _varint(len(value))
            parts += (head, value)
            size += len(head) + len(value)
    elif kind == "float":
        parts = [_field(1, struct.pack(f"<{len(values)}f", *values))] if values else []
        size = len(parts[0]) if parts else 0
    elif kind == "int64":
        if any(isinstance(v, (float, str, bytes)) for v in values):
            raise TypeError(f"int64 feature with non-integer values: {values!r}")
        parts = [_field(1, b"".join(_varint(int(v)) for v in values))] if values else []
        size = len(parts[0]) if parts else 0
    else:
        raise ValueError(f"unknown feature kind {kind!r}")
    head = _varint(_LIST_FIELD[kind] << 3 | 2) + _varint(size)
    return [head, *parts], len(head) + size


@functools.lru_cache(maxsize=1024)
def _key_field(name: str) -> bytes:
    """The map entry's key field (the same few feature names for every image)."""
    return _field(1, name.encode("utf-8"))


def _entry_parts(name: str, value, kind: str | None) -> tuple[list[bytes], int]:
    """One `Features.feature` map entry (key, Feature) as (chunks, total size)."""
    values = [value] if isinstance(value, (str, bytes, int, float)) else list(value)
    feature, feature_size = _feature_parts(values, kind)
    key = _key_field(name)
    value_head = _FIELD2 + _varint(feature_size)
    entry_size = len(key) + len(value_head) + feature_size
    entry_head = _FIELD1 + _varint(entry_size)
    return [entry_head, key, value_head, *feature], len(entry_head) + entry_size


@functools.lru_cache(maxsize=4096)
def _small_entry(name: str, value, value_type: type, kind: str | None) -> bytes:
    """A map entry for a scalar that repeats across images (format, label, size, ...);
    `value_type` is part of the cache key because 1, 1.0 and True are equal keys."""
    return b"".join(_entry_parts(name, value, kind)[0])


_SMALL = 64  # int and str/bytes values up to this length are cached as whole entries
_CHUNK = 4096  # values at least this long are chunks of their own (not copied by the serializer)


@functools.lru_cache(maxsize=1024)
def _one_bytes_head(name: str, n: int) -> bytes:
    """What `_entry_parts(name, [value], "bytes")` gives before `value`, from its length
    `n` alone: the same for every image of a size (file names, hashes, ...)."""
    inner = 1 + len(_varint(n)) + n  # BytesList: field 1, length, value
    feature = 1 + len(_varint(inner)) + inner  # Feature: bytes_list (field 1)
    key = _key_field(name)
    entry = len(key) + 1 + len(_varint(feature)) + feature
    return b"".join(
        (
            _FIELD1,
            _varint(entry),
            key,
            _FIELD2,
            _varint(feature),
            _FIELD1,
            _varint(inner),
            _FIELD1,
            _varint(n),
        )
    )


def serialize_example_chunks(features: Features, kinds: Mapping[str, str] | None = None) -> list[bytes]:
    """The serialized Example as chunks: values of at least _CHUNK bytes (the image) are
    chunks of their own, never copied; the small fields between them are joined. The shard
    writer checksums and writes the chunks without joining the Example."""
    kinds = kinds or {}
    chunks: list[bytes] = []
    run: list[bytes] = []  # small pieces since the last chunk
    size = 0  # of the Features message
    for name in sorted(features):
        value = features[name]
        value_type = type(value)
        kind = kinds.get(name)
        if value_type is list and len(value) == 1 and type(value[0]) in _SCALARS:
            value = value[0]  # one value: the same entry as the value alone
            value_type = type(value)
        if value_type is str and kind in _BYTES_KINDS:
            value_type, value = bytes, value.encode("utf-8", "surrogateescape")
        if value_type is bytes and kind in _BYTES_KINDS:
            n = len(value)
            head = _one_bytes_head(name, n) if n <= _SMALL else _one_bytes_head.__wrapped__(name, n)
            size += len(head) + n
            if n < _CHUNK:
                run += (head, value)
            else:
                run.append(head)
                chunks += (b"".join(run), value)
                run = []
        elif value_type is int and kind in _INT_KINDS:
            entry = _small_entry(name, value, value_type, kind)
            run.append(entry)
            size += len(entry)
        else:
            entry_parts, entry_size = _entry_parts(name, value, kind)
            size += entry_size
            for part in entry_parts:
                if len(part) < _CHUNK:
                    run.append(part)
                else:
                    chunks += (b"".join(run), part)
                    run = []
    chunks.append(b"".join(run))
    chunks[0] = b"".join((_FIELD1, _varint(size), chunks[0]))
    return chunks


_SCALARS = (int, str, bytes)
_BYTES_KINDS = frozenset((None, "bytes"))
_INT_KINDS = frozenset((None, "int64"))
