"""orphan_labels.jsonl (pure): the table rows no listed image matched, or that could not be used.

In: Arrow batches of orphan rows (labels.rows.ORPHAN_COLUMNS, from the join). Out: the chunks of
table lines they fall in (orphan_chunks: a chunk is the group WriteOrphans sorts and writes as
one part), and a chunk's lines in the file's order (orphan_lines): keys by their first row, a
key's rows together in table order, each line what OrphanRow.to_json writes. Built for the
column at once; Python writes only the rare lines that need escapes (control characters,
undecodable file names).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.labels.rows import (
    FIRST_LINE,
    FIRST_SOURCE,
    KEY,
    LINE,
    ORPHANS_FILE,
    REASON,
    SOURCE,
    STAT_NAMES,
    JoinSettings,
    TableSpec,
    decode_text,
    text_bytes,
)

# Table lines per orphan part (bounds a WriteOrphans group and the file's parts per file).
CHUNK_LINES = 100_000
# The order of orphan_labels.jsonl (OrphanRow.order).
_ORDER = [(name, "ascending") for name in (FIRST_SOURCE, FIRST_LINE, SOURCE, LINE, KEY, REASON)]


@dataclasses.dataclass(frozen=True)
class OrphanRow:
    """A table row that no listed image matched (or that could not be parsed)."""

    key: str
    source: str
    line: int
    reason: str
    # (source, line) of the first row of this key: a key's orphan rows are written together,
    # where its first row is (order). Not written out, not compared.
    first: tuple[str, int] = dataclasses.field(default=("", 0), compare=False, repr=False)

    def to_json(self) -> str:
        """The row's line of orphan_labels.jsonl: its fields as JSON, keys sorted."""
        fields = {"key": self.key, "line": self.line, "reason": self.reason, "source": self.source}
        text = json.dumps(fields, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes of a file name: escaped
            text = json.dumps(fields)
        return text

    def order(self) -> tuple:
        """Where the row goes in orphan_labels.jsonl: keys by their first row, a key's rows
        together in file order (the same on every runner)."""
        first = self.first if self.first[0] else (self.source, self.line)
        return first, self.source, self.line, self.key, self.reason


def orphan_chunks(orphans: pa.RecordBatch) -> Iterator[tuple[tuple[str, int], pa.RecordBatch]]:
    """((first source, chunk of CHUNK_LINES table lines), its orphan rows) of `orphans`."""
    orphans = pa.Table.from_batches([orphans])
    firsts = _with_firsts(orphans.select([SOURCE, LINE, FIRST_SOURCE, FIRST_LINE]))
    chunk = pc.divide(firsts.column(FIRST_LINE), CHUNK_LINES).to_numpy()
    sources = firsts.column(FIRST_SOURCE).combine_chunks().dictionary_encode()
    code = sources.indices.to_numpy(zero_copy_only=False).astype(np.int64) * (1 << 40) + chunk
    order = np.argsort(code, kind="stable")
    code = code[order]
    table = orphans.take(order).combine_chunks()
    names = sources.dictionary.to_pylist()
    bounds = [0, *(np.flatnonzero(np.diff(code)) + 1).tolist(), len(code)]
    for start, end in zip(bounds, bounds[1:]):
        part = table.slice(start, end - start).to_batches()[0]
        yield (names[int(code[start] >> 40)], int(code[start] & ((1 << 40) - 1))), part


def _with_firsts(orphans: pa.Table) -> pa.Table:
    """The orphans with every text column plain and every row's first row filled in."""
    columns = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in orphans.columns]
    table = pa.table(columns, names=orphans.schema.names)
    for name, own in ((FIRST_SOURCE, SOURCE), (FIRST_LINE, LINE)):
        at = table.schema.get_field_index(name)
        table = table.set_column(at, name, pc.coalesce(table.column(name), table.column(own)))
    return table.combine_chunks()


# Bytes that a JSON string cannot hold as they are (json.dumps escapes them).
_ESCAPED = bytes(range(32)) + b'"\\'


def _json_text(column: pa.Array) -> pa.Array | None:
    """Each value as the inside of a JSON string (what json.dumps(ensure_ascii=False) writes
    between the quotes), or None when some value needs more than '"' and '\\' escaped."""
    coded = column.dictionary_encode() if len(column) > 64 else None
    values = coded.dictionary if coded is not None else column
    data = text_bytes(values)
    if data.translate(None, bytes(range(32, 256))):  # a control character
        return None
    if data.translate(None, bytes(range(256)).translate(None, _ESCAPED)):
        values = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    return values.take(coded.indices) if coded is not None else values


def orphan_lines(orphans: pa.Table) -> bytes:
    """The orphan rows' lines of orphan_labels.jsonl (OrphanRow.to_json each), in its order.
    Built for the column at once; a chunk with a value that needs more escaping than '"' and
    '\\' (a control character, an undecodable file name) is written row by row by OrphanRow."""
    if not orphans.num_rows:
        return b""
    table = _with_firsts(orphans).sort_by(_ORDER)
    try:
        keys = _json_text(table.column(KEY).combine_chunks().cast(pa.string()))
    except pa.ArrowInvalid:  # undecodable file names
        keys = None
    texts = [keys, *(_json_text(table.column(c).combine_chunks()) for c in (REASON, SOURCE))]
    if all(t is not None for t in texts):
        line = table.column(LINE).combine_chunks().cast(pa.string())
        joined = pc.binary_join_element_wise(
            '{"key": "',
            texts[0],
            '", "line": ',
            line,
            ', "reason": "',
            texts[1],
            '", "source": "',
            texts[2],
            '"}\n',
            "",
        )
        return text_bytes(joined)
    rows = zip(decode_text(table.column(KEY)), *(table.column(c).to_pylist() for c in (SOURCE, LINE, REASON)))
    return "".join(OrphanRow(*row).to_json() + "\n" for row in rows).encode("utf-8")


def label_summary(counts: Mapping[str, int], spec: TableSpec, settings: JoinSettings) -> dict:
    """The "labels" section of summary.json."""
    section: dict = {
        "table": spec.path,
        "key_column": spec.key_column,
        "label_column": spec.label_column,
        "unlabeled": settings.unlabeled,
        "duplicate_keys_policy": settings.duplicates,
        "orphans_file": ORPHANS_FILE,
    }
    section.update({name: int(counts.get(name, 0)) for name in STAT_NAMES})
    return {"labels": section}
