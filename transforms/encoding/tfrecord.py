"""TFRecord framing without TensorFlow: a record on disk is `uint64 length | uint32
masked_crc32c(length) | data | uint32 masked_crc32c(data)` (little endian). `frame_chunks`
frames a record for the shard writer; `iter_records` walks a shard and raises `RecordError`
with the byte offset (as in the `.idx` files) of the first record that does not check out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import google_crc32c

HEADER_BYTES = 12  # length (8) + its CRC (4)
FOOTER_BYTES = 4  # CRC of the data
RECORD_OVERHEAD = HEADER_BYTES + FOOTER_BYTES
_MASK_DELTA = 0xA282EAD8


class RecordError(ValueError):
    """A record that is truncated or fails its CRC; `offset` is where the record starts."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    return _mask(google_crc32c.value(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_chunks(chunks: Sequence[bytes], size: int) -> tuple[bytes, bytes]:
    """The (header, footer) that frame the record `b"".join(chunks)` (`size` bytes long), its
    CRC extended chunk by chunk: the record is never joined."""
    length = struct.pack("<Q", size)
    crc = google_crc32c.value(chunks[0])
    for chunk in chunks[1:]:
        crc = google_crc32c.extend(crc, chunk)
    return length + struct.pack("<I", masked_crc32c(length)), struct.pack("<I", _mask(crc))


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = f.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def iter_records(f: BinaryIO, max_record_bytes: int = 1 << 31) -> Iterator[tuple[int, bytes]]:
    """Yields (offset, data) for each record of an open (decompressed) TFRecord stream.
    Raises RecordError: a truncated record, a CRC mismatch or an implausible length."""
    offset = 0
    while True:
        header = _read_exactly(f, HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise RecordError(offset, f"truncated header ({len(header)} of {HEADER_BYTES} bytes)")
        length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
        if masked_crc32c(length_bytes) != length_crc:
            raise RecordError(offset, "length CRC mismatch")
        (length,) = struct.unpack("<Q", length_bytes)
        if length > max_record_bytes:
            raise RecordError(offset, f"implausible record length {length}")
        data = _read_exactly(f, length)
        footer = _read_exactly(f, FOOTER_BYTES)
        if len(data) < length or len(footer) < FOOTER_BYTES:
            raise RecordError(offset, f"truncated record (length {length}, file ends early)")
        if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
            raise RecordError(offset, "data CRC mismatch")
        yield offset, data
        offset += RECORD_OVERHEAD + length
