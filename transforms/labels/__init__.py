"""labels: what each image is. In: FileBatch from listing. Out: RecordBatch of ImageRecord
and Failure, plus the singleton ClassIndex. Pure: folders.py, classes.py, rows.py (records),
table.py (parsing), label_map.py, join.py; Beam shells: beam*.py."""
