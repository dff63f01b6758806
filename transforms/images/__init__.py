"""images: one image, read, checked and converted (pure). In: a path (or archive member address)
and ImageOptions. Out: the bytes to store and the ImageInfo TensorFlow will decode, or an
ImageError / ReadError with the reason. read.py (+ prefetch.py, limits.py) reads; check.py
(+ jpeg.py, gif.py, webp.py) checks as TensorFlow 2.21 decodes; convert.py converts;
decoding.py says how the dataset's readers decode what is stored; types.py holds the records.
"""
