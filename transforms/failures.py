"""The failure output: tag, record and reasons shared by every stage."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

from transforms.paths import listed_name

# Tagged-output names. Never written as bare strings elsewhere.
FAILED = "failed"

# Prefixes the message of an error raised inside the pipeline that is the user's to fix,
# so that the entry point can tell it from a bug once the runner has wrapped it.
USER_ERROR_MARKER = "img2tfrecord-user-error:"
# What runners append to an error raised in a step ("... [while running 'ReadLabels/ParseRows']").
_STEP_SUFFIX = re.compile(r"\s*\[while running '[^']*'\]")


def user_error_text(message: str) -> str | None:
    """The line after USER_ERROR_MARKER in `message` (an error as the runner re-raised it, with
    tracebacks, quotes and the step name around it, or a log record about it), or None."""
    if USER_ERROR_MARKER not in message:
        return None
    line = message.split(USER_ERROR_MARKER, 1)[1].splitlines()[0]
    return _STEP_SUFFIX.sub("", line).strip(" '\"") or "invalid input"


@dataclasses.dataclass(frozen=True)
class Failure:
    """An input that was listed but not written, and why.

    Attributes:
      path: the image path as listed (or the label row's key for orphan rows), without an
        archive member's pin (transforms.paths.listed_name): the same on every run.
      reason: one line a person can act on.
      stage: the pipeline stage that rejected it ('list', 'label', 'read', 'decode').
      split: the split the image was assigned to, if it got that far.
      class_key: the image's label text, if known.
    """

    path: str
    reason: str
    stage: str
    split: str | None = None
    class_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", listed_name(self.path))

    def to_json(self) -> str:
        """One JSON line; UTF-8 text where the path is valid Unicode, escapes where not."""
        text = json.dumps(dataclasses.asdict(self), ensure_ascii=False, sort_keys=True)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in a file name
            text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return text


# The likely fix of a failure reason, by the start of its kind (see reason_kind), first match.
_FIXES: tuple[tuple[str, str], ...] = (
    ("not inside a class folder", "put each class in its own sub-folder of --input, or pass --labels TABLE"),
    ("not inside a split folder", "--splits folders reads <input>/<split>/<class>/...: check the layout"),
    ("label missing: the row for key", "fill in the empty labels, or pass --unlabeled skip"),
    (
        "label missing",
        "the table's keys must be the images' keys: check --key_column and --image_key "
        "(stem, name, relpath), or pass --unlabeled skip",
    ),
    (
        "bad row",
        "fix those rows of the labels table: failures.jsonl names each one's file:line and what is wrong",
    ),
    (
        "conflicting rows for key",
        "pass --duplicate_keys first (the first row wins) or union (all their labels), or remove the extra rows",
    ),
    (
        "rows for key … disagree",
        "make a key's rows agree on the split and extra columns, or pass --duplicate_keys first",
    ),
    (
        "label … is not a non-negative integer",
        "fix those labels, or pass --label_type str (labels are names)",
    ),
    ("too large", "raise --max_pixels if these images are trusted"),
    ("label … is not in --label_map", "list every label in --label_map"),
    ("duplicate", "--dedupe drops exact duplicates; leave it off to keep them"),
)
_DAMAGED = "remove or repair the damaged files, or raise --max_failure_ratio"
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PARENS = re.compile(r"\s*\([^()]*\)")


def reason_kind(reason: str) -> str:
    """A failure reason without its particulars (keys, paths, sizes): what groups failures
    ("label missing: no row for key 'a1' ..." -> "label missing: no row for key … ...")."""
    if reason.startswith("duplicate of "):
        return "duplicate"
    kind = _PARENS.sub("", _QUOTED.sub("…", reason))
    kind = re.sub(r"\d+(x\d+)?", "N", kind)
    head, _, tail = kind.partition(": ")
    # Keep one level of detail after the colon, unless it is a library's free text.
    return f"{head}: {tail}" if tail and len(tail) <= 60 and "…" in tail else head


def likely_fix(kind: str) -> str:
    """What a person would most likely do about failures of this kind."""
    return next((fix for start, fix in _FIXES if kind.startswith(start)), _DAMAGED)


def top_kinds(counts: Mapping[str, int], n: int = 3) -> list[tuple[str, int]]:
    """The `n` commonest of `counts` (reason kind -> failures), commonest first (ties by kind)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def diagnosis_of_kinds(counts: Mapping[str, int], n: int = 3) -> str:
    """One line for the exit-3 message: the top reason kinds with their counts and the top one's
    likely fix ("top reasons: 3 × label missing: ...; likely fix: ..."); empty without failures."""
    top = top_kinds(counts, n)
    if not top:
        return ""
    listed = "; ".join(f"{count:,} × {kind}" for kind, count in top)
    return f"top reasons: {listed}; likely fix: {likely_fix(top[0][0])}"
