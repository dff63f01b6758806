"""The structural JPEG check (transforms/images/jpeg.py) against TensorFlow's own decoder.

Every verdict is compared with `tf.io.decode_image` on the same bytes: an accepted file
must decode to the checked shape, a rejected one must fail in TensorFlow.
"""

from __future__ import annotations

import io
import random

import pytest
import tensorflow as tf
from PIL import Image

from transforms.encoding.encoder import check_image
from transforms.images import jpeg
from transforms.images.jpeg import check_jpeg
from transforms.images.types import ImageError, ImageInfo

SOS = b"\xff\xda"


def _jpeg(mode: str = "RGB", size: tuple[int, int] = (64, 48), **options) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise(size, 40).convert(mode).save(buf, "JPEG", **options)
    return buf.getvalue()


def _tf_shape(data: bytes) -> tuple[int, ...] | None:
    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except tf.errors.InvalidArgumentError:
        return None


def _scan_middle(data: bytes) -> int:
    """An offset in the middle of the (first) entropy-coded segment, not after a 0xFF."""
    sos = data.index(SOS)
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    mid = (start + len(data)) // 2
    while data[mid - 1] == 0xFF:
        mid += 1
    return mid


VALID = {
    "baseline": lambda: _jpeg(),
    "progressive": lambda: _jpeg(progressive=True),
    "grey": lambda: _jpeg("L"),
    "grey progressive": lambda: _jpeg("L", progressive=True),
    "4:4:4": lambda: _jpeg(subsampling=0, quality=95),
    "optimized tables": lambda: _jpeg(optimize=True),
    "restart markers": lambda: _jpeg(restart_marker_blocks=4),
    "odd size": lambda: _jpeg(size=(17, 3)),
    "large": lambda: _jpeg(size=LARGE),
}


def test_large_scans_take_the_vectorised_search():
    data = VALID["large"]()
    sos = data.index(SOS)
    assert len(data) - (sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")) > jpeg._VECTOR_SEARCH


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_jpegs_are_accepted_with_tensorflows_shape(name):
    data = VALID[name]()
    layout = check_jpeg(data)
    assert layout is not None, "a plain Pillow JPEG must not need the slow path"
    assert (layout.height, layout.width, layout.channels) == _tf_shape(data)
    assert check_image(data).data == data  # kept as it is


# Large enough for the vectorised search of the scan data (jpeg._VECTOR_SEARCH); the
# small default size is searched with the regex.
LARGE = (400, 300)


def _damaged(size: tuple[int, int] = (64, 48)) -> dict[str, tuple[bytes, str | None]]:
    """name -> (bytes, expected verdict: 'accept', 'reject' or 'defer' to Pillow)."""
    base, prog = _jpeg(size=size), _jpeg(size=size, progressive=True)
    mid = _scan_middle(base)
    scans = [i for i in range(len(prog) - 1) if prog[i : i + 2] == SOS]
    no_dqt = bytearray(base[:2])
    pos = 2
    while base[pos : pos + 2] != SOS:
        length = int.from_bytes(base[pos + 2 : pos + 4], "big")
        if base[pos + 1] != 0xDB:
            no_dqt += base[pos : pos + 2 + length]
        pos += 2 + length
    return {
        # TensorFlow needs the end-of-image marker...
        "end marker missing": (base[:-2], "reject"),
        "cut in the middle of the scan": (base[:mid], "reject"),
        "cut inside a header segment": (base[:40], "reject"),
        # ...but stops reading there, and decodes a cut scan when the marker follows it.
        "cut, end marker appended": (base[:mid] + b"\xff\xd9", "accept"),
        "progressive, cut after two scans": (prog[: scans[2]] + b"\xff\xd9", "accept"),
        "garbage after the end": (base + bytes(range(256)), "accept"),
        # A marker libjpeg does not know stops it; known ones are skipped.
        "unknown marker in the scan": (base[:mid] + b"\xff\x34" + base[mid:], "reject"),
        "JPG marker in the scan": (base[:mid] + b"\xff\xc8" + base[mid:], "reject"),
        "second SOI": (base[:mid] + b"\xff\xd8" + base[mid:], "reject"),
        "comment in the scan": (base[:mid] + b"\xff\xfe\x00\x05abc" + base[mid:], "accept"),
        "restart marker in the scan": (base[:mid] + b"\xff\xd0" + base[mid:], "accept"),
        # Not modelled: Pillow decodes them, as before.
        "quantisation tables missing": (bytes(no_dqt) + base[pos:], "defer"),
        "CMYK": (_jpeg("CMYK"), "defer"),
    }


@pytest.mark.parametrize("size", [(64, 48), LARGE])
@pytest.mark.parametrize("name", sorted(_damaged()))
def test_damaged_jpegs_get_tensorflows_verdict(name, size):
    data, expected = _damaged(size)[name]
    try:
        verdict = "accept" if check_jpeg(data) else "defer"
    except ImageError:
        verdict = "reject"
    assert verdict == expected
    tf_shape = _tf_shape(data)
    if verdict == "accept":
        layout = check_jpeg(data)
        assert (layout.height, layout.width, layout.channels) == tf_shape
    elif verdict == "reject":
        assert tf_shape is None
        with pytest.raises(ImageError, match="does not decode as jpeg"):
            check_image(data)


def test_fuzzed_jpegs_accepted_by_the_check_always_decode_in_tensorflow():
    """Random byte edits, cuts and inserted markers on several JPEG kinds (fixed seed).

    No file the writer's check accepts may fail in TensorFlow or decode to another shape;
    rejections TensorFlow would have decoded (a cut file that still decodes) stay rare.
    """
    rng = random.Random(5)
    seeds = [make() for make in VALID.values()]
    accepted = needless = 0
    for _ in range(400):
        data = bytearray(rng.choice(seeds))
        kind = rng.random()
        if kind < 0.3:
            data = data[: rng.randrange(2, len(data))]
        elif kind < 0.6:
            data[rng.randrange(2, len(data)) : 0] = bytes((0xFF, rng.randrange(256)))
        else:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(2, len(data))] = rng.randrange(256)
        data = bytes(data)
        tf_shape = _tf_shape(data)
        try:
            prepared = check_image(data)
        except ImageError:
            needless += tf_shape is not None
            continue
        accepted += 1
        info = prepared.info
        if prepared.data != data:  # converted (e.g. to PNG): TensorFlow reads what is stored
            tf_shape = _tf_shape(prepared.data)
        assert (info.height, info.width, info.channels) == tf_shape, data.hex()
    assert accepted > 100  # the edits leave many files decodable: the test checks something
    assert needless <= 4


