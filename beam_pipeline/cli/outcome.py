"""What `convert` prints when it is done (pure): warnings, then one final line.

In: the run's summary (summary.json). Out: lines for stderr. The final line counts what was
written and says what was not read ("skipped ..."): images skipped by `--unlabeled skip`,
hidden entries and files of other extensions (transforms/listing/skips.py). The warnings
before it name a split that got no image, or none written, and a split name that looks like a
typo of train, validation or test.
"""

from __future__ import annotations

from collections.abc import Mapping

from transforms.layout.plan import split_name_warnings
from transforms.listing.skips import skipped_phrases
from transforms.output.publish import FAILURES_FILE

PREFIX = "img2tfrecord: "


def skipped_text(summary: Mapping) -> str | None:
    """'10 unlabeled images (--unlabeled skip), 2 hidden entries and 3 files by extension:
    .txt 2, .csv 1', or None when nothing under --input was left unread."""
    phrases = []
    unlabeled = (summary.get("labels") or {}).get("unlabeled_skipped", 0)
    if unlabeled:
        phrases.append(f"{unlabeled:,} unlabeled image{'s' if unlabeled != 1 else ''} (--unlabeled skip)")
    phrases += skipped_phrases(summary.get("skipped") or {})
    if not phrases:
        return None
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def final_line(summary: Mapping) -> str:
    """convert's last line: what was written, with thousands separators as the progress bar,
    and what was skipped."""
    failed = summary["failed"]
    where = f"{failed:,} failed, see {FAILURES_FILE}" if failed else "none failed"
    line = f"{PREFIX}wrote {summary['written']:,} of {summary['listed']:,} images ({where})"
    skipped = skipped_text(summary)
    return f"{line}; skipped {skipped}" if skipped else line


def warnings(summary: Mapping) -> list[str]:
    """The conversion's warnings: empty splits, splits with nothing written, likely typos."""
    out = []
    splits = summary.get("splits") or {}
    for name in summary.get("empty_splits") or ():
        out.append(
            f"split {name!r} is empty: none of the {summary['listed']:,} images hashed into it "
            "(too few images for its ratio in --splits)"
        )
    for name, entry in splits.items():
        if entry.get("listed") and not entry.get("written"):
            out.append(f"split {name!r} has no image written: all {entry['listed']:,} failed")
    out += split_name_warnings([*splits, *(summary.get("empty_splits") or ())])
    return [f"{PREFIX}warning: {text}" for text in out]


def final_lines(summary: Mapping) -> list[str]:
    """The warnings, then the final line."""
    return [*warnings(summary), final_line(summary)]
