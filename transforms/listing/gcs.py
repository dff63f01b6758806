"""ListGcsImages: the gs:// branch of ListImages, the listing spread over workers by prefix.

In: a `gs://bucket[/prefix]` root. Out: FileBatches of every object below it with an image
extension, each exactly once: the same set of files as one `MatchFiles(root/**)`, whose one
worker pages through every object name in turn.

Here the first levels are listed with the list API's `delimiter="/"`, which returns the
objects directly at a level and the "folders" (prefixes) below it; the prefixes, not the
objects, cross a Reshuffle, so each worker lists the objects of its own prefixes:

    root --ListLevel0--> objects at the root + prefixes (each a (prefix, width) pair)
         --SpreadLevel1 (Reshuffle)--> ListLevel1 --> objects at that level + prefixes ...
    prefixes to list whole --SpreadPrefixes (Reshuffle)--> ListBelow --> every object below each

How deep to fan out: a prefix is listed one more level down (with the delimiter) while its
`width`, the number of prefixes its level would hold if its siblings looked like its own
parent (the product of the child counts along its path), stays under FANOUT_TARGET and at
most FANOUT_LEVELS levels are listed so; otherwise it is listed whole by one worker. So a
root with 20 class folders lists each folder on its own worker, and a tree of 16 x 16 x 16
folders (GLDv2's layout) is cut at its third level. Each prefix is decided on by the worker
that lists its parent, holding at most FANOUT_TARGET prefixes while it counts.

Bounds: each element is one prefix (a string and a width) or one FileBatch (up to BATCH_SIZE
files); the Reshuffles move prefixes only (no group is formed by key). What stays on one
worker: the objects directly inside one prefix above the cut, and the objects below one
prefix at the cut: a bucket of millions of images in one flat "folder" is listed by one
worker, page by page (streamed, never held), as before.

Objects whose names end in "/" (folder placeholders) and names without an image extension are
skipped, as in the local walk. Names are used as they are (never as glob patterns), so `[`,
`*`, `?`, spaces and any Unicode are plain characters. A root that cannot be listed (missing
bucket, no permission, errors left after the client's retries) stops the job with a one-line
error for the entry point (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPIError
from google.auth.exceptions import GoogleAuthError

from transforms.failures import USER_ERROR_MARKER

GCS_SCHEME = "gs://"


DELIMITER = "/"


# Stop fanning out once a level would hold about this many prefixes (enough work items for
# hundreds of workers; one more list request per prefix is all a larger number costs)...
FANOUT_TARGET = 1000


# ...or after this many levels listed with the delimiter (each is a step of the graph).
FANOUT_LEVELS = 3


# What list_level yields: an object directly at the level; and the tagged outputs of
# ListLevelFn: prefixes to list one level down, prefixes to list whole.
OBJECT = "object"


EXPAND = "expand"


BELOW = "below"


# What a listing may raise once the client's own retries are spent (requests' errors are OSErrors).
LIST_ERRORS = (GoogleAPIError, GoogleAuthError, OSError)


# (object name, size) or (prefix, None): one entry of a listing with the delimiter.
Entry = tuple[str, "int | None"]


# Lists `prefix` of the bucket: with the delimiter (objects and prefixes of one level) or,
# delimiter None, every object below it. Yields Entries.
Lister = Callable[[str, "str | None"], Iterable[Entry]]


def split_gcs_path(path: str) -> tuple[str, str]:
    """('bucket', 'prefix/') of a gs:// root; the prefix is '' for the whole bucket.

    Raises:
      ValueError: not a gs:// path, or no bucket name.
    """
    if not path.startswith(GCS_SCHEME):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len(GCS_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket name in {path}")
    name = name.rstrip("/")
    return bucket, (name + "/" if name else "")


def gcs_io(path: str):
    """Beam's GcsIO for `path`: the same client, credentials and retries as Beam's own gs://
    filesystem (the pipeline options FileSystems was given, on the workers too)."""
    return FileSystems.get_filesystem(path)._gcsIO()


def gcs_lister(bucket: str, client=None) -> Lister:
    """A Lister of `bucket` through google-cloud-storage (paged, streamed page by page)."""
    client = client if client is not None else gcs_io(f"{GCS_SCHEME}{bucket}/").client

    def list_prefix(prefix: str, delimiter: str | None) -> Iterator[Entry]:
        blobs = client.list_blobs(bucket, prefix=prefix or None, delimiter=delimiter)
        for page in blobs.pages:
            for blob in page:
                yield blob.name, blob.size or 0  # an object's size is never None; a prefix's is
            for sub in getattr(page, "prefixes", ()):
                yield sub, None

    return list_prefix


def first_page(root: str, limit: int) -> list[str]:
    """Names of up to `limit` objects below gs:// `root`, from a single list request (the
    CLI's cheap look before the job; the listing itself runs in the pipeline).

    Raises:
      LIST_ERRORS: the root cannot be listed (missing bucket, no permission).
    """
    bucket, prefix = split_gcs_path(root)
    blobs = gcs_io(root).client.list_blobs(bucket, prefix=prefix or None, max_results=limit)
    return [blob.name for blob in next(iter(blobs.pages), [])][:limit]


def list_level(
    lister: Lister, prefix: str, width: int, last_level: bool, target: int = FANOUT_TARGET
) -> Iterator[tuple[str, object]]:
    """One level of the fan-out: what `prefix` holds directly, and what to do with its prefixes.

    Pure but for `lister`. Yields (OBJECT, (name, size)) for objects directly in `prefix`,
    (EXPAND, (sub, width)) for prefixes to list one more level down, (BELOW, (sub, width))
    for prefixes to list whole. A prefix is expanded while `width` x (prefixes in `prefix`)
    stays under `target` and this is not `last_level`. At most ceil(target / width) prefixes
    are held while counting; past that they are passed on as they come.

    Args:
      width: the estimated number of prefixes at `prefix`'s level (1 for the root).
    """
    held: list[str] = []
    # Children past this count put the level at or over the target: list them whole.
    enough = -(-target // max(width, 1))
    overflow = last_level
    for name, size in lister(prefix, DELIMITER):
        if size is not None:
            yield OBJECT, (name, size)
        elif overflow:
            yield BELOW, (name, width * enough)
        else:
            held.append(name)
            if len(held) >= enough:
                overflow = True
                yield from ((BELOW, (sub, width * enough)) for sub in held)
                held = []
    n = width * len(held)
    yield from ((EXPAND, (sub, n)) for sub in held)


def list_below(lister: Lister, prefix: str) -> Iterator[tuple[str, int]]:
    """(name, size) of every object below `prefix`, at any depth (no delimiter)."""
    for name, size in lister(prefix, None):
        if size is not None:  # a lister without the delimiter yields objects only
            yield name, size


def _cannot_list(path: str, error: Exception) -> ValueError:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ValueError(f"{USER_ERROR_MARKER} cannot list {path}: {reason}")
