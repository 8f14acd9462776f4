"""Every way a trial can end (`Outcome`) and every reason a trial exists (`TrialKind`), with the
groups of them the rules ask about.

String enums: a member compares equal to the string stored in the database and in Optuna's user
attributes, and serialises as it, so what was stored before these names existed still reads the same.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """How a trial ended."""

    OK = "ok"
    # The engine's failures, read from its log and from what we saw (engine/classify.py).
    OOM_THRESHOLD = "oom-threshold"
    OOM_CRASH = "oom-crash"
    STARTUP_FAILED = "startup-failed"
    INVALID_FLAGS = "invalid-flags"
    TIMEOUT = "timeout"
    CRASH = "crash"
    # Machine faults, never the candidate's: no memory evidence (the sampler failed), and another
    # process's GPU memory grew during the trial. Both are retried, never feasible, never exported.
    MONITOR_FAILED = "monitor-failed"
    INTERFERENCE = "interference"
    # The study's own verdicts, never the engine's: a candidate the memory model rules out (recorded, never
    # launched, no engine time) and a trial stopped during its workload because it could not reach the
    # Pareto front or already missed the SLO by a wide margin (an engine run, partial metrics kept). Both
    # are infeasible: never selected, never exported as a winner.
    OOM_PREDICTED = "oom-predicted"
    PRUNED = "pruned"
    # Never measured: the tuner was asked to stop (the candidate is queued again), or the GPUs were
    # taken when the trial would have started (the study stops with the message).
    INTERRUPTED = "interrupted"
    GPUS_BUSY = "gpus-busy"


class TrialKind(StrEnum):
    """Why a trial was run."""

    BASELINE = "baseline"  # vLLM's defaults for this GPU: trial 0
    CURRENT = "current"  # the user's own config (scenario.current_config)
    WARM_START = "warm-start"  # another study's best configs, after a model swap
    SEARCH = "search"  # the sampler's candidate
    REPAIRED = "repaired"  # the nearest config the memory model lets through, in a ruled-out search's place
    PROBE = "probe"  # placed by the memory model to learn the wall
    TWIN = "twin"  # a finalist of the calibrated twin's search (autotuner.twin)
    CONFIRM = "confirm"  # a re-measurement of a candidate (trust)
    SOAK = "soak"  # the chosen candidate under the worst workload (trust)
    # A confirmed candidate refused on its memory peak alone, with less utilization (analysis/backoff.py):
    # a candidate, run by the trust phase after the search.
    BACKOFF = "backoff"


# Re-measurements: evidence about candidates, never candidates, never counted in the search budget.
TRUST_KINDS = (TrialKind.CONFIRM, TrialKind.SOAK)
# Run by the trust phase after the search: never counted in the search's budget.
AFTER_SEARCH = (*TRUST_KINDS, TrialKind.BACKOFF)
# Candidates the memory model may rule out before launch (the baseline, the user's own config and warm
# starts are measured whatever it says: they are references).
SCREENED = (TrialKind.SEARCH, TrialKind.REPAIRED, TrialKind.TWIN)
# The memory wall was hit: the threshold tripped, or CUDA ran out.
OOM_OUTCOMES = (Outcome.OOM_THRESHOLD, Outcome.OOM_CRASH)
# The engine never served: nothing measured but that it did not start.
NOT_SERVED = (Outcome.STARTUP_FAILED, Outcome.INVALID_FLAGS, Outcome.TIMEOUT, Outcome.CRASH)
