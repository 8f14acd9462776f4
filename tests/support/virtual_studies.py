"""Small studies in virtual time for the trust tests: a base scenario (Llama-2-7B on one simulated RTX 4090)
with dotted-path changes, and `tune`, which runs the real Tuner over the simulator's engine core in virtual
time (a run is a fraction of a second) on real SQLite and hands back what the real confirm/soak/export code
needs. Plain helpers, imported by name by the trust test modules (tests/trust/ has no conftest)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.scoring import DEFAULT_REPLAYS
from autotuner.trust.commands import ConfirmPlan, after_tune, runner_factory
from autotuner.trust.confirm import ConfirmReport
from autotuner.trust.soak import SoakReport
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner

# Llama-2-7B on one RTX 4090, prompts up to 3000 tokens: a run takes ~0.3 s of CPU.
BASE: dict[str, Any] = {
    "name": "trust",
    "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "flags": {"max-model-len": 4096},
               "sim": {"gpu": "rtx-4090", "noise": 0.0}},
    "workload": {"requests": {"count": 24, "prompt_tokens": {"kind": "uniform", "low": 500, "high": 3000},
                              "output_tokens": 64},
                 "arrivals": {"kind": "concurrency", "concurrency": 8}},
    "objectives": [{"metric": "output_tokens_per_s", "direction": "maximize"}],
}


def scenario(**changes: Any) -> Scenario:
    """BASE with dotted-path changes, e.g. `**{"engine.sim.noise": 0.04}`."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return Scenario.model_validate(data)


@dataclass
class Tuned:
    storage: str
    store: Store
    study: str
    scenario: Scenario
    runner: VirtualRunner

    def trust(self, top: int = 3, repeats: int = 3, soak_s: float = 60.0,
              replays: int = DEFAULT_REPLAYS) -> tuple[ConfirmReport | None, SoakReport | None]:
        return asyncio.run(after_tune(self.scenario, self.store, self.study, self.runner,
                                      runner_factory(Path("."), 100_000), ConfirmPlan(top, repeats, replays), soak_s))


def tune(tmp: Path, sc: Scenario, trials: int, seed: int = 0, name: str = "study.db", prune: bool = True,
         runner: VirtualRunner | None = None) -> Tuned:
    storage = str(tmp / name)
    store = Store(storage)
    runner = runner or VirtualRunner(sc)
    summary = asyncio.run(Tuner(sc, runner, store, n_trials=trials, seed=seed, prune=prune).run())
    return Tuned(storage, store, summary.study_name, sc, runner)
