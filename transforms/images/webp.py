"""The RIFF container of a WebP file, and whether TensorFlow's libwebp decodes it as stored.

In: a WebP file's bytes. Out: None for a still image in a container laid out as libwebp
writes it, else the reason to convert it to PNG. Pillow's demuxer tolerates containers
TensorFlow 2.21 refuses or crashes on (tools/fuzz_image_check.py --family webp): any
animation, even of one frame, corrupts TensorFlow's heap; an ALPH chunk the VP8X flags do not
announce (or beside VP8L); sizes that do not match the file or the bitstream; a missing or
repeated bitstream. Only chunk headers are read: the pixels are Pillow's.
"""

from __future__ import annotations

import struct

_ANIMATION_FLAG, _ALPHA_FLAG = 0x02, 0x10
_ANIMATION_CHUNKS = (b"ANIM", b"ANMF")
_BITSTREAMS = (b"VP8 ", b"VP8L")


def _chunks(data: bytes) -> list[tuple[bytes, int, int]] | str:
    """(fourcc, payload start, payload size) of each chunk, or why the container is off."""
    if len(data) < 12 or int.from_bytes(data[4:8], "little") + 8 != len(data):
        return "RIFF size does not match the file"
    out, pos = [], 12
    while pos < len(data):
        if pos + 8 > len(data):
            return "a chunk header is cut short"
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        end = pos + 8 + size
        if end + (size & 1) > len(data):
            return f"chunk {data[pos : pos + 4]!r} runs past the end of the file"
        out.append((data[pos : pos + 4], pos + 8, size))
        pos = end + (size & 1)
    return out


def _bitstream_size(fourcc: bytes, payload: bytes) -> tuple[int, int] | None:
    """(width, height) in a VP8 or VP8L bitstream's header, or None if it is not there."""
    if fourcc == b"VP8 " and len(payload) >= 10 and payload[3:6] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", payload, 6)
        return width & 0x3FFF, height & 0x3FFF
    if fourcc == b"VP8L" and len(payload) >= 5 and payload[0] == 0x2F:
        bits = int.from_bytes(payload[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def webp_problem(data: bytes) -> str | None:
    """Why TensorFlow 2.21 may not decode these WebP bytes as stored, or None if it does.
    Conservative: a layout not known to be safe is converted (else it fails at training)."""
    chunks = _chunks(data)
    if isinstance(chunks, str):
        return f"WebP container off ({chunks})"
    kinds = [fourcc for fourcc, _, _ in chunks]
    if any(kind in _ANIMATION_CHUNKS for kind in kinds):
        return "animated WebP crashes TensorFlow's decoder"
    streams = [
        (fourcc, data[start : start + size]) for fourcc, start, size in chunks if fourcc in _BITSTREAMS
    ]
    if len(streams) != 1:
        return f"WebP with {len(streams)} image bitstreams"
    fourcc, payload = streams[0]
    size = _bitstream_size(fourcc, payload)
    if size is None:
        return "WebP bitstream header unreadable"
    if kinds[0] != b"VP8X":
        return None if kinds[0] == fourcc and len(kinds) == 1 else "WebP chunks out of order"
    start = chunks[0][1]
    if chunks[0][2] < 10:
        return "VP8X chunk too short"
    flags = data[start]
    if flags & _ANIMATION_FLAG:
        return "animated WebP crashes TensorFlow's decoder"
    canvas = (
        int.from_bytes(data[start + 4 : start + 7], "little") + 1,
        int.from_bytes(data[start + 7 : start + 10], "little") + 1,
    )
    if canvas != size:
        return f"WebP canvas {canvas[0]}x{canvas[1]} differs from its image {size[0]}x{size[1]}"
    alph = kinds.count(b"ALPH")
    if alph > 1 or (
        alph and (fourcc != b"VP8 " or not flags & _ALPHA_FLAG or kinds.index(b"ALPH") > kinds.index(fourcc))
    ):
        return "WebP alpha chunk where TensorFlow's decoder does not expect one"
    return None
