"""The serialized Example must be byte-identical to TensorFlow's own deterministic serialization."""

import pytest
import tensorflow as tf

from transforms.encoding.example import serialize_example_chunks


def serialize_example(features, kinds=None):
    return b"".join(serialize_example_chunks(features, kinds))


def make_example(features):
    return tf.train.Example.FromString(serialize_example(features))


def _tf_feature(value):
    values = value if isinstance(value, list) else [value]
    if values and isinstance(values[0], (str, bytes)):
        return tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[v.encode() if isinstance(v, str) else v for v in values])
        )
    if values and isinstance(values[0], float):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


CASES = [
    {"a": 1},
    {"image/encoded": b"\x00\xff" * 300, "image/height": 480, "image/format": "jpeg"},
    {"neg": [-1, -(2**63), 2**63 - 1, 0], "f": [1.5, -0.25, 3.0e38], "s": ["서울", "a b"]},
    {"z": b"", "y": [b"", b"x"], "b": [1, 0]},
    {"big": list(range(1000)), "key/with/ünïcode": "v"},
]


@pytest.mark.parametrize("features", CASES)
def test_byte_identical_to_tensorflow(features):
    expected = tf.train.Example(
        features=tf.train.Features(feature={k: _tf_feature(v) for k, v in features.items()})
    ).SerializeToString(deterministic=True)
    assert serialize_example(features) == expected


def test_empty_lists_need_kind_and_match_tensorflow():
    expected = tf.train.Example(
        features=tf.train.Features(
            feature={
                "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[])),
                "txt": tf.train.Feature(bytes_list=tf.train.BytesList(value=[])),
                "f": tf.train.Feature(float_list=tf.train.FloatList(value=[])),
            }
        )
    ).SerializeToString(deterministic=True)
    got = serialize_example({"ids": [], "txt": [], "f": []}, {"ids": "int64", "txt": "bytes", "f": "float"})
    assert got == expected
    with pytest.raises(ValueError):
        serialize_example({"ids": []})


def test_int64_rejects_mixed_types():
    with pytest.raises(TypeError):
        serialize_example({"x": [1, "a"]}, {"x": "int64"})


def test_make_example_parses_back():
    ex = make_example({"image/height": 7, "image/class/text": ["a", "b"]})
    assert ex.features.feature["image/height"].int64_list.value == [7]
    assert list(ex.features.feature["image/class/text"].bytes_list.value) == [b"a", b"b"]


@pytest.mark.parametrize("features", CASES)
def test_chunks_join_to_the_example_and_keep_large_values_uncopied(features):
    image = bytes(range(256)) * 40
    features = {**features, "image/encoded": image, "image/filename": "c/x.jpg", "labels": [3]}
    chunks = serialize_example_chunks(features)
    assert (
        b"".join(chunks)
        == serialize_example(features)
        == make_example(features).SerializeToString(deterministic=True)
    )
    assert any(chunk is image for chunk in chunks)
