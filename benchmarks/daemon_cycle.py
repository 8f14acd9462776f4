"""What a model swap costs the daemon, on the simulator (printed, not asserted).

    .venv/bin/python benchmarks/daemon_cycle.py [--rollbacks 2] [--trials 6] [--cold-trials 20] [--twin]

1. Swap: the daemon (a real `autotuner daemon run` process) watches a simulated production (`autotuner sim
   serve` behind a `command` target, tests/daemon/prodctl.py) serving llama-2-7b on one RTX 4090, with a
   study of the scenario already in the storage. Production is switched to mistral-7b; the script waits
   for the cycle to end. swap_to_verified_s: wall time from the swap to the cycle's end (verified new
   config); the simulated hardware time of the same cycle is the sum of the engine time its trials,
   confirmation and soak runs report (virtual time: what those runs would take on the GPU, startup
   excluded) plus the wall time of the steps on production (drain, deploy, verify). downtime_s: the
   cycle's production downtime (drain to verified).
2. Warm against cold: for the swapped-to model, a cold study (no warm start) of --cold-trials trials and
   a study warm-started from the llama-2-7b study. Quality = 98 % of the cold study's best feasible
   throughput; trials_warm / trials_cold: launched trials each needed to first reach it (the budget + 1
   when never).
3. Rollbacks: --rollbacks cycles in which every new candidate fails on production (production's box has
   less free GPU memory than the tuning one, tests/daemon/prodctl.py's trusted/break files); ok = the
   cycle ended rolled-back with production verified on the previous config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def engine_time(db: Path, study: str) -> float:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT result FROM at_trials WHERE study_name = :s"), {"s": study}).all()
    engine.dispose()
    total = 0.0
    for (text,) in rows:
        duration = (json.loads(text).get("metrics") or {}).get("duration_s")
        total += float(duration or 0.0)
    return total


def first_reaching(values: list[float | None], target: float) -> int | None:
    for i, v in enumerate(values, start=1):
        if v is not None and v >= target:
            return i
    return None


def throughputs(db: Path, study: str) -> list[float | None]:
    """Launched search trials in order: their throughput when feasible, else None."""
    import sqlalchemy as sa

    from autotuner.trials.outcomes import TRUST_KINDS

    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT kind, outcome, result FROM at_trials WHERE study_name = :s "
                                    "ORDER BY trial_number"), {"s": study}).all()
    engine.dispose()
    out: list[float | None] = []
    for kind, outcome, text in rows:
        if kind in TRUST_KINDS or outcome in ("invalid-flags", "oom-predicted", "interrupted"):
            continue
        m = json.loads(text).get("metrics") or {}
        failed = m.get("failed") or 0
        out.append(m.get("output_tokens_per_s") if outcome == "ok" and not failed else None)
    return out


def swap(tmp: Path, trials: int, twin: bool = False) -> dict[str, Any]:
    from autotuner.scenario import Scenario
    from autotuner.store.db import Store
    from autotuner.tuner.runners import VirtualRunner
    from autotuner.tuner.study import Tuner
    from tests.support.daemon import SCENARIO, make_deployment, tear_down

    d = make_deployment(tmp / "swap", daemon={"tune": {"trials": trials, "timeout": "30m", "confirm": "2x2",
                                                        "soak": "20s", "twin": twin}})
    try:
        sc = Scenario.model_validate({**SCENARIO, "source": d.root / "scenario.yaml"})
        store = Store(str(d.root / "autotuner.db"))
        old = asyncio.run(Tuner(sc, VirtualRunner(sc), store, n_trials=trials).run()).study_name
        store.engine.dispose()
        d.start_daemon()
        deadline = time.monotonic() + 60
        while not d.status()["reference"] and time.monotonic() < deadline:
            time.sleep(0.2)
        t0 = time.time()
        d.swap_model("mistral-7b")
        status = d.wait_cycle_done(timeout=900)
        wall = time.time() - t0
        last = status["last_cycle"]
        import sqlalchemy as sa

        from autotuner.daemon.state import cycles, events

        engine = sa.create_engine(f"sqlite:///{d.root / 'autotuner.db'}")
        with engine.connect() as conn:
            row = conn.execute(sa.select(cycles).order_by(cycles.c.id.desc()).limit(1)).first()
            steps = {r.to_state: r.at for r in conn.execute(sa.select(events).where(
                events.c.cycle_id == row.id, events.c.kind == "transition"))} if row else {}
        engine.dispose()
        assert row is not None
        # Production steps (drain, deploy, verify) ran for real; tune and confirm ran in virtual time.
        searching = steps.get("deploy", 0.0) - steps.get("tune", 0.0)
        hardware = engine_time(d.root / "autotuner.db", last["study"]) + max(0.0, row.downtime_s - searching)
        d.stop_daemon()
        return {"outcome": last["outcome"], "wall_s": wall, "hardware_s": hardware, "downtime_s": row.downtime_s,
                "trials": last["trials"], "old_study": old, "new_study": last["study"],
                "served": d.served_root(), "db": d.root / "autotuner.db"}
    finally:
        tear_down(d)


def warm_vs_cold(old_db: Path, old_study: str, cold_trials: int) -> tuple[int, int, float]:
    from autotuner.scenario import Scenario
    from autotuner.store.db import Store
    from autotuner.tuner.runners import VirtualRunner
    from autotuner.tuner.study import Tuner
    from tests.support.daemon import SCENARIO

    db = old_db  # the swap's database: the old study is there (a copy would miss its WAL)
    data = json.loads(json.dumps(SCENARIO))
    data["engine"]["model"] = "mistral-7b"
    sc = Scenario.model_validate(data)
    store = Store(str(db))
    cold = asyncio.run(Tuner(sc, VirtualRunner(sc), store, study_name="cold", n_trials=cold_trials).run())
    warm = asyncio.run(Tuner(sc, VirtualRunner(sc), store, study_name="warm", n_trials=cold_trials,
                             warm_start=old_study).run())
    store.engine.dispose()
    del cold, warm
    cold_values, warm_values = throughputs(db, "cold"), throughputs(db, "warm")
    best = max(v for v in cold_values if v is not None)
    target = 0.98 * best
    n_cold = first_reaching(cold_values, target) or cold_trials + 1
    n_warm = first_reaching(warm_values, target) or cold_trials + 1
    return n_warm, n_cold, target


def rollback(tmp: Path, i: int, trials: int) -> bool:
    from tests.support.daemon import INITIAL, make_deployment, tear_down

    d = make_deployment(tmp / f"rollback{i}", daemon={
        "triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "2s"}},
        "min_interval_s": 3600, "tune": {"trials": trials, "timeout": "30m", "confirm": "2x2", "soak": "20s"}})
    try:
        (d.root / "trusted.yaml").write_bytes(d.config_file.read_bytes())
        (d.root / "break_args.json").write_text(json.dumps(["--gpu-memory-utilization", "0.3"]))
        d.start_daemon()
        status = d.wait_cycle_done(timeout=900)
        ok = (status["last_cycle"]["outcome"] == "rolled-back" and d.live_config() == INITIAL == d.running_config()
              and d.production_healthy())
        print(f"rollback {i + 1}: {status['last_cycle']['outcome']}, production on the previous config and "
              f"healthy: {ok}", flush=True)
        d.stop_daemon()
        return ok
    finally:
        tear_down(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--cold-trials", type=int, default=20)
    parser.add_argument("--rollbacks", type=int, default=2)
    parser.add_argument("--twin", action="store_true", help="the daemon's re-tune searches the calibrated twin")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="daemon-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["AUTOTUNER_HOME"] = str(tmp / "home")
        os.environ["AUTOTUNER_SIM_STATE_DIR"] = str(tmp / "gpus")
        s = swap(tmp, args.trials, args.twin)
        print(f"swap llama-2-7b → mistral-7b: cycle {s['outcome']}, production serves {s['served']}; "
              f"{s['trials']} trials{' (twin-first)' if args.twin else ''} (warm start from {s['old_study']}); "
              f"wall {s['wall_s']:.1f} s from the swap "
              f"to the verified config; simulated hardware time {s['hardware_s']:.1f} s (engine time of the "
              f"cycle's runs + production steps); production down {s['downtime_s']:.1f} s", flush=True)
        n_warm, n_cold, target = warm_vs_cold(s["db"], s["old_study"], args.cold_trials)
        print(f"mistral-7b to 98 % of the cold study's best ({target:.1f} tok/s): warm start {n_warm} trials, "
              f"cold {n_cold} trials (budget {args.cold_trials}; budget + 1 = never)", flush=True)
        oks = [rollback(tmp, i, args.trials) for i in range(args.rollbacks)]
    print(f"swap_to_verified_s={s['wall_s']:.1f} downtime_s={s['downtime_s']:.1f} hardware_s={s['hardware_s']:.1f} "
          f"trials_cycle={s['trials']} trials_warm={n_warm} "
          f"trials_cold={n_cold} rollbacks_ok={sum(oks)}/{len(oks)}")


if __name__ == "__main__":
    main()
