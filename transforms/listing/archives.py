"""Tar archives as input: index an archive's members, and read one member by its offset.

In: a `.tar` (`.tar.gz`/`.tgz`: see transforms/listing/beam_archives.py), local or on any
Beam filesystem. Out of `index_tar`: one `Member` per image member (its name, its path if the
archive were unpacked where it lies, its data's offset and size, its header's digest) and one
`Problem` per thing that could not be listed (damage, a cut, a link named like an image). The
listing makes each Member an ImageFile whose `path` is the member's pinned address
(members.py), read with one positioned read (transforms/images/read.py). Nothing is ever
extracted; indexing holds one member at a time.

Nested tars (one level, as ImageNet's train set of 1,000 per-class tars) are indexed in place:
an inner `n01440764.tar` unpacks into the folder `n01440764/`, its members' offsets count from
the start of the outer file, and their address names both: `<archive>#<inner>.tar#<member>@<offset>+<size>`.

Member names are only names (`../x.jpg` never touches the filesystem). As tar does when it
extracts, a leading `/` and `./` are dropped from the path used for labels, so
`tar -C dir -cf a.tar .` labels like the folder `dir`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import tarfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from transforms.listing.members import BLOCK, header_digest, parse_address

# Archive suffixes, matched case-insensitively.
TAR_SUFFIXES = (".tar",)
GZIP_SUFFIXES = (".tar.gz", ".tgz")
ARCHIVE_SUFFIXES = TAR_SUFFIXES + GZIP_SUFFIXES


def archive_kind(path: str) -> str | None:
    """'tar' for a `.tar`, 'gzip' for a `.tar.gz`/`.tgz`, None for anything else."""
    lower = path.lower()
    return "tar" if lower.endswith(TAR_SUFFIXES) else "gzip" if lower.endswith(GZIP_SUFFIXES) else None


def unpacked_name(member: str) -> str:
    """A member's path as tar would extract it: without leading `/` and `./` parts."""
    return _LEADING.sub("", member)


_LEADING = re.compile(r"\A(?:\.?/)+")
_NESTED = re.compile(r"(?P<inner>.+?\.tar)#(?P<member>.*)", re.I | re.S)  # inner.tar#member


def nested_folder(inner: str) -> str:
    """The folder an inner tar unpacks into: its unpacked path without `.tar`."""
    return unpacked_name(inner)[: -len(".tar")]


def unpacked_member(member: str) -> str:
    """The unpacked path of an address's member part (`inner.tar#name` for a nested one)."""
    if nested := _NESTED.fullmatch(member):
        return f"{nested_folder(nested['inner'])}/{unpacked_name(nested['member'])}"
    return unpacked_name(member)


def source_name(path: str, relpath: str) -> str:
    """The name an image is written under (`image/filename`): its relpath for a plain file;
    for an archive member, the archive's path relative to the root, `#`, and the member's name
    (`train/images_000.tar#cat/1.jpg`), so two archives holding the same member stay two names."""
    address = parse_address(path)
    if address is None:
        return relpath
    unpacked = unpacked_member(address.member)
    folder = relpath[: len(relpath) - len(unpacked)] if relpath.endswith(unpacked) else ""
    return f"{folder}{posixpath.basename(address.archive)}#{address.member}"


