"""A JPEG check that predicts TensorFlow's decoder from the file's structure, without decoding.

What makes `tf.io.decode_image` (TensorFlow 2.21, libjpeg-turbo) fail is the structure, not
the pixels (tests/images/test_jpeg_check.py keeps the cases): data that ends before the
end-of-image marker; an unknown marker, a second SOI or an unparsable segment; an undefined
quantisation table or an invalid Huffman table. Bit errors in the entropy-coded data decode
(to wrong pixels) in TensorFlow and Pillow alike.

So a walk of the header segments and a search for the marker that ends each scan stands in
for a 1/8-scale decode, at a few percent of its cost. `check_jpeg` returns what TensorFlow
decodes the file to when it is sure, raises ImageError when it is sure TensorFlow rejects it,
and returns None for what it does not model (12-bit, lossless or arithmetic coding, CMYK, DNL
heights, odd sampling, ...): Pillow then checks the file. `tools/fuzz_image_check.py` compares
it with TensorFlow on mutated files.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from transforms.images.check import JPEG_MAX_SIDE, check_size, detect_format
from transforms.images.types import ImageError, ImageInfo, ImageOptions, PreparedImage

# 0xFF followed by anything but a stuffed zero: a marker (or the first of several fill 0xFF).
_MARKER = re.compile(rb"\xff[^\x00]")

_SOI, _EOI, _SOS, _DQT, _DHT, _DRI, _TEM = 0xD8, 0xD9, 0xDA, 0xDB, 0xC4, 0xDD, 0x01
_RST = range(0xD0, 0xD8)
_HUFFMAN_SOF = {0xC0: False, 0xC1: False, 0xC2: True}  # baseline, extended, progressive
_OTHER_SOF = (0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)  # modelled by Pillow only
_SKIPPED = frozenset((*range(0xE0, 0xF0), 0xFE, 0xDC))  # APPn, COM, DNL: skipped by libjpeg
_DAC = 0xCC  # arithmetic-coding tables
_WITH_LENGTH = frozenset((*_HUFFMAN_SOF, *_OTHER_SOF, *_SKIPPED, _SOS, _DQT, _DHT, _DRI, _DAC))
_MAX_OUTPUT_BYTES = 1 << 29  # TensorFlow refuses to decode to more bytes than this
_MAX_BLOCKS_IN_MCU = 10
_DEFAULT_HUFFMAN = frozenset({(0, 0), (0, 1), (1, 0), (1, 1)})
# Entropy-coded data longer than this is searched with numpy (fixed cost ~3 us) rather than the regex.
_VECTOR_SEARCH = 12_000
_NOT_A_MARKER = (0x00, 0xFF)  # after 0xFF: a stuffed zero, or a fill byte before a marker


def prepare_kept_jpeg(data: bytes, options: ImageOptions) -> PreparedImage | None:
    """`prepare_image` for a JPEG stored as it is, checked by `check_jpeg`; else None (not a
    JPEG, an option may change it, or not modelled: Pillow decodes it). Raises ImageError:
    TensorFlow rejects the file, or it has more than `options.max_pixels`."""
    if detect_format(data) != "jpeg" or options.changes_pixels() or options.exif_transpose:
        return None
    info = check_jpeg(data)
    if info is None:
        return None
    check_size(info.width, info.height, options.max_pixels)
    return PreparedImage(data, info)


@functools.lru_cache(maxsize=1024)
def _jpeg_info(height: int, width: int, channels: int) -> ImageInfo:
    """What `tf.io.decode_image` gives a kept JPEG (immutable: shared by the images of one size)."""
    return ImageInfo("jpeg", height, width, channels)


class _Unmodelled(Exception):
    """The file uses something this walk does not model: leave it to the full check."""


def check_jpeg(data: bytes) -> ImageInfo | None:
    """What TensorFlow decodes `data` (starting with SOI) to; None if not modelled here.
    Raises ImageError: TensorFlow's decoder rejects the file (the message says why)."""
    try:
        return _walk(data)
    except _Unmodelled:
        return None


