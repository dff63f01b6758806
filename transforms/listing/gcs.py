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

Each list request is one request of the one retry policy (transforms/gcs.py `lister`).
Objects whose names end in "/" (folder placeholders) and names without an image extension are
skipped, as in the local walk. Names are used as they are (never as glob patterns), so `[`,
`*`, `?`, spaces and any Unicode are plain characters. A root that cannot be listed (missing
bucket, no permission, errors left after the policy's retries) stops the job with a one-line
error for the entry point (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from transforms.coders import FileBatchCoder  # noqa: F401 - registers the record coders
from transforms.failures import USER_ERROR_MARKER
from transforms.gcs import DELIMITER, Lister

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