@dataclasses.dataclass(frozen=True)
class Member:
    """An image member found by `index_tar`."""

    name: str  # in its archive (`inner.tar#name` inside a nested tar)
    relpath: str  # its path if the archive were unpacked where it lies
    offset: int  # where its data starts, in bytes from the start of the archive file
    size: int
    header: str = ""  # the digest of its own header, which a read checks (members.py)


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something in an archive that could not be listed as an image."""

    name: str  # the member's name (or `inner.tar#name`); '' for damage to the archive itself
    reason: str  # one line a person can act on


class _Window:
    """The `size` bytes at `start` of a file object (an inner tar), as index_tar reads a file."""

    def __init__(self, f: BinaryIO, start: int, size: int):
        self._f, self._start, self._size, self._pos = f, start, size, 0

    def seek(self, pos: int) -> None:
        self._pos = pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int) -> bytes:
        self._f.seek(self._start + self._pos)
        data = self._f.read(max(0, min(n, self._size - self._pos)))
        self._pos += len(data)
        return data


def _kind_of(info: tarfile.TarInfo) -> str:
    if info.issym() or info.islnk():
        return f"{'symbolic' if info.issym() else 'hard'} link to {info.linkname!r}"
    kinds = {"directory": info.isdir(), "fifo": info.isfifo(), "device": info.isdev()}  # in this order
    return next((kind for kind, match in kinds.items() if match), "special file")


def index_tar(
    f: BinaryIO,
    file_size: int,
    extensions: tuple[str, ...],
    *,
    folder: str = "",
    nested: bool = True,
    prefix: str = "",
    base: int = 0,
    on_skip: Callable[[str], None] | None = None,
) -> Iterator[Member | Problem]:
    """Every image member of the uncompressed tar open as `f` (seekable), in archive order.

    Reads only the headers, seeking over the data; holds one member at a time. Every member
    `tar -ti` lists is accounted for (docs/archives.md; tests/listing/test_tar_differential.py):
    zero blocks are skipped, a damaged header is a Problem saying how many bytes were skipped
    to the next valid header, a sparse member a Problem by name. Extended headers are bounded
    by MAX_EXTENDED bytes a member. Parsed here, not by tarfile: 4x faster, and tarfile reads
    any size an extended header declares.

    Args:
      f: the archive (or, for a nested tar, a window on it).
      file_size: bytes in `f`: a member whose data runs past it is reported as truncated.
      extensions: image suffixes (lowercase, with the dot).
      folder: prefix of every relpath ('' or ending in '/').
      nested: also index `.tar` members as nested tars (one level: an archive inside an inner
        tar is a Problem, one per archive, its members not listed).
      prefix: prefix of every member name (`inner.tar#` inside a nested tar).
      base: offset of `f`'s first byte in the archive file.
      on_skip: called with the name of each regular member that is neither an image nor a
        nested tar (listing/skips.py counts them).

    Yields:
      Member for each regular image member whose data is all there; Problem for each
      image-named member that is not a regular file, is sparse or is cut off, for an inner
      tar that cannot be indexed, for an archive nested deeper than one level, and for damage
      to the archive itself.
    """
    where = prefix.rstrip("#")
    pos, ended = 0, False  # ended: a zero block since the last member
    global_records: dict[bytes, bytes] = {}
    while True:
        f.seek(pos)
        block = f.read(BLOCK)
        if len(block) < BLOCK:
            if block:
                yield Problem(where, f"archive truncated inside a header at byte {base + pos}: {_REST}")
            elif pos == 0:
                yield Problem(where, "not a readable tar archive (empty file)")
            elif not ended:
                yield Problem(
                    where, f"archive truncated: no end-of-archive marker at byte {base + pos}: {_REST}"
                )
            return
        if not any(block):  # the end-of-archive marker, padding, or a lone zero block: read on
            pos, ended = pos + BLOCK, True
            continue
        try:
            info, end = _member(f, block, pos, global_records)
        except _Damaged as e:  # as GNU tar: "Skipping to next header"
            pos = _next_header(f, e.at + BLOCK, file_size)
            if pos is None:
                tail = f"the {file_size - e.at} bytes from there hold no further tar header and were not read"
                yield Problem(where, _NOT_TAR if e.at == 0 else f"{e.what} at byte {base + e.at}: {tail}")
                return
            skipped = f"{pos - e.at} bytes skipped to the next header at byte {base + pos}"
            yield Problem(where, f"{e.what} at byte {base + e.at}: {skipped}")
            continue
        except _Stop as e:
            yield Problem(where, f"{e} at byte {base + pos}: {_REST}")
            return
        pos, ended = end, False
        name, lower, start = prefix + info.name, info.name.lower(), base + info.offset_data
        wanted = posixpath.splitext(lower)[1] in extensions or lower.endswith(ARCHIVE_SUFFIXES)
        if info.offset_data + info.size > file_size:  # nothing after it can be listed
            cut = f"the member's {info.size} bytes start at byte {start} but the archive ends at byte {base + file_size}"
            yield Problem(name if wanted else where, f"archive truncated: {cut}")
            return
        if not wanted:
            if on_skip is not None and info.isreg():
                on_skip(name)
            continue
        if info.issparse():
            yield Problem(
                name, "a sparse member (tar --sparse) is not read: repack the archive without --sparse"
            )
        elif nested and info.isreg() and lower.endswith(TAR_SUFFIXES):
            window = _Window(f, info.offset_data, info.size)
            inner = f"{folder}{nested_folder(info.name)}/"
            yield from index_tar(
                window,
                info.size,
                extensions,
                folder=inner,
                nested=False,
                prefix=f"{name}#",
                base=start,
                on_skip=on_skip,
            )
        elif nested and info.isreg() and lower.endswith(GZIP_SUFFIXES):
            yield Problem(name, "a compressed tar inside an archive is not read (repack it as .tar)")
        elif info.isreg() and lower.endswith(ARCHIVE_SUFFIXES):  # inside an inner tar
            yield Problem(name, _TOO_DEEP)
        elif not info.isreg():
            yield Problem(name, f"not a regular file ({_kind_of(info)})")
        else:
            yield Member(name, folder + unpacked_name(info.name), start, info.size, info.chksum)


_REST = "the rest cannot be listed"
_TOO_DEEP = (
    "an archive inside a tar inside an archive is not read (nesting is one level): unpack the "
    "outer archive and convert its folder"
)
_NOT_TAR = "not a readable tar archive (invalid header)"
# The most bytes of extended header data (pax records, GNU long names) one member may have:
# a header declaring more fails the archive, in bounded memory, instead of being read.
MAX_EXTENDED = 1 << 20
_SCAN = 1 << 20  # bytes read at a time while looking for a header


class _Damaged(Exception):
    """A header that is not one, at `at`: the listing skips to the next valid header."""

    def __init__(self, at: int, what: str = "damaged tar header"):
        super().__init__(what)
        self.at, self.what = at, what


class _Stop(Exception):
    """Nothing more of the archive can be listed (the message says why)."""


def _next_header(f: BinaryIO, pos: int, file_size: int) -> int | None:
    """Where the first valid header at or after `pos` starts (block by block, as GNU tar
    looks for one after a damaged header), or None if there is none."""
    while pos < file_size:
        f.seek(pos)
        chunk = f.read(_SCAN)
        for at in range(0, len(chunk) - BLOCK + 1, BLOCK):
            block = chunk[at : at + BLOCK]
            if any(block) and _is_header(block):
                return pos + at
        if len(chunk) < _SCAN:
            return None
        pos += len(chunk)
    return None


def _member(
    f: BinaryIO, block: bytes, pos: int, global_records: dict[bytes, bytes]
) -> tuple[tarfile.TarInfo, int]:
    """(TarInfo, where the next member starts) of the member whose first header, `block`, is at
    `pos`, with its pax, GNU long-name and sparse headers. `info.chksum` is the digest of its
    own header (the block before its data); `info.sparse` is set for a sparse member. Global
    pax records are kept in `global_records` for the members after.

    Raises:
      _Damaged: a header is not one (bad checksum or fields).
      _Stop: an extended header declares more than MAX_EXTENDED bytes, or the file ends in one.
    """
    records: dict[bytes, bytes] = {}
    extended = 0  # bytes of extended headers read for this member
    while True:
        if not _is_header(block):
            raise _Damaged(pos)
        kind = block[156]
        if kind not in b"xgXLK":
            break
        size = _number(block[124:136])
        if size is None or size < 0:
            raise _Damaged(pos)
        extended += size
        if extended > MAX_EXTENDED:
            raise _Stop(f"an extended header declares {size} bytes (more than the {MAX_EXTENDED}-byte bound)")
        data = f.read(size)
        f.read(-size % BLOCK)
        if len(data) < size:
            raise _Stop("archive truncated inside an extended header")
        if kind in b"xXg":
            parsed = _pax_records(data)
            if parsed is None:
                raise _Damaged(pos, "damaged pax header")
            (global_records if kind == ord("g") else records).update(parsed)
            if len(global_records) > MAX_EXTENDED // 8:
                raise _Stop("too many global pax records")
        else:
            records[b"path" if kind == ord("L") else b"linkpath"] = data.split(b"\0", 1)[0]
        pos = f.tell()
        block = f.read(BLOCK)
        if len(block) < BLOCK:
            raise _Stop("archive truncated inside a header")
    info = _plain_header(block)
    if info is None:
        raise _Damaged(pos)
    info.chksum = header_digest(block)  # what pins the member (members.py), in place of the sum
    merged = {**global_records, **records}
    sparse = kind == ord("S") or any(key.startswith(b"GNU.sparse.") for key in merged)
    if kind == ord("S"):  # old GNU sparse: extension blocks of the sparse map follow the header
        more = block[482]
        while more:
            extension = f.read(BLOCK)
            if len(extension) < BLOCK:
                raise _Stop("archive truncated inside a header")
            more = extension[504]
    name = merged.get(b"GNU.sparse.name", merged.get(b"path"))
    if name is not None:
        info.name = name.decode("utf-8", "surrogateescape")
    if b"linkpath" in merged:
        info.linkname = merged[b"linkpath"].decode("utf-8", "surrogateescape")
    if b"size" in merged and (info.type in tarfile.REGULAR_TYPES or sparse):
        try:
            info.size = int(merged[b"size"])
        except ValueError:
            raise _Damaged(pos, "damaged pax header") from None
    if sparse:
        info.sparse = []
    info.offset_data = start = f.tell()
    return info, start + (info.size + BLOCK - 1) // BLOCK * BLOCK


def _is_header(block: bytes) -> bool:
    """True if the checksum stored in `block` is right: over unsigned or, as some old tars
    wrote it, signed bytes (GNU tar accepts both)."""
    stored = _number(block[148:156])
    return stored == sum(block) - sum(block[148:156]) + 256 or stored in tarfile.calc_chksums(block)


def _number(field: bytes) -> int | None:
    """A numeric header field: octal, or base-256 (GNU, for sizes of 8 GiB and more)."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.replace(b"\0", b" ").strip() or b"0", 8)
    except ValueError:
        return None


