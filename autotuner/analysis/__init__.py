"""What a study's trials say, read from the store: which trials can be deployed under a set of SLOs
(candidates.py), their Pareto front and knee (pareto.py), what the trust runs say (evidence.py), the
confirmed ranking (confirmed.py) and the choice with what it lacks (selection.py).

Below both trust/ and export/: `confirm` and `soak` pick their candidates here, `export`, `report` and
`status` read the same answers, and neither of those packages imports the other.
"""
