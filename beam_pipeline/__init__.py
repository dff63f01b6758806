"""img2tfrecord: options, pipeline assembly and entry points."""

from beam_pipeline.reader import load_dataset, parse_spec

__all__ = ["load_dataset", "parse_spec"]
