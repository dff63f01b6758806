"""Archives as GNU tar reads them: what follows a .tar.gz's gzip data, and tars nested too deep.

- Zero padding after the last gzip member (tape and upload tools add it) and other trailing
  data are ignored, as `gzip -d` (and `tar -z` through it) ignores them: the bytes
  decompressed are gzip's own (checked against `gzip -dc`), every image is written, and
  summary.json counts the warning. Before: the whole archive failed as "gzip data damaged".
- A tar inside an inner tar (deeper than the one supported level) is one failure line per
  archive not read, so listed == written + failed still names everything. Before: dropped
  without a word.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from transforms.listing.archives import ArchiveFile
from transforms.listing.beam_archives import TRAILING_DATA, ZERO_PADDING, decompress_copy


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _image(tmp_path: Path, name: str, seed: int) -> bytes:
    return write_image(tmp_path / "src" / name, (10, 8), seed=seed).read_bytes()


TAR = _tar_bytes({f"cat/{i}.txt": bytes([i]) * 3000 for i in range(4)})
PART1, PART2 = gzip.compress(TAR[:5120]), gzip.compress(TAR[5120:])
CASES = {
    "plain": (gzip.compress(TAR), None),
    "zero padding": (gzip.compress(TAR) + b"\0" * 10240, ZERO_PADDING),  # padded to a 10 KiB block
    "trailing garbage": (gzip.compress(TAR) + b"GARBAGE\n" * 100, TRAILING_DATA),
    "zeros then garbage": (gzip.compress(TAR) + b"\0" * 700 + b"junk", TRAILING_DATA),
    "two members, then zeros": (PART1 + PART2 + b"\0" * 3, ZERO_PADDING),
    "two stray bytes": (gzip.compress(TAR) + b"\x1e\x1e", TRAILING_DATA),
    "one zero byte": (gzip.compress(TAR) + b"\0", ZERO_PADDING),
}


@pytest.mark.skipif(shutil.which("gzip") is None, reason="GNU gzip is not installed")
@pytest.mark.parametrize("case", sorted(CASES))
def test_gzip_tails_decompress_as_gzip_d_does(case, tmp_path):
    data, warning = CASES[case]
    path = tmp_path / "a.tar.gz"
    path.write_bytes(data)
    gzip_d = subprocess.run(["gzip", "-dc", str(path)], capture_output=True)
    assert gzip_d.returncode in (0, 2), gzip_d.stderr  # 2: a warning ("trailing garbage ignored")
    size, damage, tail = decompress_copy(
        ArchiveFile(str(path), "", len(data)), str(tmp_path / "copy" / "a.tar")
    )
    assert (tmp_path / "copy" / "a.tar").read_bytes() == gzip_d.stdout == TAR
    assert size == len(TAR) and damage is None
    assert (tail[0] if tail else None) == warning
    if warning:
        assert "ignored, as gzip -d does" in tail[1]


@pytest.mark.skipif(shutil.which("gzip") is None, reason="GNU gzip is not installed")
@pytest.mark.parametrize(
    "tail, damage",
    [
        (PART2[:10] + b"\xff" * 40, "gzip data damaged after 5120"),
        (b"\x1f", "gzip data cut short after 5120"),
    ],
    ids=["a damaged member", "a member cut in its magic"],
)
def test_damage_after_a_member_is_still_damage(tail, damage, tmp_path):
    """What gzip -d fails after a good member: a second member's data, one byte ("unexpected
    end of file": gzip needs two to tell a member's magic from trailing data)."""
    data = PART1 + tail
    path = tmp_path / "a.tar.gz"
    path.write_bytes(data)
    assert subprocess.run(["gzip", "-t", str(path)], capture_output=True).returncode == 1
    size, found, tail = decompress_copy(ArchiveFile(str(path), "", len(data)), str(tmp_path / "a.tar"))
    assert found.startswith(damage) and tail is None


def test_padded_and_trailing_archives_are_converted_whole_with_a_counted_warning(tmp_path, caplog):
    inputs = tmp_path / "in"
    images = {f"cat/{i}.png": _image(tmp_path, f"{i}.png", i) for i in range(3)}
    images |= {f"dog/{i}.png": _image(tmp_path, f"d{i}.png", 10 + i) for i in range(3)}
    tar = _tar_bytes(images)
    inputs.mkdir()
    (inputs / "padded.tar.gz").write_bytes(gzip.compress(tar) + b"\0" * 4096)
    (inputs / "trailing.tgz").write_bytes(gzip.compress(tar) + b"uploaded by a tool that appends a signature")
    summary = main.run(["--input", str(inputs), "--output_dir", str(tmp_path / "out"), "--quiet"], False)
    assert (summary["listed"], summary["written"], summary["failed"]) == (12, 12, 0)
    assert summary["warnings"] == {TRAILING_DATA: 1, ZERO_PADDING: 1}
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        f"img2tfrecord: {inputs / 'trailing.tgz'}: trailing data after the gzip data (at byte" in warned[-1]
    )


def test_tars_nested_deeper_than_one_level_are_one_failure_each(tmp_path):
    deep = _tar_bytes({"x.png": _image(tmp_path, "x.png", 1), "y.png": _image(tmp_path, "y.png", 2)})
    inner = _tar_bytes(
        {
            "cat/a.png": _image(tmp_path, "a.png", 3),
            "cat/deep.tar": deep,
            "cat/deeper.tar.gz": gzip.compress(deep),
        }
    )
    outer = _tar_bytes({"dog/b.png": _image(tmp_path, "b.png", 4), "inner.tar": inner, "README": b"hi"})
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "outer.tar").write_bytes(outer)
    out = tmp_path / "out"
    args = [
        "--input",
        str(tmp_path / "in"),
        "--output_dir",
        str(out),
        "--max_failure_ratio",
        "0.5",
        "--quiet",
    ]
    summary = main.run(args, False)
    assert (summary["listed"], summary["written"], summary["failed"]) == (4, 2, 2)
    lines = (out / "failures.jsonl").read_text().splitlines()
    failed = sorted(line.split('"path": ')[1].split('"')[1] for line in lines)
    outer_path = os.path.join(tmp_path, "in", "outer.tar")
    assert failed == [f"{outer_path}#inner.tar#cat/deep.tar", f"{outer_path}#inner.tar#cat/deeper.tar.gz"]
    assert all(
        "an archive inside a tar inside an archive is not read (nesting is one level)" in x for x in lines
    )
