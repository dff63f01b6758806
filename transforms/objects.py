"""One image's annotations (boxes, classes, flags, masks) as they cross from the labels stage to the writer.

An annotation reader at the labels stage gathers the rows of one image into an `Objects`;
the record carries it through split assignment and shard planning (`RecordBatch.objects`, coded by
transforms/coders.py as `to_bytes`); the writer applies the image's geometry to it
(transforms/images/geometry.py) and writes the object keys (transforms/encoding/objects.py).
Classification records carry None and never touch this module.

Coordinates are continuous, in the image as the annotation file describes it (before any resize,
crop or EXIF rotation): a box over pixel columns 0..9 has xmin=0, xmax=10. Readers of 1-based
inclusive corners (Pascal VOC) subtract 1 from the minimum corners, as TFDS's voc builder does.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable, Sequence

import numpy as np

# to_bytes layout version (the first byte): a change of layout gets a new version.
_VERSION = 1
# version, flags, n, declared width, declared height, len(segmentation_path), len(labels text)
_HEADER = struct.Struct("<BBIqqII")
_NORMALIZED, _DECLARED, _SEGMENTATION = 1, 2, 4
_NO_MASK = -1
_TEXT = "utf-8"
_TEXT_ERRORS = "surrogatepass"  # undecodable file names (surrogates) round-trip


def _canonical(values: np.ndarray) -> np.ndarray:
    """float64 with every NaN the same NaN (so equal Objects give equal bytes)."""
    values = np.array(values, dtype=np.float64)  # a copy: the caller's array is never frozen
    values[np.isnan(values)] = np.nan
    return values


@dataclasses.dataclass(frozen=True, eq=False)
class Objects:
    """One image's annotations as its annotation file gave them, before any geometry (pure, numpy columns).

    n objects; every array has length n (checked, and coerced to the dtypes below, on construction).
    Equal Objects have equal `to_bytes`; `==` and `hash` compare those bytes.
    """

    labels: tuple[str, ...]  # class name of each object (matched against the class index)
    boxes: np.ndarray  # float64 (n, 4): xmin, ymin, xmax, ymax
    normalized: bool  # True: boxes are fractions of the image (YOLO, --box_units normalized); False: pixels
    is_crowd: np.ndarray  # bool (n,)
    difficult: np.ndarray  # bool (n,)
    truncated: np.ndarray  # bool (n,)
    area: np.ndarray  # float64 (n,), NaN where the annotation gives none (computed from the mask or box then)
    masks: tuple[bytes | None, ...]  # per object: COCO `segmentation` as compact JSON text, or None
    declared_size: tuple[int, int] | None  # (width, height) the annotation declares, if any
    segmentation_path: str | None = None  # a PNG class map to read beside the image (segmentation format)

    def __post_init__(self) -> None:
        labels = tuple(self.labels)
        n = len(labels)
        boxes = np.asarray(self.boxes, dtype=np.float64).reshape(-1, 4) if n else np.zeros((0, 4))
        columns = {
            "labels": labels,
            "boxes": _canonical(boxes).reshape(-1, 4),
            "is_crowd": np.array(self.is_crowd, dtype=bool).reshape(-1),
            "difficult": np.array(self.difficult, dtype=bool).reshape(-1),
            "truncated": np.array(self.truncated, dtype=bool).reshape(-1),
            "area": _canonical(np.asarray(self.area, dtype=np.float64).reshape(-1)),
            "masks": tuple(self.masks),
        }
        for name, column in columns.items():
            if len(column) != n:
                raise ValueError(f"Objects.{name} has {len(column)} entries for {n} labels")
            object.__setattr__(self, name, column)
        for array in ("boxes", "is_crowd", "difficult", "truncated", "area"):
            columns[array].setflags(write=False)
        object.__setattr__(self, "normalized", bool(self.normalized))
        if self.declared_size is not None:
            width, height = self.declared_size
            object.__setattr__(self, "declared_size", (int(width), int(height)))

    @classmethod
    def build(
        cls,
        labels: Sequence[str],
        boxes: Iterable[Sequence[float]] | np.ndarray,
        *,
        normalized: bool = False,
        is_crowd: Sequence[bool] | None = None,
        difficult: Sequence[bool] | None = None,
        truncated: Sequence[bool] | None = None,
        area: Sequence[float] | None = None,
        masks: Sequence[bytes | None] | None = None,
        declared_size: tuple[int, int] | None = None,
        segmentation_path: str | None = None,
    ) -> Objects:
        """An Objects with the flags False, areas absent and no masks unless given."""
        n = len(labels)
        no = np.zeros(n, dtype=bool)
        return cls(
            labels=tuple(labels),
            boxes=np.asarray(list(boxes) if not isinstance(boxes, np.ndarray) else boxes, dtype=np.float64),
            normalized=normalized,
            is_crowd=no if is_crowd is None else is_crowd,
            difficult=no if difficult is None else difficult,
            truncated=no if truncated is None else truncated,
            area=np.full(n, np.nan) if area is None else area,
            masks=(None,) * n if masks is None else tuple(masks),
            declared_size=declared_size,
            segmentation_path=segmentation_path,
        )

    @classmethod
    def empty(
        cls, declared_size: tuple[int, int] | None = None, segmentation_path: str | None = None
    ) -> Objects:
        """A background image: zero objects (an image the annotations list without any box)."""
        return cls.build(
            (), np.zeros((0, 4)), declared_size=declared_size, segmentation_path=segmentation_path
        )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def has_masks(self) -> bool:
        return any(m is not None for m in self.masks)

    def take(self, keep: np.ndarray | Sequence[int]) -> Objects:
        """The objects at `keep` (indices or a boolean mask), in that order; the rest as they were."""
        keep = np.asarray(keep)
        index = np.flatnonzero(keep) if keep.dtype == bool else keep.astype(np.intp).reshape(-1)
        pick = index.tolist()
        return dataclasses.replace(
            self,
            labels=tuple(self.labels[i] for i in pick),
            boxes=self.boxes[index],
            is_crowd=self.is_crowd[index],
            difficult=self.difficult[index],
            truncated=self.truncated[index],
            area=self.area[index],
            masks=tuple(self.masks[i] for i in pick),
        )

    def to_bytes(self) -> bytes:
        """Compact and deterministic: the same Objects gives the same bytes on every machine."""
        n = len(self)
        flags = (
            (_NORMALIZED if self.normalized else 0)
            | (_DECLARED if self.declared_size is not None else 0)
            | (_SEGMENTATION if self.segmentation_path is not None else 0)
        )
        width, height = self.declared_size or (0, 0)
        seg = (self.segmentation_path or "").encode(_TEXT, _TEXT_ERRORS)
        names = [label.encode(_TEXT, _TEXT_ERRORS) for label in self.labels]
        text = b"".join(names)
        masks = [m if m is None else bytes(m) for m in self.masks]
        parts = [
            _HEADER.pack(_VERSION, flags, n, width, height, len(seg), len(text)),
            seg,
            text,
            np.asarray([len(b) for b in names], dtype="<u4").tobytes(),
            self.boxes.astype("<f8", copy=False).tobytes(),
            np.packbits(np.stack([self.is_crowd, self.difficult, self.truncated]), axis=1).tobytes(),
            self.area.astype("<f8", copy=False).tobytes(),
            np.asarray([_NO_MASK if m is None else len(m) for m in masks], dtype="<i8").tobytes(),
            *(m for m in masks if m is not None),
        ]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Objects:
        """The Objects `to_bytes` wrote."""
        view = memoryview(data)
        version, flags, n, width, height, seg_len, text_len = _HEADER.unpack_from(view)
        if version != _VERSION:
            raise ValueError(f"Objects bytes of version {version}, expected {_VERSION}")
        at = _HEADER.size

        def take(size: int) -> memoryview:
            nonlocal at
            part = view[at : at + size]
            if len(part) != size:
                raise ValueError("Objects bytes cut short")
            at += size
            return part

        seg = bytes(take(seg_len)).decode(_TEXT, _TEXT_ERRORS)
        text = bytes(take(text_len))
        ends = np.cumsum(np.frombuffer(take(4 * n), dtype="<u4"), dtype=np.int64).tolist()
        labels = tuple(text[a:b].decode(_TEXT, _TEXT_ERRORS) for a, b in zip([0, *ends], ends))
        boxes = np.frombuffer(take(32 * n), dtype="<f8").astype(np.float64).reshape(n, 4)
        packed = np.frombuffer(take(3 * ((n + 7) // 8)), dtype=np.uint8).reshape(3, -1)
        flags3 = np.unpackbits(packed, axis=1, count=n).astype(bool)
        area = np.frombuffer(take(8 * n), dtype="<f8").astype(np.float64)
        sizes = np.frombuffer(take(8 * n), dtype="<i8").tolist()
        masks = tuple(None if size == _NO_MASK else bytes(take(size)) for size in sizes)
        if at != len(view):
            raise ValueError("Objects bytes with trailing data")
        return cls(
            labels=labels,
            boxes=boxes,
            normalized=bool(flags & _NORMALIZED),
            is_crowd=flags3[0],
            difficult=flags3[1],
            truncated=flags3[2],
            area=area,
            masks=masks,
            declared_size=(width, height) if flags & _DECLARED else None,
            segmentation_path=seg if flags & _SEGMENTATION else None,
        )

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_bytes() == other.to_bytes()

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    def __repr__(self) -> str:
        return f"Objects({len(self)}: {self.labels[:3]!r}{'...' if len(self) > 3 else ''})"

    def __reduce__(self) -> tuple:
        return Objects.from_bytes, (self.to_bytes(),)


def mask_json(segmentation: object) -> bytes:
    """A COCO `segmentation` value (polygons or RLE) as the compact JSON text Objects.masks holds."""
    return json.dumps(segmentation, separators=(",", ":"), sort_keys=True).encode()
