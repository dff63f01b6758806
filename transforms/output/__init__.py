"""output: the folder a run owns and what it publishes there. In: an output folder and a run
id (claimed exclusively: claim.py; the marker and the claim's token, fence.py, fences every change to the folder and keeps a job's claim alive), then the
written shards' ShardResults and every Failure. Out: failures.jsonl (failure_log.py),
summary.json (summary.py), reader metadata (tfds.py), all published by renames (publish.py).
beam.py is the Beam shell.
"""
