"""What the listing passes over without reading, counted by reason (pure).

In: each entry the listing decides not to read: a hidden entry (local.is_hidden: a dot name or
`__MACOSX/`, counted once with everything below it) or a file whose extension is neither an
image's (transforms.paths.IMAGE_EXTENSIONS) nor an archive's; in a tar, a member of that kind.
Out: SkipCounts, a small dict per bundle keyed (reason, extension), merged by ListImages'
combiner into summary.json's "skipped" section (`skipped_section`), which the CLI's final line
reads back (`skipped_phrases`: "skipped 3 files by extension: .txt 2, .csv 1").

Bounds: one count per (reason, extension), at most MAX_EXTENSIONS extensions named: when more
are seen, the ones after the first MAX_EXTENSIONS in sorted order are added up under OTHER.
Keeping the smallest keys is associative (a key among the smallest of all inputs is among the
smallest of every part that holds it), so the merged counts are exact and the same whatever
the bundles, and a folder of `img.0001`, `img.0002`, ... cannot grow them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping

HIDDEN = "hidden"
EXTENSION = "extension"
NO_EXTENSION = "(none)"  # a file name without a suffix: `README`, `LICENSE`
OTHER = "(other)"  # the extensions past MAX_EXTENSIONS, added up
MAX_EXTENSIONS = 50
# The extensions the final line names; summary.json has all that were kept.
SHOWN_EXTENSIONS = 5

Key = tuple[str, str]  # (HIDDEN, '') or (EXTENSION, '.txt')


def extension_of(name: str) -> str:
    """The last suffix of a file name, lowercase with its dot (`.txt`), or NO_EXTENSION."""
    return posixpath.splitext(name.rsplit("/", 1)[-1])[1].lower() or NO_EXTENSION


def add_counts(counts: dict[Key, int], more: Iterable[tuple[Key, int]]) -> dict[Key, int]:
    """`counts` plus `more`, trimmed to MAX_EXTENSIONS named extensions (module docstring)."""
    for key, n in more:
        counts[key] = counts.get(key, 0) + n
    named = sorted(k for k in counts if k[0] == EXTENSION and k[1] != OTHER)
    for key in named[MAX_EXTENSIONS:]:
        counts[(EXTENSION, OTHER)] = counts.get((EXTENSION, OTHER), 0) + counts.pop(key)
    return counts


class SkipCounts:
    """The skipped entries one listing DoFn saw in a bundle (trimmed as add_counts trims).

    `hidden(entry)` counts a hidden entry once while the same entry comes again in a row (the
    objects below a hidden `gs://` prefix are listed one by one, in name order)."""

    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}
        self._last_hidden: str | None = None

    def hidden(self, entry: str) -> None:
        """A hidden file or folder: `entry` is its path up to its hidden part."""
        if entry != self._last_hidden:
            self._last_hidden = entry
            self._add((HIDDEN, ""))

    def other(self, name: str) -> None:
        """A file (or tar member) that is neither an image nor an archive."""
        self._add((EXTENSION, extension_of(name)))

    def _add(self, key: Key) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        if len(self._counts) > 2 * MAX_EXTENSIONS:  # trimmed once every MAX_EXTENSIONS new keys
            add_counts(self._counts, ())

    def take(self) -> dict[Key, int]:
        """The counts so far (trimmed), and a fresh start."""
        counts = add_counts(self._counts, ())
        self._counts, self._last_hidden = {}, None
        return counts


def skipped_section(counts: Mapping[Key, int]) -> dict:
    """summary.json's "skipped": the files under --input that were not read, by reason.

    `total`: all of them; `hidden`: hidden entries (a hidden folder counts once);
    `by_extension`: files that are neither images nor archives, per extension, most first
    (OTHER: the extensions past MAX_EXTENSIONS).
    """
    by_extension = {ext: n for (reason, ext), n in counts.items() if reason == EXTENSION}
    ordered = sorted(by_extension.items(), key=lambda kv: (kv[0] == OTHER, -kv[1], kv[0]))
    hidden = counts.get((HIDDEN, ""), 0)
    return {"total": hidden + sum(by_extension.values()), "hidden": hidden, "by_extension": dict(ordered)}


def skipped_phrases(section: Mapping) -> list[str]:
    """The final line's words for a "skipped" section: ['2 hidden entries', '3 files by
    extension: .txt 2, .csv 1'] (the list last), empty when nothing was skipped."""
    phrases = []
    hidden = section.get("hidden", 0)
    if hidden:
        phrases.append(f"{hidden:,} hidden entr{'ies' if hidden != 1 else 'y'}")
    by_extension = section.get("by_extension") or {}
    if by_extension:
        total = sum(by_extension.values())
        shown = list(by_extension.items())[:SHOWN_EXTENSIONS]
        rest = total - sum(n for _, n in shown)
        listed = ", ".join(f"{ext} {n:,}" for ext, n in shown) + (f", others {rest:,}" if rest else "")
        phrases.append(f"{total:,} file{'s' if total != 1 else ''} by extension: {listed}")
    return phrases
