"""Archives that are damaged, hostile or changing (issue 24): every record holds its own
member's bytes, every member is accounted for, memory and disk are bounded, names are stable."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import zlib
from pathlib import Path

from beam_pipeline import main
from tests.conftest import write_image
from transforms.images.read import ReadError, read_bytes
from transforms.listing.archives import ArchiveFile
from transforms.listing.beam_archives import index_archive
from transforms.listing.members import parse_address
from transforms.records import ImageFile

REPO = Path(__file__).resolve().parents[2]
CHANGED = "archive changed since it was listed"


def _tar_bytes(members: dict[str, bytes], mtime: int = 1, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _members(n: int) -> dict[str, bytes]:
    return {f"c{i % 3}/{i:03d}.jpg": f"member {i} ".encode() * (10 + i % 7) for i in range(n)}


def _listed(path: str, copies: str | None = None, size: int | None = None) -> list[ImageFile]:
    size = os.path.getsize(path) if size is None else size
    items = list(index_archive(ArchiveFile(path, "", size), (".jpg",), copies))
    assert all(isinstance(i, ImageFile) for i in items), items
    return items


def _reads_own_bytes_or_fails(listed: list[ImageFile], members: dict[str, bytes]) -> int:
    """Reads every listed member: each read gives that member's bytes or fails as changed.
    Returns how many failed."""
    changed = 0
    for f in listed:
        name = parse_address(f.path).member
        try:
            data = read_bytes(f.path)
        except ReadError as e:
            assert str(e).startswith(CHANGED), e
            changed += 1
        else:
            assert data == members[name], f"{name} read another member's bytes"
    return changed


def test_local_archive_rewritten_in_place_never_gives_another_members_bytes(tmp_path):
    members = _members(40)
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar_bytes(members))
    listed = _listed(str(archive))
    assert _reads_own_bytes_or_fails(listed, members) == 0
    # A re-download in another order, written over the file while the job runs.
    archive.write_bytes(_tar_bytes(dict(reversed(members.items()))))
    assert _reads_own_bytes_or_fails(listed, members) >= 35
    # The same layout, other bytes (a newer version of every image, same names and sizes).
    archive.write_bytes(_tar_bytes(members))
    listed = _listed(str(archive))
    newer = {k: v.upper() for k, v in members.items()}
    archive.write_bytes(_tar_bytes(newer, mtime=2))
    assert _reads_own_bytes_or_fails(listed, members) == len(members)


def test_gcs_archive_overwritten_is_read_at_the_listed_generation_or_fails(gcs_bucket, tmp_path):
    from tests.gcs_emulator import BUCKET

    members = _members(30)
    blob = gcs_bucket.blob("pin/a.tar")
    blob.upload_from_string(_tar_bytes(members))
    blob.reload()
    listed = _listed(f"gs://{BUCKET}/pin/a.tar", size=blob.size)
    assert _reads_own_bytes_or_fails(listed, members) == 0
    listed_generation = blob.generation
    blob.upload_from_string(_tar_bytes(dict(reversed(members.items()))))
    assert _reads_own_bytes_or_fails(listed, members) >= 25
    # Each read asks for the generation listed (the emulator ignores it; Cloud Storage
    # answers 404 for an overwritten one): the header check above is what the emulator shows.
    assert {parse_address(f.path).generation for f in listed} == {listed_generation}


def test_tar_gz_members_are_named_by_the_archive_not_the_temp_copy(tmp_path):
    members = _members(5)
    archive = tmp_path / "in.tar.gz"
    archive.write_bytes(gzip.compress(_tar_bytes(members), mtime=0))
    listed = _listed(str(archive), str(tmp_path / "out" / "beam-temp-img2tfrecord-run1" / "archives"))
    for f in listed:
        address = parse_address(f.path)
        assert address.archive == str(archive) and "beam-temp" in address.source
        assert read_bytes(f.path) == members[address.member]
    assert f.path.split("\0")[0] == f"{archive}#{address.member}@{address.offset}+{address.size}"


def _convert(args: list[str]) -> dict:
    return main.run(args + ["--quiet"], save_main_session=False)


def _jpegs(tmp_path: Path, n: int) -> dict[str, bytes]:
    return {
        f"cat/{i:02d}.jpg": write_image(
            tmp_path / "img" / f"{i}.jpg", (8 + i % 5, 8), seed=i, fmt="JPEG"
        ).read_bytes()
        for i in range(n)
    }


def _bomb(path: Path, inflated: int) -> None:
    """A .tar.gz of a few MB that inflates to `inflated` bytes (one member of zeros), in one
    deflate stream: 64 MiB of zeros deflated after a full flush are the same bytes each time."""
    head = tarfile.TarInfo("cat/huge.jpg")
    head.size = inflated
    zeros, crc = bytes(64 << 20), 0
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\0\0\0\0\0\x02\xff")  # a gzip header, no name, mtime 0
        f.write(deflate.compress(head.tobuf(tarfile.GNU_FORMAT)) + deflate.flush(zlib.Z_FULL_FLUSH))
        crc = zlib.crc32(head.tobuf(tarfile.GNU_FORMAT))
        block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
        for _ in range(inflated // len(zeros)):
            f.write(block)
            crc = zlib.crc32(zeros, crc)
        f.write(deflate.flush() + struct.pack("<II", crc, (inflated + 512) & 0xFFFFFFFF))


def test_damaged_and_hostile_archives_are_accounted_for_and_names_are_stable(tmp_path):
    images = _jpegs(tmp_path, 12)
    inp = tmp_path / "in"
    inp.mkdir()
    data = _tar_bytes(images)
    offsets = [parse_address(f.path).offset for f in _listed_bytes(tmp_path, data)]
    # A lone zero block between two members: GNU tar warns and reads on.
    at = offsets[6] - 512
    (inp / "lone.tar").write_bytes(data[:at] + bytes(512) + data[at:])
    # The header of member 6 zeroed: it is lost, the bytes skipped are named, the rest read.
    (inp / "zeroed.tar").write_bytes(data[:at] + bytes(512) + data[at + 512 :])
    # Two archives concatenated (`cat a.tar b.tar`): both read, as `tar -i` does.
    other = _tar_bytes({f"dog/{k}": v for k, v in list(images.items())[:3]})
    (inp / "cat.tar").write_bytes(data + other)
    # A gzip bomb next to them, and a .tar.gz whose member is not an image.
    _bomb(inp / "bomb.tar.gz", 1 << 30)
    bad = dict(list(images.items())[:2])
    bad["cat/bad.jpg"] = b"not a jpeg"
    (inp / "in.tar.gz").write_bytes(gzip.compress(_tar_bytes(bad), mtime=0))

    runs = []
    for run in ("o1", "o2"):
        out = tmp_path / run
        summary = _convert(["--input", str(inp), "--output_dir", str(out), "--max_failure_ratio", "0.5"])
        runs.append((summary, (out / "failures.jsonl").read_bytes()))
        assert not [p for p in out.iterdir() if p.name.startswith("beam-temp")]  # nothing left behind
    (summary, failures), (summary2, failures2) = runs
    assert failures == failures2 and summary == summary2  # reruns byte-identical
    assert summary["listed"] == summary["written"] + summary["failed"]
    reasons = {
        json.loads(line)["path"].replace(str(inp) + "/", ""): json.loads(line)["reason"]
        for line in failures.splitlines()
    }
    assert summary["written"] == 12 + 11 + 15 + 2, reasons
    assert reasons["zeroed.tar"].startswith(f"damaged tar header at byte {at + 512}: ")
    assert "bytes skipped to the next header" in reasons["zeroed.tar"]
    assert reasons["bomb.tar.gz"].startswith("gzip data inflates past ")
    (bad_name,) = [p for p in reasons if p.startswith("in.tar.gz#cat/bad.jpg@")]
    assert "beam-temp" not in bad_name and set(reasons) == {"zeroed.tar", "bomb.tar.gz", bad_name}


def _listed_bytes(tmp_path: Path, data: bytes) -> list[ImageFile]:
    path = tmp_path / "probe.tar"
    path.write_bytes(data)
    return _listed(str(path))


_BOUNDED = textwrap.dedent(
    """
    import os, resource, sys
    sys.path.insert(0, {repo!r})
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
    from transforms.listing.archives import ArchiveFile
    from transforms.listing.beam_archives import index_archive
    copies, *paths = sys.argv[1:]
    for path in paths:
        for item in index_archive(ArchiveFile(path, "", os.path.getsize(path)), (".jpg",), copies):
            print(type(item).__name__, getattr(item, "reason", ""))
    """
)


def _bounded_run(tmp_path: Path, archives: list[Path], cap: int) -> str:
    """What index_archive gives for `archives`, run in a process that may use `cap` bytes."""
    script = _BOUNDED.format(repo=str(REPO), cap=cap)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "copies"), *map(str, archives)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    return done.stdout


def test_gzip_bomb_is_inflated_in_bounded_memory_and_disk(tmp_path):
    archive = tmp_path / "bomb.tar.gz"
    _bomb(archive, 2 << 30)  # 2 MB compressed, 2 GiB inflated; the process may use 1 GiB
    out = _bounded_run(tmp_path, [archive], cap=1 << 30)
    assert out.startswith("Failure gzip data inflates past "), out
    assert not list((tmp_path / "copies").rglob("*.tar.gz"))  # the partial copy deleted


def test_extended_header_past_the_bound_fails_the_archive_in_bounded_memory(tmp_path):
    good = _tar_bytes({"a.jpg": b"abc"})[:1024]
    archives = []
    for kind in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.XGLTYPE):
        head = tarfile.TarInfo("x")
        head.type, head.size = kind, 3_000_000_000
        archives.append(tmp_path / f"hostile-{kind.decode()}.tar")
        archives[-1].write_bytes(good + head.tobuf(tarfile.GNU_FORMAT) + b"7" * 4096 + bytes(1024))
    out = _bounded_run(tmp_path, archives, cap=512 << 20).splitlines()
    assert (
        out
        == [
            "ImageFile ",
            "Failure an extended header declares 3000000000 bytes (more than the 1048576-byte bound) "
            "at byte 1024: the rest cannot be listed",
        ]
        * 3
    )
