"""WebDataset samples: the label sidecars (`key.cls`, `key.txt`, `key.json`) of a tar's images (pure).

In: the members of one archive as it is indexed. Out: SampleLabel (an image's relpath and the
label its sample's sidecar holds), turned into labels-table rows by transforms/labels/beam_table.py.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Callable, Iterator

from transforms.listing.archives import Member, Problem

# A WebDataset sample is the run of consecutive members that share a key: the member's path
# up to the first dot of its file name (webdataset's `base_plus_ext`: `a/b.c.jpg` -> key `a/b`,
# extension `c.jpg`). A sidecar of the sample supplies its label: `.cls`, `.txt` or `.json`,
# the first present in that order (suffixes compared in lowercase).
SIDECAR_EXTENSIONS = (".cls", ".txt", ".json")
_SIDECARS = tuple(e[1:] for e in SIDECAR_EXTENSIONS)
MAX_SIDECAR_BYTES = 64 * 1024  # a sidecar is read while indexing: larger ones are not labels
# Fields of a `.json` sidecar object that hold the label, the first present in that order.
JSON_LABEL_FIELDS = ("label", "cls", "class")


def webdataset_key(name: str) -> tuple[str, str]:
    """(key, extension) of a member name as webdataset splits it; extension in lowercase."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


@dataclasses.dataclass(frozen=True)
class SampleLabel:
    """The label a WebDataset sidecar gives one image of its sample.

    Attributes:
      relpath: the image's relpath (the labels join keys it by --image_key, as any image).
      value: the label as the sidecar gives it: text, or what a `.json` holds (int, str, list).
      source: where it comes from (`<archive>#<sidecar member>`), for error messages.
    """

    relpath: str
    value: object
    source: str


def sidecar_label(extension: str, data: bytes) -> object:
    """The label a sidecar's bytes hold: the stripped text of `.cls`/`.txt`, or from `.json`
    a number, text or list, or the first of JSON_LABEL_FIELDS of an object.

    Raises:
      ValueError: not UTF-8, not JSON, or a JSON object without a label field.
    """
    text = data.decode("utf-8").strip()
    if extension != "json":
        return text
    value = json.loads(text)
    if isinstance(value, dict):
        for name in JSON_LABEL_FIELDS:
            if name in value:
                return value[name]
        raise ValueError(f"no {'/'.join(JSON_LABEL_FIELDS)} field in the JSON object")
    return value


def label_samples(
    members: Iterator[Member | Problem], read: Callable[[Member], bytes], extensions: tuple[str, ...]
) -> Iterator[Member | Problem | SampleLabel]:
    """`members` (image members and sidecars, in archive order) as image Members, Problems
    and one SampleLabel per image of a sample that has a sidecar (`read` gives its bytes).
    Holds one sample at a time (members of one key are consecutive, as webdataset requires)."""
    key, images, labels = None, [], {}

    def flush() -> Iterator[Member | Problem | SampleLabel]:
        ext = next((e for e in _SIDECARS if e in labels), None)
        if ext is None:  # unlabeled: the join's --unlabeled policy decides
            yield from images
            return
        member = labels[ext]
        try:
            if member.size > MAX_SIDECAR_BYTES:
                raise ValueError(f"{member.size} bytes: too large for a label")
            value = sidecar_label(ext, read(member))
        except (ValueError, OSError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            for image in images:
                yield Problem(image.name, f"label sidecar {member.name}: {e}")
            return
        for image in images:
            yield image
            yield SampleLabel(image.relpath, value, member.name)

    for item in members:
        if isinstance(item, Problem):
            yield item
            continue
        sample, ext = webdataset_key(item.name)
        if sample != key:
            yield from flush()
            key, images, labels = sample, [], {}
        if posixpath.splitext(item.name)[1].lower() in extensions:
            images.append(item)
        elif ext in _SIDECARS:
            labels.setdefault(ext, item)
    yield from flush()
