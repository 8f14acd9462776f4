"""What a trial is, below everything that runs or reads trials: its outcomes and kinds, its result
record, and the rules that score it (constraints, feasibility, which trials count).

The tuner, trust, analysis and export all read these; nothing here runs an engine or opens a study.
"""
