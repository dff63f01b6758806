"""layout: splits and the shard plan, on metadata only. In: RecordBatch of labelled ImageRecords.
Out: the records with their split (AssignSplits) and ShardTask, one shard's records in write
order (PlanShards).

plan.py and strata.py are the arithmetic (pure), prescan.py the reads before the plan (pure);
beam.py, beam_strata.py and beam_prescan.py are the Beam shells. Every GroupByKey group is one
shard's metadata, or (--stratify) a pack of small classes or one hash bucket of a big class.
"""
