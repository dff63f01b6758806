"""Orphan rows (pure): table rows no listed image matched, or that could not be used, as the
lines of orphan_labels.jsonl.

In: the rows of a join bucket that have no image (Arrow). Out: an Arrow table of
ORPHAN_COLUMNS (orphans_of), cut into chunks of table lines (orphan_chunks: a chunk is the
group that WriteOrphans sorts and writes as one part), and a chunk's JSON lines in the file's
order (orphan_lines): keys by their first row, a key's rows together in table order, each line
what OrphanRow.to_json writes. Built for the column at once; Python writes only the rare lines
that need escapes (control characters, undecodable file names).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.labels.rows import ERROR, KEY, LINE, SOURCE, OrphanRow, decode_text

REASON, FIRST_SOURCE, FIRST_LINE = "reason", "first_source", "first_line"
ORPHAN_COLUMNS = (KEY, SOURCE, LINE, REASON, FIRST_SOURCE, FIRST_LINE)
NO_IMAGE = "no image with this key"
# Table lines per orphan part (bounds a WriteOrphans group and the file's parts per file).
CHUNK_LINES = 100_000
# The order of orphan_labels.jsonl (OrphanRow.order).
_ORDER = [
    (FIRST_SOURCE, "ascending"),
    (FIRST_LINE, "ascending"),
    (SOURCE, "ascending"),
    (LINE, "ascending"),
    (KEY, "ascending"),
    (REASON, "ascending"),
]


def orphans_of(rows: pa.Table) -> pa.Table:
    """The orphan rows of a batch of table rows that no image matched: each row's reason (its
    error, else NO_IMAGE) and, for a key with several rows, its first row (the smallest
    (source, line) of the key; null: the row itself). Sources and reasons as dictionaries."""
    key, source, line = (rows.column(c).combine_chunks() for c in (KEY, SOURCE, LINE))
    first_source, first_line = pa.nulls(len(source), source.type), pa.nulls(len(source), pa.int64())
    counts = pc.value_counts(key)
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):  # keys with several orphan rows: their first row, key by key
        firsts: dict = {}
        again = pc.is_in(key, value_set=repeated)
        at = pc.indices_nonzero(again)
        keys = key.take(at).to_pylist()
        places = list(zip(source.take(at).to_pylist(), line.take(at).to_pylist()))
        for k, place in zip(keys, places):
            firsts[k] = min(firsts.get(k, place), place)
        first_source = pc.replace_with_mask(
            pa.nulls(len(source), pa.string()), again, pa.array([firsts[k][0] for k in keys], pa.string())
        ).dictionary_encode()
        first_line = pc.replace_with_mask(
            first_line, again, pa.array([firsts[k][1] for k in keys], pa.int64())
        )
    reason = pc.coalesce(rows.column(ERROR), NO_IMAGE).combine_chunks().dictionary_encode()
    return pa.table([key, source, line, reason, first_source, first_line], names=list(ORPHAN_COLUMNS))


def orphan_chunks(orphans: pa.Table) -> Iterator[tuple[tuple[str, int], pa.RecordBatch]]:
    """((first source, chunk of CHUNK_LINES table lines), its orphan rows) of `orphans`."""
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
    data = _text_bytes(values)
    if data.translate(None, bytes(range(32, 256))):  # a control character
        return None
    if data.translate(None, bytes(range(256)).translate(None, _ESCAPED)):
        values = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    return values.take(coded.indices) if coded is not None else values


def _text_bytes(column: pa.Array) -> bytes:
    if not len(column) or column.buffers()[2] is None:
        return b""
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    return column.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]


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
        return _text_bytes(joined)
    rows = zip(decode_text(table.column(KEY)), *(table.column(c).to_pylist() for c in (SOURCE, LINE, REASON)))
    return "".join(OrphanRow(*row).to_json() + "\n" for row in rows).encode("utf-8")
