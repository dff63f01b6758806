"""Coders of what the labels stage sends through a shuffle: Arrow batches (rows, images and
orphans: one Arrow IPC coder), and JoinedLabels.listed's items (RecordBatch or Failure).

In: pyarrow RecordBatches, and RecordBatch | Failure. Out: bytes. A batch is one Arrow IPC
stream (its schema, then its buffers as they are in memory: no value is converted or copied
into Python objects), decoded without a copy out of the bytes Beam hands over; a column null in
every row is sent as its type alone.
"""

from __future__ import annotations

import pickle

import pyarrow as pa

from transforms.coders import TupleCoder, decode_record_batch, encode_record_batch, estimate_record_batch
from transforms.failures import Failure
from transforms.records import RecordBatch

# Schema metadata of a batch coded with its all-null columns left out: the batch's own schema.
_SCHEMA = b"img2tfrecord.schema"


def encode_arrow_batch(batch: pa.RecordBatch) -> bytes:
    """One Arrow IPC stream; a column that is null in every row (a table without a split
    column, rows without errors) goes as Arrow's null type, with no buffers at all."""
    empty = [i for i, c in enumerate(batch.columns) if c.null_count == len(c) > 0 and c.type != pa.null()]
    if empty:
        schema = batch.schema
        columns = [pa.nulls(len(c)) if i in empty else c for i, c in enumerate(batch.columns)]
        fields = [pa.field(f.name, pa.null()) if i in empty else f for i, f in enumerate(schema)]
        meta = {**(schema.metadata or {}), _SCHEMA: schema.serialize().to_pybytes()}
        batch = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, metadata=meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_arrow_batch(data: bytes) -> pa.RecordBatch:
    batch = pa.ipc.open_stream(data).read_next_batch()
    meta = batch.schema.metadata or {}
    if _SCHEMA not in meta:
        return batch
    schema = pa.ipc.read_schema(pa.py_buffer(meta[_SCHEMA]))
    columns = [
        pa.nulls(batch.num_rows, f.type) if c.type != f.type else c for c, f in zip(batch.columns, schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class ArrowBatchCoder(TupleCoder):
    _type, _encode, _decode = pa.RecordBatch, encode_arrow_batch, decode_arrow_batch
    _estimate = lambda batch: 512 + batch.nbytes  # noqa: E731


class Listed:
    """Type of the elements of JoinedLabels.listed: RecordBatches and Failures (ListedCoder)."""


def encode_listed(item: RecordBatch | Failure) -> bytes:
    if type(item) is RecordBatch:
        return b"R" + encode_record_batch(item)
    return b"P" + pickle.dumps(item, protocol=4)


def decode_listed(data: bytes) -> RecordBatch | Failure:
    return decode_record_batch(data[1:]) if data[:1] == b"R" else pickle.loads(data[1:])


def estimate_listed(item: RecordBatch | Failure) -> int:
    return estimate_record_batch(item) if type(item) is RecordBatch else 200


class ListedCoder(TupleCoder):
    _type, _encode, _decode, _estimate = Listed, encode_listed, decode_listed, estimate_listed


# Record type -> its coder (registered by beam_pipeline/pipeline.py `register_coders`).
CODERS = {Listed: ListedCoder, pa.RecordBatch: ArrowBatchCoder}
