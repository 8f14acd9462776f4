"""Trust before rollout: re-measure the best candidates (confirm), run the chosen one under the worst
workload the scenario allows (soak), check that a requested CPU offload really happened (offload).

Called by `autotuner tune` after the study loop and by `autotuner confirm` / `autotuner soak`; the
evidence is stored as trials of kind `confirm` and `soak`, read back by `analysis` (evidence.py) for
`export` and `status`.
"""
