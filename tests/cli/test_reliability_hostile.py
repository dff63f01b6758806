"""A corpus of hostile files: nothing crashes, nothing is lost, every failure is named.

One real conversion (DirectRunner) of a folder whose own path holds glob metacharacters,
full of broken, disguised, oversized, animated, unreadable and oddly named files, read
back with TensorFlow. Every listed file must be either a record or a line of
failures.jsonl with a reason, and summary.json must say `listed == written + failed` per
split and per class. Then the same corpus with the default --max_failure_ratio: exit 3,
one line, failures.jsonl written, no dataset.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline import main
from tests.conftest import METADATA_FILES, write_image
from transforms.output.publish import MARKER_FILE

IMAGE_SUFFIXES = (b".jpg", b".jpeg", b".png", b".gif", b".bmp")


def _png_bytes(size=(12, 10), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 90).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg_bytes(size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise(size, 60).convert("RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _gif_bytes(frames: int = 1) -> bytes:
    buf = io.BytesIO()
    imgs = [Image.new("P", (16, 12), i * 40) for i in range(frames)]
    imgs[0].save(buf, format="GIF", save_all=frames > 1, append_images=imgs[1:], duration=50)
    return buf.getvalue()


def _png_chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def _png_with_bad_crc(kind: bytes) -> bytes:
    """A valid PNG with one more chunk of `kind` whose checksum is wrong."""
    data = _png_bytes()
    iend = data.rindex(b"IEND") - 4
    body = zlib.compress(b"\0" + b"\x10" * 36) if kind == b"IDAT" else b"Comment\0hello"
    extra = _png_chunk(kind, body, crc=0xDEADBEEF)
    if kind == b"IDAT":  # replace the image data with a corrupt copy
        start = data.index(b"IDAT") - 4
        return data[:start] + extra + data[iend:]
    return data[:iend] + extra + data[iend:]


def _png_bomb() -> bytes:
    """A valid little PNG whose header claims 100000 x 100000 pixels."""
    data = bytearray(_png_bytes((1, 1), "L"))
    data[16:24] = struct.pack(">II", 100_000, 100_000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _gif_bomb() -> bytes:
    data = bytearray(_gif_bytes())
    data[6:10] = struct.pack("<HH", 65535, 65535)  # logical screen
    return bytes(data)


def _jpeg_bomb() -> bytes:
    data = bytearray(_jpeg_bytes((8, 8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 65000, 65000)
    return bytes(data)


def _animated(fmt: str) -> bytes:
    buf = io.BytesIO()
    frames = [Image.new("RGB", (14, 9), (i * 60, 20, 200)) for i in range(3)]
    frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:], duration=40, loop=0)
    return buf.getvalue()


def build_corpus(root: Path) -> dict[bytes, str]:
    """Writes the hostile corpus under `root`.

    Returns:
      relative path (bytes) -> 'written', 'failed' or 'either' for the files whose fate
      the test pins down ('either': decided by the image checks, but never lost).
    """
    rng = random.Random(7)
    good, bad = root / "good", root / "bad 画像"
    fate: dict[bytes, str] = {}

    def put(rel: str | bytes, data: bytes, expect: str) -> None:
        path = os.path.join(os.fsencode(root), os.fsencode(rel))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        fate[os.fsencode(rel)] = expect

    for i in range(6):
        write_image(good / f"plain{i}.jpg", (20 + i, 16), seed=i)
        fate[f"good/plain{i}.jpg".encode()] = "written"
    # Names that break naive globbing, quoting, JSON or UTF-8 handling.
    for name in (
        "with space.png",
        "new\nline.png",
        "quote\"'`.png",
        "100%.png",
        "%2F%00.png",
        "ünï 画像.png",
        "[x]*?.png",
        "back\\slash.png",
        "tab\t.png",
        "-dash.png",
    ):
        put(f"good/{name}", _png_bytes(), "written")
    put("good/.hidden.png", _png_bytes(), "unlisted")  # hidden entries are not data (docs/input.md)
    put(b"good/caf\xe9 latin-1.png", _png_bytes(), "written")  # not UTF-8
    put("bad 画像/png_named.jpg", _png_bytes((9, 11)), "written")
    put("bad 画像/jpeg_named.gif", _jpeg_bytes(), "written")
    put("bad 画像/UPPER.JPG", _jpeg_bytes(), "written")
    put("bad 画像/dir.jpg/inside.png", _png_bytes(), "written")  # a folder named like an image
    # Broken or disguised content.
    put("bad 画像/zero.jpg", b"", "failed")
    put("bad 画像/truncated.jpg", _jpeg_bytes()[:300], "failed")
    put("bad 画像/truncated.png", _png_bytes((64, 64))[:60], "failed")
    put("bad 画像/truncated.gif", _gif_bytes()[:20], "failed")
    put(
        "bad 画像/cut_before_iend.png", _png_bytes((30, 20))[:-12], "failed"
    )  # Pillow decodes it, TF does not
    put("bad 画像/bad_idat_crc.png", _png_with_bad_crc(b"IDAT"), "failed")
    put("bad 画像/bad_text_crc.png", _png_with_bad_crc(b"tEXt"), "written")  # libpng ignores it too
    put("bad 画像/random.jpg", rng.randbytes(3000), "failed")
    put("bad 画像/random.png", b"\x89PNG\r\n\x1a\n" + rng.randbytes(500), "failed")
    put("bad 画像/random.gif", b"GIF89a" + rng.randbytes(200), "failed")
    put("bad 画像/page.jpg", b"<!doctype html><html><body>404 Not Found</body></html>", "failed")
    put("bad 画像/bomb.png", _png_bomb(), "failed")
    put("bad 画像/bomb.gif", _gif_bomb(), "failed")
    put("bad 画像/bomb.jpg", _jpeg_bomb(), "failed")
    put("bad 画像/animated.gif", _gif_bytes(frames=3), "either")
    put("bad 画像/animated.png", _animated("PNG"), "either")  # APNG
    put("bad 画像/animated_webp.gif", _animated("WEBP"), "either")
    # Files that cannot be read as files.
    os.mkfifo(bad / "fifo.jpg")  # reading it naively would hang forever
    fate["bad 画像/fifo.jpg".encode()] = "failed"
    os.symlink(root / "nowhere.png", bad / "broken.jpg")
    fate["bad 画像/broken.jpg".encode()] = "failed"
    os.symlink("loop.png", bad / "loop.png")
    fate["bad 画像/loop.png".encode()] = "failed"
    os.symlink(good / "plain0.jpg", bad / "link.jpg")
    fate["bad 画像/link.jpg".encode()] = "written"
    put("bad 画像/noperm.png", _png_bytes(), "written" if os.geteuid() == 0 else "failed")
    os.chmod(bad / "noperm.png", 0)  # root reads it anyway; anyone else must get a failure
    # Files without a usable class folder.
    put("orphan.jpg", _jpeg_bytes(), "failed")
    put(b"cl\xffass/x.png", _png_bytes(), "failed")  # class folder name not UTF-8
    put("two\nlines/x.png", _png_bytes(), "failed")  # would break labels.txt
    put("good/notes.txt", b"not listed", "unlisted")
    return fate


def _walk_listed(root: Path) -> set[bytes]:
    """Every file below `root` with an image suffix and no hidden (dot) name in its path,
    found independently of the code under test."""
    found = set()
    broot = os.fsencode(root)
    for dirpath, _, names in os.walk(broot):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), broot)
            if any(part.startswith(b".") for part in rel.split(b"/")):
                continue
            if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES:
                found.add(os.path.relpath(os.path.join(dirpath, name), broot))
    return found


def _read_back(out: Path, split: str) -> list[dict]:
    """Records of a split, file names kept as raw bytes; each image decoded by TensorFlow."""
    import tensorflow as tf

    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/class/text": tf.io.VarLenFeature(tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/channels": tf.io.FixedLenFeature([], tf.int64),
    }
    shards = sorted(str(p) for p in out.glob(f"{split}-*-of-*.tfrecord"))
    records = []
    for raw in tf.data.TFRecordDataset(shards):
        ex = tf.io.parse_single_example(raw, spec)
        shape = tuple(tf.io.decode_image(ex["image/encoded"], expand_animations=False).shape)
        records.append(
            {
                "filename": ex["image/filename"].numpy(),
                "class": tf.sparse.to_dense(ex["image/class/text"]).numpy()[0].decode("utf-8"),
                "shape_ok": shape
                == (int(ex["image/height"]), int(ex["image/width"]), int(ex["image/channels"])),
            }
        )
    return records


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, dict[bytes, str]]:
    root = tmp_path_factory.mktemp("hostile") / "in [1] *?{a,b}"
    root.mkdir()
    return root, build_corpus(root)


def test_hostile_corpus_nothing_lost(hostile, tmp_path):
    root, fate = hostile
    out = tmp_path / "out"
    args = ["--input", str(root), "--output_dir", str(out), "--quiet"]
    args += ["--splits", "train=0.5,validation=0.5", "--max_failure_ratio", "1"]
    summary = main.run(args, save_main_session=False)

    listed = _walk_listed(root)
    assert listed == {k for k, v in fate.items() if v != "unlisted"}
    assert summary["listed"] == len(listed)
    assert summary["written"] + summary["failed"] == summary["listed"]

    records = {s: _read_back(out, s) for s in ("train", "validation")}
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text("utf-8").splitlines()]
    written = [r["filename"] for rs in records.values() for r in rs]
    failed = [os.path.relpath(os.fsencode(f["path"]), os.fsencode(root)) for f in failures]
    # Every listed file exactly once: a record or a named failure with a reason.
    assert sorted(written + failed) == sorted(listed)
    assert all(f["reason"].strip() and "\n" not in f["reason"] for f in failures)
    assert all(r["shape_ok"] for rs in records.values() for r in rs)
    for rel, expect in fate.items():
        if expect == "written":
            assert rel in written, rel
        elif expect == "failed":
            assert rel in failed, rel
    reasons = {os.path.basename(os.fsencode(f["path"])): f["reason"] for f in failures}
    assert "not a regular file" in reasons[b"fifo.jpg"]
    assert "broken symbolic link" in reasons[b"broken.jpg"]
    assert "not valid UTF-8" in reasons[b"x.png"] or "control character" in reasons[b"x.png"]

    # listed == written + failed per split and per class, and each count is real.
    assert summary["failed"] == len(failures) and summary["written"] == len(written)
    for split, entry in summary["splits"].items():
        assert entry["listed"] == entry["written"] + entry["failed"]
        assert entry["written"] == len(records[split])
        assert entry["failed"] == sum(f["split"] == split for f in failures)
        for cls, counts in entry["classes"].items():
            assert counts["listed"] == counts["written"] + counts["failed"]
            assert counts["written"] == sum(r["class"] == cls for r in records[split])
            assert counts["failed"] == sum(f["split"] == split and f["class_key"] == cls for f in failures)
    unlabelled = sum(f["split"] is None for f in failures)
    assert unlabelled == 3 and summary["listed"] == sum(e["listed"] for e in summary["splits"].values()) + 3
    assert not (out / MARKER_FILE).exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tfrecord")) == METADATA_FILES


def test_too_many_failures_exit_3_after_writing_failures(hostile, tmp_path, capsys):
    root, fate = hostile
    out = tmp_path / "out"
    status = main.main(["convert", "--input", str(root), "--output_dir", str(out), "--quiet"])
    assert status == main.EXIT_TOO_MANY_FAILURES == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than --max_failure_ratio 0.01 allows" in err[0], err
    failures = (out / "failures.jsonl").read_text("utf-8").splitlines()
    assert len(failures) >= sum(v == "failed" for v in fate.values())
    # No dataset: nothing but the failures and the marker that says the run did not finish.
    assert sorted(p.name for p in out.iterdir()) == [MARKER_FILE, "failures.jsonl"]
