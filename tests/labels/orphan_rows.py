"""Orphan tables as OrphanRow objects: what the tests compare against (rows.ORPHAN_COLUMNS)."""

import pyarrow as pa

from transforms.labels.rows import FIRST_LINE, FIRST_SOURCE, KEY, LINE, REASON, SOURCE, decode_text
from transforms.output.orphan_log import OrphanRow


def orphan_rows(orphans: pa.Table | pa.RecordBatch) -> list[OrphanRow]:
    """The rows of an orphan table as OrphanRows (`first`: the key's first row, or the row's own)."""
    keys = decode_text(orphans.column(KEY))
    columns = [
        orphans.column(c).cast(pa.string()) if c in (SOURCE, REASON, FIRST_SOURCE) else orphans.column(c)
        for c in (SOURCE, LINE, REASON, FIRST_SOURCE, FIRST_LINE)
    ]
    out = []
    for key, source, line, reason, first_source, first_line in zip(keys, *(c.to_pylist() for c in columns)):
        out.append(OrphanRow(key, source, line, reason, (first_source or source, first_line or line)))
    return out


def image_files(batch: pa.RecordBatch) -> list:
    """The images of a batch of FILE_COLUMNS as ImageFiles."""
    from transforms.labels.join import _image_files

    return _image_files(pa.Table.from_batches([batch]))
