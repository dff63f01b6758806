"""IndexArchives: ArchiveFiles found by the listing -> FileBatches of their image members.

The archives are reshuffled over the workers; one DoFn call indexes one archive by reading its
headers (archives.py), and its members leave as ImageFiles whose path is the member's pinned
address (members.py). Tagged FAILED: a Failure (stage 'list') per image member that is not a
regular file or is cut off, and per damaged archive: nothing is lost without a name.

A `.tar.gz`/`.tgz` has no random access: it is decompressed once, streaming, into a copy in
the run's temp folder (`<temp>/archives/<hash>/<name>`, deleted with it), bounded (a gzip
bomb fails by name, its partial copy deleted); its members are named by
the `.tar.gz` and carry the copy in their pin. A gs:// archive is indexed at one generation.

Bounds: each element is one archive (a path, never its contents); a DoFn holds one member's
header and one FileBatch at a time, whatever the archive's size.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import posixpath
import re
import shutil
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from transforms import gcs
from transforms.batching import chunked
from transforms.failures import FAILED, Failure
from transforms.listing.archives import ArchiveFile, Member, archive_kind, index_tar
from transforms.listing.beam_walk import SKIPPED, _ListFn
from transforms.listing.local import archive_in
from transforms.listing.members import pinned_address
from transforms.listing.webdataset import SIDECAR_EXTENSIONS, SampleLabel, label_samples
from transforms.paths import IMAGE_EXTENSIONS
from transforms.records import FileBatch, ImageFile
from transforms.retry import DEFAULT_RETRY, describe

LIST_STAGE = "list"
# Tagged output of IndexArchives with --labels webdataset: tuples of SampleLabel.
SAMPLE_LABELS = "sample_labels"
# Tagged output of IndexArchives: the kind of each thing ignored in an archive read whole (str).
WARNINGS = "warnings"
_COPY_CHUNK = 1 << 20


def archive_copies_dir(temp_dir: str) -> str:
    """Where a run decompresses its `.tar.gz` archives: inside its temp folder."""
    return FileSystems.join(temp_dir, "archives")


def copy_path(copies_dir: str, archive: str) -> str:
    """Where the uncompressed copy of a `.tar.gz` goes: named like it, in a folder of its own."""
    digest = hashlib.sha256(archive.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return FileSystems.join(copies_dir, digest, archive.rstrip("/").rsplit("/", 1)[-1])


def _open(path: str) -> BinaryIO:
    """The archive open for reading. A local one must be a regular file: a FIFO named `x.tar`
    is refused, never waited on (opened non-blocking, checked on the descriptor). A gs://
    one is read at one generation (`_pinned`)."""
    if path.startswith("gs://"):
        return _pinned(path)[0]
    if "://" in path:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return os.fdopen(fd, "rb")


def _pinned(path: str) -> tuple[BinaryIO, int, int]:
    """(reader, generation, size) of gs:// object `path`: every read of the reader asks for the
    generation the object had when it was looked up, so an object overwritten meanwhile is
    never read half old, half new. One request per attempt of the one retry policy."""
    size, generation = gcs.call(lambda: gcs.stat(path), path)
    reader = gcs.blob(path, generation).open(
        "rb", chunk_size=gcs.CHUNK, raw_download=True, retry=DEFAULT_RETRY.as_api_retry()
    )
    return reader, int(generation), size


# A `.tar.gz` may inflate to at most MAX_INFLATION times its compressed size plus
# INFLATE_SLACK (images barely compress: an archive of images inflates ~1x, a gzip bomb
# ~1000x), and, in a local temp folder, to no more than its free space less FREE_RESERVE.
MAX_INFLATION = 100
INFLATE_SLACK = 64 << 20
FREE_RESERVE = 1 << 30


class _TooLarge(Exception):
    """The uncompressed copy would pass its bound (the message says which)."""


def decompress_copy(archive: ArchiveFile, copy: str) -> tuple[int, str | None, tuple[str, str] | None]:
    """Decompresses the gzip file `archive` into `copy`, streaming. Returns (bytes, damage, tail).

    `damage` is None, or why the gzip data ended early; everything decompressed before that
    point is in the copy (so the members before it can still be read). `tail` is None, or
    (ZERO_PADDING or TRAILING_DATA, a line naming the byte): what followed the last gzip member
    and was ignored, as `gzip -d` (and GNU tar through it) ignores it: zero padding (tape and
    upload tools add it) or other trailing data. Memory is bounded:
    each call to zlib inflates at most _COPY_CHUNK bytes, and at most one chunk is held. So is
    the copy (MAX_INFLATION): past the bound the copy is deleted and _TooLarge raised; on any
    other error too.
    """
    limit = MAX_INFLATION * archive.size + INFLATE_SLACK
    why = f"{MAX_INFLATION}x its compressed size + {INFLATE_SLACK >> 20} MiB"
    if "://" not in copy:
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        free = shutil.disk_usage(os.path.dirname(copy)).free - FREE_RESERVE
        if free < limit:
            limit, why = max(0, free), "the free space of the temp folder less 1 GiB"
    bomb = f"gzip data inflates past {limit} bytes ({why}): not read (a gzip bomb?)"
    try:
        with _open(archive.path) as src, gcs.create(copy) as dst:
            return _inflate(src, dst, limit, bomb)
    except BaseException:
        _remove(copy)
        raise


GZIP_MAGIC = b"\x1f\x8b"
# What summary.json counts (under "warnings") for the data after a .tar.gz's last gzip member.
ZERO_PADDING = "zero padding after the gzip data of a .tar.gz ignored"
TRAILING_DATA = "trailing data after the gzip data of a .tar.gz ignored"


def _inflate(
    src: BinaryIO, dst: BinaryIO, limit: int, bomb: str
) -> tuple[int, str | None, tuple[str, str] | None]:
    """decompress_copy's loop: gzip members one after another (concatenated gzip), then what
    follows the last: nothing, zero bytes to the end (padding) or anything else (ignored from
    there, as gzip -d: "decompression OK, trailing garbage ignored")."""
    written, read, buffer, at_end = 0, 0, b"", False
    unzip, started, member_end, zeros = zlib.decompressobj(wbits=31), False, None, 0

    def fill() -> None:
        nonlocal buffer, read, at_end
        chunk = src.read(_COPY_CHUNK)
        buffer, read, at_end = buffer + chunk, read + len(chunk), not chunk

    try:
        while True:
            if member_end is None:  # inside a member
                if not buffer:
                    if at_end:
                        cut = f"gzip data cut short after {written} uncompressed bytes"
                        return written, cut if started else None, None
                    fill()
                    continue
                started, data = True, unzip.decompress(buffer, _COPY_CHUNK)
                written += len(data)
                if written > limit:
                    raise _TooLarge(bomb)
                dst.write(data)
                if unzip.eof:  # a member ended: another may follow
                    buffer = unzip.unused_data
                    member_end = read - len(buffer)
                else:
                    buffer = unzip.unconsumed_tail
                continue
            kept = buffer.lstrip(b"\0")
            zeros, buffer = zeros + len(buffer) - len(kept), kept
            if not buffer and at_end:
                tail = (
                    f"{zeros} zero bytes after the gzip data (at byte {member_end}) ignored, as gzip -d does"
                )
                return written, None, (ZERO_PADDING, tail) if zeros else None
            if not buffer or (not zeros and len(buffer) < len(GZIP_MAGIC) and not at_end):
                fill()
                continue
            if not zeros and at_end and len(buffer) < len(GZIP_MAGIC):  # gzip -d: "unexpected end of file"
                return written, f"gzip data cut short after {written} uncompressed bytes", None
            if zeros or not buffer.startswith(GZIP_MAGIC):
                tail = f"trailing data after the gzip data (at byte {member_end}) ignored, as gzip -d does"
                return written, None, (TRAILING_DATA, tail)
            unzip, started, member_end = zlib.decompressobj(wbits=31), False, None
    except zlib.error as e:
        return written, f"gzip data damaged after {written} uncompressed bytes ({e})", None


def _remove(path: str) -> None:
    """Deletes `path` if it is there (a copy that will not be read; else it goes with the temp folder)."""
    if path.startswith(gcs.GCS_SCHEME):
        gcs.delete_batch([path])
    elif os.path.exists(path):
        os.remove(path)


@dataclasses.dataclass(frozen=True)
class Notice:
    """Something of an archive that was ignored while it was read whole (index_archive)."""

    path: str
    kind: str  # counted in summary.json's "warnings" (ZERO_PADDING, TRAILING_DATA)
    detail: str  # one line, for the log


def index_archive(
    archive: ArchiveFile,
    extensions: tuple[str, ...],
    copies_dir: str | None,
    webdataset: bool = False,
    on_skip: Callable[[str], None] | None = None,
) -> Iterator[ImageFile | Failure | SampleLabel | Notice]:
    """The image members of `archive` as ImageFiles (path = the member's pinned address),
    Failures, and a Notice for what was ignored (data after a `.tar.gz`'s gzip stream);
    `on_skip` is called with the name of each other regular member (index_tar).

    A `.tar.gz` is first decompressed into `copies_dir` (see the module docstring); its
    members are still named by the `.tar.gz`'s path, the copy rides in their pin. With
    `webdataset`, also a SampleLabel for each image whose sample has a label sidecar.
    """
    path, size, damage, read_from, generation = archive.path, archive.size, None, None, None
    try:
        if archive_kind(path) == "gzip":
            if copies_dir is None:
                yield Failure(path, "a .tar.gz needs the run's temp folder to be read", LIST_STAGE)
                return
            read_from = copy_path(copies_dir, path)
            size, damage, tail = decompress_copy(archive, read_from)
            if tail is not None:
                yield Notice(path, *tail)
            f = _open(read_from)
        elif path.startswith("gs://"):
            f, generation, size = _pinned(path)
        else:
            f = _open(path)
        with f:
            if webdataset:

                def read(member: Member) -> bytes:
                    f.seek(member.offset)
                    return f.read(member.size)

                wanted = extensions + SIDECAR_EXTENSIONS
                found = index_tar(f, size, wanted, folder=archive.folder, on_skip=on_skip)
                items = label_samples(found, read, extensions)
            else:
                items = index_tar(f, size, extensions, folder=archive.folder, on_skip=on_skip)
            for item in items:
                if isinstance(item, Member):
                    address = pinned_address(
                        path, item.name, item.offset, item.size, item.header, generation, read_from
                    )
                    yield ImageFile(path=address, relpath=item.relpath, size=item.size)
                elif isinstance(item, SampleLabel):
                    yield dataclasses.replace(item, source=f"{path}#{item.source}")
                else:
                    yield Failure(f"{path}#{item.name}" if item.name else path, item.reason, LIST_STAGE)
    except _TooLarge as e:
        yield Failure(path, str(e), LIST_STAGE)
    except gcs.ERRORS as e:  # the archive itself could not be opened or read (OSError locally)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the copy's disk is full: the run's fault, not the archive's (exit 2)
        yield Failure(path, f"cannot read the archive ({describe(e)})", LIST_STAGE)
    if damage:
        yield Failure(path, damage, LIST_STAGE)


class IndexArchivesFn(_ListFn):
    """ArchiveFile -> FileBatches of its image members; FAILED for what cannot be listed;
    SAMPLE_LABELS (with `webdataset`): tuples of SampleLabel, up to BATCH_SIZE; SKIPPED: the
    counts of its other members (skips.py); WARNINGS: the kind of each Notice (str; logged as a
    warning with its archive).

    Images and failures count as listed (a Failure here is an input that was found but
    cannot be written).
    """

    def __init__(self, copies_dir: str | None, progress_key: str | None, webdataset: bool):
        super().__init__(progress_key)
        self._copies_dir, self._webdataset = copies_dir, webdataset
        self._archives = Metrics.counter(self.__class__, "archives_indexed")

    def process(self, archive: ArchiveFile) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        self._archives.inc()
        items = index_archive(archive, IMAGE_EXTENSIONS, self._copies_dir, self._webdataset, self.skips.other)
        for chunk in chunked(items):
            files = tuple(x for x in chunk if isinstance(x, ImageFile))
            labels = tuple(x for x in chunk if isinstance(x, SampleLabel))
            for failure in (x for x in chunk if isinstance(x, Failure)):
                self.count(1)  # one listed input, as an image would be
                yield pvalue.TaggedOutput(FAILED, failure)
            for notice in (x for x in chunk if isinstance(x, Notice)):
                logging.warning("img2tfrecord: %s: %s", notice.path, notice.detail)
                yield pvalue.TaggedOutput(WARNINGS, notice.kind)
            if labels:
                yield pvalue.TaggedOutput(SAMPLE_LABELS, labels)
            if files:
                yield self.counted(FileBatch(files))


def match_archives(_: bytes, pattern: str) -> Iterator[ArchiveFile]:
    """(an impulse) -> ArchiveFile for each archive matching `pattern` (local or remote glob),
    relative to the folder before its first wildcard. Holds the match's metadata (one entry
    per archive: hundreds, not the images) to sort it."""
    base = posixpath.dirname(re.split(r"[*?[]", pattern, maxsplit=1)[0])
    for meta in sorted(FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path):
        if archive_kind(meta.path) is not None:
            yield archive_in(meta.path, base, meta.size_in_bytes)


@beam.ptransform_fn
def IndexArchives(
    archives: beam.PCollection[ArchiveFile],
    copies_dir: str | None,
    progress_key: str | None,
    webdataset: bool,
) -> pvalue.DoOutputsTuple:
    """ArchiveFiles -> `.files` (FileBatch of members), FAILED (Failure), SAMPLE_LABELS
    (tuples of SampleLabel, with `webdataset`), SKIPPED (counts) and WARNINGS (str), indexed on workers.

    The Reshuffle's groups are keyed at random: each holds a few ArchiveFiles (path, folder,
    size), never an archive's members.
    """
    fn = IndexArchivesFn(copies_dir, progress_key, webdataset)
    return (
        archives
        | "Spread" >> beam.Reshuffle()  # one archive per element: spread over the workers
        | "Index"
        >> beam.ParDo(fn)
        .with_output_types(FileBatch)
        .with_outputs(FAILED, SAMPLE_LABELS, SKIPPED, WARNINGS, main="files")
    )
