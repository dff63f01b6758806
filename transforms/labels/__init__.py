"""labels: what each image is. In: FileBatch from listing. Out: RecordBatch of ImageRecord
and Failure, plus the singleton ClassIndex. Pure: folders.py (classes), rows.py (records),
text.py, table.py, table_csv.py, cells.py (reading a table), label_map.py, join.py; Beam shells: beam*.py."""