@dataclasses.dataclass(slots=True)
class _State:
    """What the header segments seen so far define."""

    frame: tuple[int, int, dict[int, tuple[int, int, int]]] | None = None  # h, w, components
    progressive: bool = False
    quant: set[int] = dataclasses.field(default_factory=set)
    huffman: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # (0 DC | 1 AC, id)
    restarts: bool = False  # a non-zero restart interval (DRI) was defined
    scanned: set[int] = dataclasses.field(default_factory=set)  # components of sequential scans
    scans: int = 0

    def copy(self, frame: tuple | None = None) -> _State:
        """A copy with sets of its own (the walk changes them), and `frame` if given."""
        return _State(
            frame or self.frame,
            self.progressive,
            set(self.quant),
            set(self.huffman),
            self.restarts,
            set(self.scanned),
            self.scans,
        )


class _HeaderCache:
    """The walk's state after the headers (SOI to the end of the first SOS) of files seen before.

    A dataset's files mostly share their headers but for the frame's height and width, which
    the walk to the first SOS reads only in `_check_frame_size`: a file whose header equals a
    remembered one, size bytes aside, gets the remembered state (its own size checked) and is
    walked on from its scan data. Bounded: headers of up to MAX_BYTES (camera EXIF/ICC headers
    differ per file), at most MAX of them (<= 1 MB); when full, the cache starts again.
    """

    MAX = 256
    MAX_BYTES = 4096

    def __init__(self) -> None:
        # header end -> {offset of the size bytes}; (end, offset, header less size) -> state
        self._offsets: dict[int, tuple[int, ...]] = {}
        self._states: dict[tuple[int, int, bytes], _State] = {}  # copies no walk changes

    def add(self, data: bytes, end: int, size_at: int, state: _State) -> None:
        """Remembers the header `data[:end]` (size bytes at `size_at`), walked to `state`."""
        if end > self.MAX_BYTES:
            return
        if len(self._states) >= self.MAX:
            self._offsets.clear()
            self._states.clear()
        self._states[(end, size_at, data[:size_at] + data[size_at + 4 : end])] = state.copy()
        offsets = self._offsets.get(end, ())
        if size_at not in offsets:  # a new tuple: a reader in another thread keeps its own
            self._offsets[end] = (*offsets, size_at)

    def find(self, data: bytes) -> tuple[_State, int] | None:
        """(the state after the headers, where they end) for a remembered header, else None."""
        if not self._states:
            return None
        sos = data.find(b"\xff\xda", 2, self.MAX_BYTES)
        if sos < 0 or sos + 4 > len(data):
            return None
        end = sos + 4 + (data[sos + 2] << 8 | data[sos + 3]) - 2
        if end > self.MAX_BYTES:
            return None
        for size_at in self._offsets.get(end, ()):
            known = self._states.get((end, size_at, data[:size_at] + data[size_at + 4 : end]))
            if known is None:
                continue
            height, width = data[size_at] << 8 | data[size_at + 1], data[size_at + 2] << 8 | data[size_at + 3]
            comps = known.frame[2]
            _check_frame_size(height, width, comps)
            return known.copy((height, width, comps)), end  # known.scans is 1: the header's SOS
        return None


_HEADERS = _HeaderCache()


