"""The gs:// branch of ListImages (ListGcsImages, beam_gcs.py): the listing spread over workers by prefix.

In: a `gs://bucket[/prefix]` root. Out: FileBatches of every object below it with an image
extension, each exactly once: the same files as one `MatchFiles(root/**)`, whose one worker
pages through every name.

The first levels are listed with `delimiter="/"` (the objects at a level, and the prefixes
below it); the prefixes, not the objects, cross a Reshuffle, so each worker lists its own:

    root --ListLevel0--> objects at the root + prefixes (each a (prefix, width) pair)
         --SpreadLevel1 (Reshuffle)--> ListLevel1 --> objects at that level + prefixes ...
    prefixes to list whole --SpreadPrefixes (Reshuffle)--> ListBelow --> every object below each

A prefix is listed one more level down while its `width` (the product of the child counts
along its path: the prefixes its level would hold if its siblings looked like its parent)
stays under FANOUT_TARGET, for at most FANOUT_LEVELS levels; else one worker lists it whole.
So 20 class folders go to 20 workers, and GLDv2's 16 x 16 x 16 folders are cut at the third.

Bounds: each element is one prefix and a width, or one FileBatch; the Reshuffles move
prefixes only. A worker holds at most FANOUT_TARGET prefixes while it counts them; a flat
"folder" of millions of objects is listed by one worker, page by page (streamed, never held).
Each list request is one request of the one retry policy (transforms/gcs.py `lister`). A
root that cannot be listed stops the job with a one-line error (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from transforms.gcs import DELIMITER, Lister

# Stop fanning out once a level would hold about this many prefixes (enough work items for
# hundreds of workers; one more list request per prefix is all a larger number costs)...
FANOUT_TARGET = 1000
# ...or after this many levels listed with the delimiter (each is a step of the graph).
FANOUT_LEVELS = 3
# What list_level yields: an object directly at the level; and the tagged outputs of
# ListPrefixFn: prefixes to list one level down, prefixes to list whole.
OBJECT = "object"
EXPAND = "expand"
BELOW = "below"


def list_level(
    lister: Lister, prefix: str, width: int, last_level: bool, target: int = FANOUT_TARGET
) -> Iterator[tuple[str, object]]:
    """One level of the fan-out: (OBJECT, (name, size)) for the objects directly in `prefix`,
    (EXPAND, (sub, width)) for its prefixes to list one level down, (BELOW, (sub, width)) for
    those to list whole. `width`: the estimated prefixes at `prefix`'s level (1 for the root).

    Its prefixes are expanded while `width` x their number stays under `target` and this is
    not `last_level`. At most ceil(target / width) are held while counting; past that they are
    passed on as they come. Pure but for `lister`.
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
