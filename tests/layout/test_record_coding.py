"""The coded form of record batches: repeats taken out (a root for the paths, tables for
labels, splits and extras), every batch read back exactly, and small for tiny images."""

import pytest

from transforms import coders
from transforms.layout.plan import with_hashes
from transforms.records import FileBatch, ImageRecord, RecordBatch

ROOT = "/data/benchmarks/work/tiny-100000/"


def _tiny(n: int, classes: int = 100, root: str = ROOT) -> RecordBatch:
    """Records like memory.py --tiny's: one root, a class folder each, one split, no extras."""
    return RecordBatch(
        tuple(
            ImageRecord(
                f"{root}class_{i % classes:05d}/img_{i:07d}.jpg",
                f"class_{i % classes:05d}/img_{i:07d}.jpg",
                633,
                (f"class_{i % classes:05d}",),
                "train",
            )
            for i in range(n)
        )
    )


def _assert_round_trip(batch: RecordBatch) -> None:
    back = coders.decode_record_batch(coders.encode_record_batch(batch))
    assert back == batch and back.records == batch.records
    assert (back.hashes, back.hash_seed) == (batch.hashes, batch.hash_seed)


@pytest.mark.parametrize(
    "n, classes, label_codes",
    [(1000, 1, 0), (1000, 3, 1), (1000, 300, 2), (1000, 500, 2), (140_010, 70_000, 4), (1000, 501, None)],
)
def test_record_batches_read_back_exactly_whatever_repeats(n, classes, label_codes):
    """Labels as a table and codes of 0, 1, 2 or 4 bytes a record; mostly distinct (more
    than half the records): as they are (codes None)."""
    batch = with_hashes(_tiny(n, classes), 3)
    codes = coders.record_batch_fields(batch)[5]
    assert (None if codes is None else len(codes) // n) == label_codes
    _assert_round_trip(batch)


def test_batches_without_a_common_root_or_with_free_form_extras_read_back():
    records = (
        ImageRecord("/a/x.jpg", "x.jpg", 1, ("cat",), "train", (("source", "web"),)),
        ImageRecord("/b/y.jpg", "y.jpg", 2, ("cat", "dog"), "test", (("source", ["not", "hashable"]),)),
        ImageRecord("gs://bucket/tar.tar/member.jpg", "tar.tar/member.jpg", 3, (), "train", ()),
        ImageRecord("/a/z.jpg", "", 4, ("cat",), "train", (("source", float("nan")),)),
    )
    for batch in (RecordBatch(records), RecordBatch(records[:1]), RecordBatch(()), RecordBatch(records[1:])):
        back = coders.decode_record_batch(coders.encode_record_batch(batch))
        assert repr(back.records) == repr(batch.records)  # NaN != NaN: compared as text
        assert back.paths == batch.paths and back.extras[1:2] == batch.extras[1:2]
    _assert_round_trip(with_hashes(RecordBatch(records[:3]), 0))


def test_surrogate_names_still_round_trip_pickled():
    records = (ImageRecord("/in/x/\udcff.jpg", "x/\udcff.jpg", 30, ("x",)), *_tiny(2).records)
    batch = with_hashes(RecordBatch(records), 1)
    assert coders.encode_record_batch(batch)[:1] == b"\x01"
    _assert_round_trip(batch)


def test_tiny_image_records_are_coded_in_under_55_bytes():
    """The point: the paths (72 bytes a record here) coded as one root, labels and splits as a
    table and a byte a record. The encoded size is what the local runner holds several copies of."""
    batch = with_hashes(_tiny(1000), 0)  # 16 bytes of hashes a record included
    per_record = len(coders.encode_record_batch(batch)) / len(batch)
    columns = len(coders._FIELDS.encode((*batch.columns(), batch.hashes, batch.hash_seed))) / len(batch)
    assert per_record < 55 and columns > 2.5 * per_record  # relpaths 30 bytes, hashes 16
    files = FileBatch.from_columns(batch.paths, batch.relpaths, batch.sizes)
    assert len(coders.encode_file_batch(files)) / len(files) < 35  # the relpath (29) and size (3)
    assert coders.decode_file_batch(coders.encode_file_batch(files)) == files
    mixed = FileBatch.from_columns(("/a/1.jpg", "/b/2.jpg"), ("1.jpg", "2.jpg"), (1, 2))
    assert coders.decode_file_batch(coders.encode_file_batch(mixed)) == mixed


def test_a_decoded_batch_is_coded_as_its_root_again_through_take_slice_concat_and_new_columns():
    """Batches cut and joined from a decoded batch are coded as the original's cuts (paths as
    one root again), and read as the full paths."""
    batch = with_hashes(_tiny(300, 7), 5)
    back = coders.decode_record_batch(coders.encode_record_batch(batch))
    derived = (
        back.take([5, 3, 299, 3]),
        back.slice(10, 20),
        RecordBatch.concat([back.slice(0, 10), back.take([1, 2])]),
        back.with_columns(splits=("test",) * 300),
    )
    expected = (
        batch.take([5, 3, 299, 3]),
        batch.slice(10, 20),
        RecordBatch.concat([batch.slice(0, 10), batch.take([1, 2])]),
        batch.with_columns(splits=("test",) * 300),
    )
    for got, want in zip(derived, expected):
        assert coders.record_batch_fields(got)[:2] == (ROOT, None)
        assert coders.encode_record_batch(got) == coders.encode_record_batch(want)
        assert got == want and got.paths == want.paths and got.hashes == want.hashes
    # Joined with a batch of other paths, or given new paths: the paths are coded as they are.
    mixed = RecordBatch.concat([back.slice(0, 2), RecordBatch(_tiny(1, root="/other/").records)])
    assert (
        coders.record_batch_fields(mixed)[0] == "" and mixed.paths[2] == "/other/class_00000/img_0000000.jpg"
    )
    assert back.with_columns(paths=("/x",) * 300).paths == ("/x",) * 300