def _walk(data: bytes) -> ImageInfo:
    size = len(data)
    search = _MARKER.search
    known = _HEADERS.find(data)
    if known is None:
        state = _State()
        pos = 2  # after SOI
        scan_data = False  # pos is where a sequential scan's entropy-coded data starts
    else:  # the header walked before: continue after its first SOS
        state, pos = known
        scan_data = not state.progressive
    size_at = 0  # where the frame header's height and width are (0: no frame yet)
    while True:
        if pos + 1 < size and data[pos] == 0xFF and data[pos + 1] not in _NOT_A_MARKER:
            # A marker right where the previous segment ends (the header): what the search
            # below finds, without it.
            marker = data[pos + 1]
            pos += 2
        else:
            if scan_data and not state.restarts and size - pos > _VECTOR_SEARCH:  # no marker before its end
                start = _first_marker(data, pos)
            else:
                found = search(data, pos)
                start = -1 if found is None else found.start()
            scan_data = False
            if start < 0:  # TensorFlow needs the EOI; Pillow accepts a file without one
                raise ImageError("does not decode as jpeg: truncated (no end-of-image marker)")
            pos = start + 1
            while pos < size and data[pos] == 0xFF:  # fill bytes before a marker
                pos += 1
            if pos >= size:
                raise _Unmodelled
            marker = data[pos]
            pos += 1
            if marker == 0x00:  # fill bytes then a stuffed zero: entropy-coded data, not a marker
                continue
        if marker not in _WITH_LENGTH:
            if marker in _RST or marker == _TEM:
                continue
            if marker == _EOI:
                break
            if state.restarts and state.scans:
                raise _Unmodelled  # skipped while resynchronising at a restart marker (measured)
            if marker == _SOI:
                raise ImageError("does not decode as jpeg: a second start-of-image marker")
            # libjpeg stops with "Unsupported marker type"
            raise ImageError(f"does not decode as jpeg: unknown marker 0xFF{marker:02X}")
        if pos + 2 > size:
            raise ImageError("does not decode as jpeg: truncated (the file ends inside a marker)")
        length = data[pos] << 8 | data[pos + 1]
        if length < 2:
            raise _Unmodelled  # libjpeg skips some of these and refuses others
        end = pos + length
        if end > size:  # TensorFlow runs out of data skipping it (one false alarm in ~10,000 fuzzed)
            raise ImageError("does not decode as jpeg: truncated (the file ends inside a segment)")
        if marker in _SKIPPED:
            pos = end
            continue
        body = data[pos + 2 : end]
        if marker in _HUFFMAN_SOF:
            if state.frame is not None:
                raise _Unmodelled
            state.frame, state.progressive = _frame(body), _HUFFMAN_SOF[marker]
            size_at = pos + 3
        elif marker == _SOS:
            _scan(state, body)
            scan_data = not state.progressive
            if state.scans == 1 and size_at:  # the header ends here: remembered for the next files
                _HEADERS.add(data, end, size_at, state)
        elif marker == _DQT:
            state.quant.update(_quant_tables(body))
        elif marker == _DHT:
            state.huffman.update(_huffman_tables(body))
        elif marker == _DRI:
            if length != 4:
                raise _Unmodelled
            state.restarts = state.restarts or body != b"\x00\x00"
        else:  # other SOF types, arithmetic coding (DAC)
            raise _Unmodelled
        pos = end
    if state.frame is None or not state.scans:
        raise _Unmodelled
    height, width, comps = state.frame
    if not state.progressive and state.scanned != comps.keys():
        raise _Unmodelled  # a sequential image with components never scanned
    return _jpeg_info(height, width, 1 if len(comps) == 1 else 3)


def _first_marker(data: bytes, pos: int) -> int:
    """Where `_MARKER.search(data, pos)` matches, or -1: vectorised passes over all of
    `data[pos:]`, ~40% less CPU than the regex but not stopping at the match, so used only where
    the next marker should end the data (once per sequential scan)."""
    if len(data) - pos < 2:
        return -1
    rest = np.frombuffer(data, np.uint8, offset=pos)
    hit = rest[:-1] == 0xFF
    np.logical_and(hit, rest[1:], out=hit)  # ... followed by anything but a stuffed zero
    i = int(hit.argmax())
    return pos + i if hit[i] else -1


def _frame(body: bytes) -> tuple[int, int, dict[int, tuple[int, int, int]]]:
    """SOF0/1/2 (8-bit, 1 or 3 components, sampling libjpeg-turbo supports): (height, width,
    component id -> (h, v, quantisation table)), the dict shared by many files, never changed."""
    if len(body) < 6 or body[0] != 8:
        raise _Unmodelled
    height, width = body[1] << 8 | body[2], body[3] << 8 | body[4]
    comps = _components(body[5:])
    _check_frame_size(height, width, comps)
    return height, width, comps


def _check_frame_size(height: int, width: int, comps: dict) -> None:
    """Sizes libjpeg-turbo and TensorFlow decode; others are left to the full check."""
    if not (0 < height <= JPEG_MAX_SIDE and 0 < width <= JPEG_MAX_SIDE):
        raise _Unmodelled
    if height * width * (1 if len(comps) == 1 else 3) >= _MAX_OUTPUT_BYTES:
        raise _Unmodelled


