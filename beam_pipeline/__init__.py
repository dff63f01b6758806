"""img2tfrecord: options, pipeline assembly and entry points."""
