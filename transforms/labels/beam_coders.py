"""The coder of JoinedLabels.listed's items (RecordBatch or Failure); the labels' Arrow batches
(rows, images, orphans) go by transforms/coders.py's ArrowBatchCoder."""

from __future__ import annotations

import pickle

from transforms.coders import TupleCoder, decode_record_batch, encode_record_batch, estimate_record_batch
from transforms.failures import Failure
from transforms.records import RecordBatch


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
CODERS = {Listed: ListedCoder}