@functools.lru_cache(maxsize=256)  # a dataset's files share one or two layouts
def _components(spec: bytes) -> dict[int, tuple[int, int, int]]:
    """The component part of a frame header (count, then id, sampling, table per component)."""
    count = spec[0]
    if count not in (1, 3) or len(spec) != 1 + 3 * count:
        raise _Unmodelled
    comps: dict[int, tuple[int, int, int]] = {}
    max_h = max_v = blocks = 0
    for i in range(1, 1 + 3 * count, 3):
        cid, sampling, table = spec[i], spec[i + 1], spec[i + 2]
        h, v = sampling >> 4, sampling & 15
        if cid in comps or not (1 <= h <= 4 and 1 <= v <= 4) or table > 3:
            raise _Unmodelled
        comps[cid] = (h, v, table)
        max_h, max_v, blocks = max(max_h, h), max(max_v, v), blocks + h * v
    if any(max_h % h or max_v % v for h, v, _ in comps.values()):
        raise _Unmodelled  # fractional sampling ratios
    if blocks > _MAX_BLOCKS_IN_MCU:
        raise _Unmodelled
    return comps


def _scan(state: _State, body: bytes) -> None:
    """SOS: components of the frame with defined tables and parameters libjpeg accepts."""
    if state.frame is None or not body:
        raise _Unmodelled
    count = body[0]
    if not 1 <= count <= 4 or len(body) != 4 + 2 * count:
        raise _Unmodelled
    comps = state.frame[2]
    ids = body[1 : 1 + 2 * count : 2]
    if len(set(ids)) != count or any(cid not in comps for cid in ids):
        raise _Unmodelled
    ss, se, approx = body[1 + 2 * count], body[2 + 2 * count], body[3 + 2 * count]
    ah, al = approx >> 4, approx & 15
    if state.progressive:
        dc = ss == 0
        if (dc and se != 0) or (not dc and (ss > se or se > 63 or count != 1)):
            raise _Unmodelled
        if (ah and al != ah - 1) or al > 13:
            raise _Unmodelled
    else:
        if (ss, se, ah, al) != (0, 63, 0, 0) or state.scanned.intersection(ids):
            raise _Unmodelled
        state.scanned.update(ids)
    if count > 1 and sum(comps[c][0] * comps[c][1] for c in ids) > _MAX_BLOCKS_IN_MCU:
        raise _Unmodelled
    # The sequential decoder has default tables 0 and 1 (libjpeg-turbo's std_huff_tables);
    # the progressive one has none.
    huffman = state.huffman if state.progressive else state.huffman | _DEFAULT_HUFFMAN
    for i, cid in enumerate(ids):
        if comps[cid][2] not in state.quant:
            raise _Unmodelled  # TensorFlow fails ("quantization table was not defined")
        tables = body[2 + 2 * i]
        dc_table, ac_table = tables >> 4, tables & 15
        needs_dc = not state.progressive or (ss == 0 and ah == 0)  # DC refinement needs no table
        needs_ac = not state.progressive or ss > 0
        if (needs_dc and (0, dc_table) not in huffman) or (needs_ac and (1, ac_table) not in huffman):
            raise _Unmodelled
    state.scans += 1


@functools.lru_cache(maxsize=256)  # a dataset's files mostly share their tables
def _quant_tables(body: bytes) -> frozenset[int]:
    """DQT: the table ids it defines."""
    defined = set()
    pos = 0
    while pos < len(body):
        precision, table = body[pos] >> 4, body[pos] & 15
        step = 1 + 64 * (2 if precision else 1)
        if precision > 1 or table > 3 or pos + step > len(body):
            raise _Unmodelled
        defined.add(table)
        pos += step
    return frozenset(defined)


@functools.lru_cache(maxsize=256)
def _huffman_tables(body: bytes) -> frozenset[tuple[int, int]]:
    """DHT: the (class, id) of the tables it defines, each valid (jpeg_make_d_derived_tbl rules)."""
    defined = set()
    pos = 0
    while pos < len(body):
        if pos + 17 > len(body):
            raise _Unmodelled
        kind, table = body[pos] >> 4, body[pos] & 15
        counts = body[pos + 1 : pos + 17]
        total = sum(counts)
        if kind > 1 or table > 3 or total > 256 or pos + 17 + total > len(body):
            raise _Unmodelled
        code = 0
        for bits, n in enumerate(counts, start=1):  # no code may be all ones (jdhuff.c)
            code += n
            if n and code >= 1 << bits:
                raise _Unmodelled
            code <<= 1
        if kind == 0 and any(symbol > 15 for symbol in body[pos + 17 : pos + 17 + total]):
            raise _Unmodelled
        defined.add((kind, table))
        pos += 17 + total
    return frozenset(defined)