# --- headers remembered across files (jpeg._HeaderCache) ---------------------------------


def _verdict(data: bytes) -> object:
    """check_jpeg's answer as a comparable value: the layout, None, or the error's text."""
    try:
        return check_jpeg(data)
    except ImageError as e:
        return f"ImageError: {e}"


def _verdicts(files: list[bytes], warm: bytes | None, monkeypatch) -> list[object]:
    """Each file's verdict from a fresh header cache, after walking `warm` (if given) first."""
    results = []
    for data in files:
        monkeypatch.setattr(jpeg, "_HEADERS", jpeg._HeaderCache())
        if warm is not None:
            _verdict(warm)
        results.append(_verdict(data))
    return results


@pytest.mark.parametrize(
    "options",
    [{}, {"progressive": True}, {"mode": "L"}, {"restart_marker_blocks": 4}, {"subsampling": 0}],
    ids=["baseline", "progressive", "grey", "restarts", "4:4:4"],
)
def test_a_remembered_header_gives_the_verdict_of_a_full_walk(options, monkeypatch):
    warm = _jpeg(size=(64, 48), **options)
    size_at = warm.index(b"\xff\xc2" if options.get("progressive") else b"\xff\xc0") + 5
    # The same header but for the frame's size (height 30, width 40): walked on from the scan.
    sibling = warm[:size_at] + b"\x00\x1e\x00\x28" + warm[size_at + 4 :]
    monkeypatch.setattr(jpeg, "_HEADERS", jpeg._HeaderCache())
    check_jpeg(warm)
    assert jpeg._HEADERS.find(sibling) is not None
    layout = check_jpeg(sibling)
    assert (layout.height, layout.width) == (30, 40)
    if not options.get("progressive"):  # (Pillow optimises a progressive file's tables per image)
        other_size = _jpeg(size=(40, 30), **options)  # a real file of another size: same header
        assert jpeg._HEADERS.find(other_size) is not None
        assert check_jpeg(other_size) == _tf_shape_layout(other_size)
    # Damage anywhere (header, size bytes, scan data, end): the same verdict as a full walk.
    sos = sibling.index(SOS)
    rng = random.Random(19)
    damaged = [
        sibling[:size_at] + b"\x00\x00" + sibling[size_at + 2 :],  # height 0
        sibling[:size_at] + b"\xff\xff\xff\xff" + sibling[size_at + 4 :],  # 65535 x 65535
        sibling[: sos + 6],  # cut inside the scan header
        sibling[:-2],  # no end-of-image marker
        sibling[: _scan_middle(sibling)] + b"\xff\x34" + sibling[_scan_middle(sibling) :],
    ]
    for _ in range(300):
        data = bytearray(sibling)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(2, len(data))] = rng.choice((0x00, 0xFF, 0xD9, 0xDA, 0xC4, rng.randrange(256)))
        damaged.append(bytes(data))
    assert _verdicts(damaged, warm, monkeypatch) == _verdicts(damaged, None, monkeypatch)


def _tf_shape_layout(data: bytes) -> ImageInfo:
    height, width, channels = _tf_shape(data)
    return ImageInfo("jpeg", height, width, channels)


def test_the_header_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(jpeg, "_HEADERS", jpeg._HeaderCache())
    for quality in range(1, jpeg._HeaderCache.MAX + 20):  # a new header each (other tables)
        check_jpeg(_jpeg(size=(8, 8), quality=quality % 95 + 1, subsampling=quality // 95))
    assert len(jpeg._HEADERS._states) <= jpeg._HeaderCache.MAX


def test_long_headers_are_walked_not_remembered(monkeypatch):
    # A camera's EXIF or ICC segments: tens of KB of header, different in every file.
    monkeypatch.setattr(jpeg, "_HEADERS", jpeg._HeaderCache())
    plain = _jpeg(size=(40, 30))
    exif = plain[:2] + b"\xff\xe1\x27\x12" + bytes(10_000) + plain[2:]  # a 10 KB APP1 first
    assert check_jpeg(exif) == check_jpeg(plain) == _tf_shape_layout(plain)
    assert len(jpeg._HEADERS._states) == 1  # the plain file's header only
    assert jpeg._HEADERS.find(exif) is None
