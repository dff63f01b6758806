"""listing: ListImages. In: a root (a local folder, a gs:// prefix, tar archives or globs of them).
Out: FileBatch of ImageFile (path, relpath, size), every image file once; archive members as
addresses (members.py); hidden entries never, but counted with the other files not read
(skips.py). Pure: local.py, gcs.py, archives.py, members.py, webdataset.py, skips.py; the Beam
shells: beam.py, beam_walk.py, beam_gcs.py, beam_archives.py.
"""
