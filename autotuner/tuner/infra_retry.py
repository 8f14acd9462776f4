"""One candidate measured through the trial runner, with the machine's faults told apart from the
candidate's: an internal error or an infrastructure failure is retried once; a machine fault that
no retry would change (see breaker.py) is marked infrastructure at once, for the circuit breaker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from autotuner.engine.gpu_locks import GpusBusyError
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import Phase, TrialResult
from autotuner.tuner.breaker import machine_fault_reason
from autotuner.tuner.pruning import Pruner
from autotuner.tuner.runners import TrialRunner
from autotuner.vllm import FlagValue

log = structlog.get_logger(__name__)

ATTEMPTS = 2


async def measure_with_retry(runner: TrialRunner, scenario: Scenario, flags: dict[str, FlagValue], phase: Phase,
                             gpus: Sequence[int] | None, pruner: Pruner | None,
                             measuring: set[asyncio.Future[TrialResult]]) -> TrialResult:
    """The candidate's result. Raises only what no other candidate could do better (bad input, busy
    GPUs). Each attempt's task is in `measuring` while it runs, so that a stop request can cancel it."""
    for attempt in range(1, ATTEMPTS + 1):
        task = asyncio.ensure_future(runner.run(flags, phase, gpus=gpus, pruner=pruner))
        measuring.add(task)
        try:
            result = await task
        except (UserInputError, GpusBusyError):
            raise  # nothing the next candidate could do better: end the study with the message
        except Exception as exc:  # a fault of ours or of the machine, not of the candidate
            log.exception("trial.internal_error", flags=flags)
            result = TrialResult(Outcome.CRASH, f"internal error: {type(exc).__name__}: {exc}",
                                 {**scenario.engine.flags, **flags}, [], infrastructure=True)
        finally:
            measuring.discard(task)
        machine = None if result.infrastructure else _machine_fault(result)
        if machine is not None:
            # Not the candidate's fault, and no retry would change it: a FAIL trial for the breaker.
            result.infrastructure = True
            result.reason = f"{result.reason}: {machine}" if result.reason and machine not in result.reason \
                else machine
            return result
        if not result.infrastructure or attempt == ATTEMPTS:
            return result
        log.warning("trial.infrastructure_retry", reason=result.reason)
    raise AssertionError("unreachable")


def _machine_fault(result: TrialResult) -> str | None:
    """The machine's fault in a failed engine start or run (see breaker.py), or None when the
    candidate may be to blame. Memory failures are always the candidate's."""
    if result.outcome not in (Outcome.CRASH, Outcome.STARTUP_FAILED):  # a slow start (timeout) is not a broken one
        return None
    if "memory" in (result.reason or "").lower():
        return None
    return machine_fault_reason(result.reason, result.log_tail)
