"""writing: shards. In: ShardTask (one shard's records) and the ClassIndex. Out: shards written
whole into the run's temp folder (shard.py, in worker processes: processes.py), their index files
(index.py), a ShardResult each and a Failure per image not written; files.py reads, writes and
deletes files on any Beam filesystem. beam.py is the Beam shell.
"""