def _pax_records(data: bytes) -> dict[bytes, bytes] | None:
    """The `length key=value\n` records of a pax header, or None if malformed."""
    records, pos = {}, 0
    while pos < len(data) and data[pos]:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            return None
        record = data[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            return None
        key, _, value = record[:-1].partition(b"=")
        records[key] = value
        pos += length
    return records


_NO_DATA = frozenset(b"123456")  # links, devices, folders, FIFOs: no data, whatever the size says


def _plain_header(block: bytes) -> tarfile.TarInfo | None:
    """The TarInfo of a member's own header, or None if a field is not a number.

    Decodes and names as tarfile does on POSIX (UTF-8 with surrogates; a regular file `x/` is
    a folder, a folder's trailing slashes dropped, a ustar prefix joined). Other type flags
    (GNU sparse, volume labels, vendor types) keep their flag, their data skipped by its size,
    as GNU tar does.
    """
    kind = block[156]
    size = _number(block[124:136])
    if size is None or size < 0:
        return None
    name = block[:100].split(b"\0", 1)[0]
    start = block[345:500].split(b"\0", 1)[0] if kind != ord("S") else b""  # ustar's prefix
    info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
    info.size = size
    info.type = bytes((kind,)) if kind else tarfile.REGTYPE
    info.linkname = block[157:257].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if info.type == tarfile.AREGTYPE and info.name.endswith("/"):
        info.type = tarfile.DIRTYPE
    if info.isdir():
        info.name = info.name.rstrip("/")
    if start:
        info.name = start.decode("utf-8", "surrogateescape") + "/" + info.name
    if kind in _NO_DATA:
        info.size = 0  # links, folders, devices: no data follows, whatever the field says
    return info


@dataclasses.dataclass(frozen=True)
class ArchiveFile:
    """An archive found by the listing, waiting to be indexed."""

    path: str  # local or gs://
    folder: str  # the relpath of its folder ('' or ending in '/'): its members' relpaths start with it
    size: int
