"""What a cycle would do and why, changing nothing: `autotuner daemon plan CONFIG` (= `daemon run --once
--dry-run`), and `init`'s check that the config it wrote can complete a cycle on this box."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from autotuner.daemon.config import load_config
from autotuner.daemon.cycle_search import TUNE_SHARE
from autotuner.daemon.drain import drain_plan


@dataclass
class CyclePlan:
    can_complete: bool
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def plan_cycle(config_path: Path, *, probe_production: bool = True) -> CyclePlan:
    """UserInputError (exit 2) for a config that does not load; otherwise the plan, with `problems` saying
    what keeps a cycle from completing and how to fix it."""
    from autotuner.deploy import make_target

    loaded = load_config(config_path)
    config, scenario = loaded.config, loaded.scenario
    target = make_target(config.deploy)
    plan = CyclePlan(True)
    say = plan.lines.append
    say(f"deployment {scenario.name}: scenario {config.scenario_path}, storage {_shown(loaded.storage_url)}")
    if probe_production:
        from autotuner.watch.probe import probe

        snap = asyncio.run(probe(config.production.endpoint, api_key_env=config.production.api_key_env,
                                 timeout_s=5.0))
        if snap.reachable:
            say(f"production {config.production.endpoint}: serves {snap.served_model} ({snap.root}), vLLM "
                f"{snap.vllm_version}, max_model_len {snap.max_model_len}")
        else:
            say(f"production {config.production.endpoint}: not reachable now ({snap.error}); the daemon starts it "
                "on the live config" + ("" if target.can_take_down else " — it cannot: the target has no start"))
    drain, why = drain_plan(scenario, config, target)
    say(f"tune: {why}")
    if drain and not target.can_take_down:
        plan.can_complete = False
        plan.problems.append(f"{why}: add deploy.stop and deploy.start (argv lists that stop and start "
                             "production), or give the scenario engine.gpus that production does not use and list "
                             "production's in production.gpus")
    budget = [f"{config.tune.trials} trials", f"timeout {config.tune.timeout}", f"confirm {config.tune.confirm}",
              f"soak {config.tune.soak}"]
    if drain and config.max_downtime_s is not None:
        budget.append(f"within max_downtime {config.max_downtime} (the search gets {TUNE_SHARE:.0%} of it; the "
                      "soak shrinks to fit, and the cycle stops early with production back up when it cannot)")
    elif drain:
        budget.append("no max_downtime: production may be down for the whole tune")
    say("budget: " + ", ".join(budget))
    say(f"window: {config.window}" if config.window else "window: any time (no window set)")
    if config.approve == "manual" or not target.can_take_down:
        say("rollout: the cycle stops at `proposed`; `autotuner daemon approve CONFIG CYCLE` deploys it"
            + ("" if target.can_take_down else " (the file target writes it; a person restarts production)"))
    else:
        say(f"rollout: deploy through the {target.kind} target, verify production, roll back on failure")
    say("production first: a crash or OOM is restored at once (emergency mitigation), whatever the window")
    return plan


def _shown(url: str) -> str:
    from autotuner.secrets import display_url

    return display_url(url)
