"""What a finished dataset's records are, from its metadata: the one description every reader
of ours (`load_dataset`, `parse_spec`, `verify`, `inspect`) starts from. In: summary.json and
features.json if any. Out: a DatasetFormat (small and picklable: Beam workers get it as
configuration).
"""

from __future__ import annotations

import dataclasses
import functools

from transforms.encoding.schema import DEFAULT_SCHEMA, Schema, get_schema, summary_objects
from transforms.images.decoding import STORE_ENCODED, STORE_RAW

_TFDS_IMAGE_CLASS = "image_feature.Image"
# Roles whose keys hold the stored shape, in (height, width, channels) order.
SHAPE_ROLES = ("height", "width", "channels")


@dataclasses.dataclass(frozen=True)
class DatasetFormat:
    """How the records of one dataset are parsed and decoded: the `--schema` preset, its
    `--rename_keys` pairs, the store mode, and whether features.json declares the image a TFDS
    `Image` (decoded with `expand_animations=True`)."""

    schema_name: str = DEFAULT_SCHEMA
    renames: tuple[tuple[str, str], ...] = ()
    store: str = STORE_ENCODED
    tfds_image: bool = False
    objects: tuple[bool, bool] | None = None  # (masks, class maps) of a dataset with objects

    @classmethod
    def from_summary(cls, summary: dict, features: dict | None = None) -> DatasetFormat:
        """The format of a dataset from its summary.json (and features.json) documents.
        Raises ValueError: unknown schema or store mode, or renames that do not apply."""
        fmt = cls(
            schema_name=summary.get("schema", DEFAULT_SCHEMA),
            renames=tuple(sorted((summary.get("rename_keys") or {}).items())),
            store=summary.get("store", STORE_ENCODED),
            tfds_image=features is not None and declares_image(features),
            objects=summary_objects(summary),
        )
        if fmt.store not in (STORE_ENCODED, STORE_RAW):
            raise ValueError(f"unknown store mode {fmt.store!r} in summary.json")
        fmt.schema  # noqa: B018 - checks the schema and renames now
        if fmt.raw:
            fmt.shape_keys()
        return fmt

    @functools.cached_property
    def schema(self) -> Schema:
        return get_schema(self.schema_name, self.renames, self.objects)

    @property
    def raw(self) -> bool:
        return self.store == STORE_RAW

    def shape_keys(self) -> tuple[str, ...]:
        """The (height, width, channels) keys of the stored shape, for the roles the schema has.
        Raises ValueError for raw pixels whose schema lacks one (they could not be reshaped)."""
        keys = tuple(self.schema.roles[r] for r in SHAPE_ROLES if r in self.schema.roles)
        if self.raw and len(keys) != len(SHAPE_ROLES):
            raise ValueError(
                f"raw pixels need height, width and channels keys; the {self.schema_name} schema lacks some"
            )
        return keys

    def animation_readers(self) -> list[str]:
        """The dataset's readers that decode with `expand_animations=True` (4-D for the formats
        of transforms.images.decoding.DECODED_4D_FORMATS), named for messages."""
        readers = []
        if self.tfds_image:
            readers.append("TFDS's Image feature (features.json)")
        if self.schema.single_frame:
            readers.append(f"the {self.schema_name} schema's decoder")
        return readers


def declares_image(features: dict) -> bool:
    """True when a features.json document declares a TFDS `Image` anywhere."""
    if str(features.get("pythonClassName", "")).endswith(_TFDS_IMAGE_CLASS):
        return True
    return any(declares_image(v) for v in features.values() if isinstance(v, dict))
