"""Before a launch: the candidates not worth an engine run, and the candidates worth one next.

`Screening.check` rejects a candidate that breaks vLLM's flag rules or would pin more host RAM than
there is (invalid-flags), or that the memory model says runs out of memory (oom-predicted; a search
candidate is then repaired: the nearest config likely to serve is queued in its place).
`Screening.probe_wall` queues the first trials after the baseline where the memory model learns the
wall fastest. Neither launches anything: the study loop does, with what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.trials.outcomes import SCREENED, Outcome, TrialKind
from autotuner.trials.result import TrialResult
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.host_ram import host_ram_problem
from autotuner.tuner.memory_model import MemoryModel
from autotuner.tuner.memory_repair import repair
from autotuner.tuner.space import FlagRules, Space
from autotuner.vllm import FlagValue

# Trials after the baseline placed by the memory model to pin the wall.
WALL_PROBES = 2


@dataclass
class Screening:
    scenario: Scenario
    rules: FlagRules
    space: Space
    memory: MemoryModel

    def check(self, study: optuna.Study, trial: optuna.Trial, kind: str,
              merged: dict[str, FlagValue]) -> TrialResult | None:
        """The result of a candidate that is not launched (its reasons on the trial), or None: launch it."""
        violation = self.rules.violation(merged) or host_ram_problem(self.scenario, merged)
        if violation is not None:
            return TrialResult(Outcome.INVALID_FLAGS, violation, merged, [])
        wall = self.memory.screen(merged) if kind in SCREENED else None
        if wall is None:
            return None
        result = TrialResult(Outcome.OOM_PREDICTED, f"not launched: {wall.reason}", merged, [])
        for name, value in wall.to_attrs().items():
            trial.set_user_attr(name, value)
        nearest = repair(self.memory, self.space, merged) if kind == TrialKind.SEARCH else None
        if nearest is not None:  # measured next, in the sampler's place
            study.enqueue_trial(self.space.clamp(nearest), user_attrs={"kind": TrialKind.REPAIRED,
                                                                       "repaired_from": trial.number})
        return result

    def probe_wall(self, study: optuna.Study) -> None:
        """The first trials after the baseline go where the memory model learns the wall fastest (just
        under it, where the best configs usually are too), instead of random spots in a space that is
        half OOM."""
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials) or not launched_trials(study):
            return
        probes = sum(t.user_attrs.get("kind") == TrialKind.PROBE for t in trials)
        if probes >= WALL_PROBES:
            return
        baseline = next((t for t in trials if t.user_attrs.get("kind") == TrialKind.BASELINE), None)
        base = {**self.scenario.engine.flags, **(self.space.to_flags(baseline.params) if baseline else {})}
        flags = self.memory.probe(self.space, base, probes) or self.memory.probe(self.space, base, probes + 1)
        if flags is not None:
            study.enqueue_trial(self.space.clamp(flags), user_attrs={"kind": TrialKind.PROBE})
