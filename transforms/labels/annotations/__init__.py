"""Annotation formats as readers (pure): COCO JSON, Pascal VOC XML, YOLO text files, PNG
segmentation maps and the box columns of a labels table. In: the annotation files (local or
gs://). Out: pyarrow RecordBatches of one row schema (rows.py: key, class, box, flags, mask,
declared size, map path, where, error), which the labels join gathers into one Objects a key.
"""
