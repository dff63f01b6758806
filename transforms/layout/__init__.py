"""layout: splits and the shard plan, on metadata only. In: RecordBatches of labelled ImageRecords.
Out: the records with their split (AssignSplits) and ShardTasks, one shard's records in write
order (PlanShards). plan.py, strata.py and prescan.py are pure; the beam*.py modules their shells.
"""
