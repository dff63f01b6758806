"""The block structure of a GIF, walked as giflib's DGifSlurp (behind `tf.io.decode_image`) walks it.

Pillow reads a GIF's first frame and stops; giflib reads the whole file and fails on what
Pillow never looks at (a byte after a frame that starts no block, a file cut before its
trailer): such a file would pass a Pillow check and fail at training time. The walk reads
only block headers and lengths (check.py has Pillow decode the LZW data) and gives the frame
rectangles: TensorFlow decodes to the largest frame's size, not the logical screen's.

Extensions are read as giflib reads them: the label and first sub-block, then sub-blocks up
to a zero-length one, so an extension whose first sub-block is already the terminator
(`21 FE 00`) swallows the bytes after it. A frame's graphic control is the first 0xF9
extension since the previous frame, and counts only with a 4-byte first sub-block. Pillow
reads such files differently, so check.py compares where each reader finds each frame.

TensorFlow gives up on a damaged first frame but decodes the frames before a later error
(tools/fuzz_image_check.py): such damage is `GifLayout.damage`, and the file becomes a PNG.
"""

from __future__ import annotations

import dataclasses
import struct

from transforms.images.types import ImageError

_IMAGE, _EXTENSION, _TRAILER = 0x2C, 0x21, 0x3B
_GRAPHIC_CONTROL = 0xF9


@dataclasses.dataclass(frozen=True)
class GifFrame:
    """One image block: its rectangle on the screen and the colour table it uses."""

    left: int
    top: int
    width: int
    height: int
    colors: int  # entries of the colour table the frame uses (local, else global; 0: none)
    offset: int = 0  # where its LZW data starts (after the code size byte), as Pillow's tile says


@dataclasses.dataclass(frozen=True)
class GifLayout:
    frames: tuple[GifFrame, ...]  # every frame read completely
    transparent: int | None  # transparent colour index of the first frame, if any
    damage: str | None = None  # what stopped the walk after the first frame, if anything

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) TensorFlow decodes to: the largest frame's, in each direction."""
        return max(f.width for f in self.frames), max(f.height for f in self.frames)


def _table_bytes(flags: int) -> int:
    return 3 * (2 << (flags & 7)) if flags & 0x80 else 0


def _skip_sub_blocks(data: bytes, pos: int, what: str) -> int:
    """Position after the zero-length block that ends a chain of sub-blocks."""
    while pos < len(data):
        length = data[pos]
        pos += 1 + length
        if length == 0:
            return pos
    raise ImageError(f"truncated gif: the file ends inside {what}")


def gif_layout(data: bytes) -> GifLayout:
    """Walks every block of a GIF up to its trailer, as giflib does when TensorFlow decodes it.
    Raises ImageError: not a GIF, or broken before its first frame is complete (cut short, an
    unknown block, a frame without a colour table or with an LZW code size above 8)."""
    if len(data) < 13 or data[:3] != b"GIF":
        raise ImageError("does not decode as gif: no screen descriptor")
    frames: list[GifFrame] = []
    transparent: list[int | None] = [None]
    try:
        _walk(data, frames, transparent)
    except ImageError as e:
        if not frames:
            raise
        return GifLayout(tuple(frames), transparent[0], damage=str(e))
    return GifLayout(tuple(frames), transparent[0])


def _walk(data: bytes, frames: list[GifFrame], transparent: list[int | None]) -> None:
    """Appends each complete frame to `frames` (and the first's transparent index); raises
    ImageError at the first broken block."""
    screen_flags = data[10]
    pos = 13 + _table_bytes(screen_flags)
    global_colors = 2 << (screen_flags & 7) if screen_flags & 0x80 else 0
    pending_transparent: int | None = None
    graphic_control_seen = False  # a graphic control block since the last frame
    end = len(data)
    while True:
        if pos >= end:
            raise ImageError("truncated gif: the file ends before its trailer")
        kind = data[pos]
        pos += 1
        if kind == _TRAILER:
            break
        if kind == _EXTENSION:
            if pos + 1 >= end:
                raise ImageError("truncated gif: the file ends inside an extension")
            label, first = data[pos], data[pos + 1]
            if label == _GRAPHIC_CONTROL and first and not graphic_control_seen:
                # giflib takes the frame's first graphic control block; only one of 4 bytes counts.
                graphic_control_seen = True
                if first == 4 and pos + 3 < end:
                    pending_transparent = data[pos + 5] if data[pos + 2] & 1 and pos + 5 < end else None
            pos += 2 + first  # past the first sub-block: even an empty one is not the end
            if pos > end:
                raise ImageError("truncated gif: the file ends inside an extension")
            pos = _skip_sub_blocks(data, pos, "an extension")
            continue
        if kind != _IMAGE:
            raise ImageError(f"corrupt gif: unknown block 0x{kind:02x} at byte {pos - 1}")
        if pos + 10 > end:
            raise ImageError("truncated gif: the file ends inside a frame header")
        left, top, width, height, flags = struct.unpack_from("<4HB", data, pos)
        pos += 9 + _table_bytes(flags)
        colors = 2 << (flags & 7) if flags & 0x80 else global_colors
        if not colors:
            raise ImageError(f"corrupt gif: frame {len(frames)} has no colour table")
        if pos >= end:
            raise ImageError("truncated gif: the file ends inside a frame")
        if data[pos] > 8:
            raise ImageError(f"corrupt gif: frame {len(frames)} has an LZW code size of {data[pos]}")
        offset = pos + 1
        pos = _skip_sub_blocks(data, offset, "a frame's image data")
        if not frames:
            transparent[0] = pending_transparent
        pending_transparent, graphic_control_seen = None, False
        frames.append(GifFrame(left, top, width, height, colors, offset))
    if not frames:
        raise ImageError("corrupt gif: no frame")
