"""The listing against GNU tar (issue 24): on archives made by Python's tarfile and by
`tar --sparse`, and on the same archives damaged byte by byte, every member `tar -ti`
lists is a Member or a named Problem here, and every Member's bytes are what `tar -xO`
extracts (like the fuzzing of the image checks: seeded, reproducible)."""

from __future__ import annotations

import hashlib
import io
import random
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from transforms.images.read import read_bytes
from transforms.listing.archives import Member, Problem, index_tar
from transforms.listing.members import pinned_address

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")

_PRINTABLE = re.compile(r"[ -~]*")


def _gnu_list(path: Path) -> list[str]:
    """The image names `tar -ti` lists (it reads on past zero blocks and damaged headers)."""
    done = subprocess.run(
        ["tar", "-tif", str(path), "--quoting-style=literal"], capture_output=True, check=False
    )
    names = done.stdout.decode("utf-8", "surrogateescape").splitlines()
    return [n for n in names if n.lower().endswith(".jpg")]


def _gnu_bytes(path: Path, name: str) -> bytes:
    return subprocess.run(["tar", "-xiOf", str(path), name], capture_output=True, check=False).stdout


def _ours(path: Path) -> tuple[list[Member], list[str]]:
    data = path.read_bytes()
    items = list(index_tar(io.BytesIO(data), len(data), (".jpg",)))
    members = [i for i in items if isinstance(i, Member)]
    named = [i.name for i in items if isinstance(i, Member) or (isinstance(i, Problem) and i.name)]
    return members, named


def _agree(path: Path) -> list[Member]:
    """Asserts the listing agrees with GNU tar's on `path`; returns the Members."""
    members, named = _ours(path)
    gnu = _gnu_list(path)
    if all(_PRINTABLE.fullmatch(n) for n in named + gnu):  # tar quotes the others its own way
        assert named == gnu, path.name
    once = {n for n in gnu if gnu.count(n) == 1}
    whole_blocks = path.stat().st_size // 512 * 512  # GNU tar drops a last partial block
    for m in members:
        if m.name in once and m.offset + m.size <= whole_blocks:
            address = pinned_address(str(path), m.name, m.offset, m.size, m.header)
            assert (
                hashlib.sha256(read_bytes(address)).digest()
                == hashlib.sha256(_gnu_bytes(path, m.name)).digest()
            )
    return members


def _base_archive(fmt: int, seed: int) -> bytes:
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for i in range(14):
            name = f"c{i % 3}/" + ("a-folder/" * rng.randrange(0, 17)) + f"{i}.jpg"
            info = tarfile.TarInfo(name)
            data = rng.randbytes(rng.randrange(0, 3000))
            info.size, info.mtime = len(data), 1_700_000_000 + i
            if i == 5:
                info.type, info.linkname, info.size, data = tarfile.SYMTYPE, "c0/0.jpg", 0, b""
            if i == 9:
                t.addfile(tarfile.TarInfo("c1/notes.txt"), io.BytesIO())
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_agrees_with_gnu_tar_on_whole_and_concatenated_archives(tmp_path, fmt):
    data = _base_archive(fmt, 1)
    whole = tmp_path / "whole.tar"
    whole.write_bytes(data)
    assert len(_agree(whole)) == 13
    both = tmp_path / "both.tar"  # `cat a.tar b.tar`: tar -i reads both, and so does the listing
    both.write_bytes(data + _base_archive(fmt, 2))
    assert len(_agree(both)) == 26


def _damaged(data: bytes, rng: random.Random) -> bytes:
    """`data` damaged one way: a block zeroed, overwritten with noise, a zero block inserted,
    a few bytes flipped, or the end cut off."""
    blocks = len(data) // 512
    at = rng.randrange(blocks - 2) * 512
    kind = rng.randrange(5)
    if kind == 0:
        return data[:at] + bytes(512) + data[at + 512 :]
    if kind == 1:
        return data[:at] + rng.randbytes(512) + data[at + 512 :]
    if kind == 2:
        return data[:at] + bytes(512) + data[at:]
    if kind == 3:
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            damaged[at + rng.randrange(512)] ^= 1 << rng.randrange(8)
        return bytes(damaged)
    return data[: at + rng.randrange(512)]


@pytest.mark.parametrize("seed", range(100))
def test_agrees_with_gnu_tar_on_damaged_archives(tmp_path, seed):
    rng = random.Random(seed)
    fmt = (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)[seed % 3]
    path = tmp_path / "damaged.tar"
    path.write_bytes(_damaged(_base_archive(fmt, seed), rng))
    _agree(path)


@pytest.mark.parametrize(
    "options",
    [["--format=gnu"], *(["--format=posix", f"--sparse-version={v}"] for v in ("0.0", "0.1", "1.0"))],
    ids=["gnu", "pax-0.0", "pax-0.1", "pax-1.0"],
)
def test_sparse_members_fail_by_name_and_the_members_after_them_are_listed(tmp_path, options):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"first" * 300)
    with open(src / "s.jpg", "wb") as f:  # holes between three runs of data
        for at in (0, 1 << 20, 3 << 20):
            f.seek(at)
            f.write(b"x" * 5000)
    (src / "z.jpg").write_bytes(b"last" * 300)
    path = tmp_path / "sparse.tar"
    subprocess.run(
        ["tar", "-cf", str(path), "--sparse", *options, "-C", str(src), "a.jpg", "s.jpg", "z.jpg"], check=True
    )
    data = path.read_bytes()
    items = list(index_tar(io.BytesIO(data), len(data), (".jpg",)))
    assert [(type(i).__name__, i.name) for i in items] == [
        ("Member", "a.jpg"),
        ("Problem", "s.jpg"),
        ("Member", "z.jpg"),
    ]
    assert items[1].reason.startswith("a sparse member (tar --sparse) is not read")
    _agree(path)
