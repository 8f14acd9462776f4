"""What a fleet saves, and what it costs the database (issue 27). Prints, last:

    boxes= engine_runs_fleet= engine_runs_independent= rollout_s= failed_adoptions= db_queries_per_poll=

Four identical simulated boxes (tests/fleet/boxes.py: each its own $AUTOTUNER_HOME, simulated GPUs and
production behind a `command` target, its daemon a real process) run twice: as a fleet on one local
PostgreSQL (pgserver), and each tuning alone on its own SQLite file. An engine run is a row of at_trials
(search, baseline, warm-start, confirm and soak runs alike) plus one production verify per deploy; each
mode ends when every box serves a verified config. rollout_s is from the winner's publication to the last
box's adoption (the canary's healthy period included). db_queries_per_poll counts the SQL statements one
idle daemon's poll adds in a fleet (heartbeat + its rollout step), on the same PostgreSQL.

`--scale 10 100 1000` then measures one poll round of N simulated members (Fleet objects in this process
on one connection to the same PostgreSQL, a rollout in flight: the canary in its healthy period) and prints
the rows the design holds, the statements per poll and the time a round takes; connections are computed
(each daemon holds one pooled connection, so N boxes hold N). Run `.venv/bin/python benchmarks/fleet.py`
(about 3 minutes on two cores; `--boxes 4 --scale 10 100 1000`). Target: the fleet spends ≤ 40 % of the
independent engine runs, every box verified.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def postgres(where: Path) -> Iterator[str]:
    import pgserver

    server = pgserver.get_server(where, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def count(url: str, sql: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar() or 0)
    except sa.exc.SQLAlchemyError:
        return 0  # a table that was never created: nothing of that kind happened
    finally:
        engine.dispose()


def deploys(url: str) -> int:
    return count(url, "SELECT count(*) FROM at_daemon_events WHERE kind = 'transition' AND from_state = 'verify' "
                      "AND to_state = 'done'")


def wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"error: {what} did not happen within {timeout:.0f} s")


def run_fleet(n: int, url: str, where: Path) -> dict[str, Any]:
    from autotuner.fleet.status import fleet_status
    from autotuner.store.db import Store
    from tests.fleet.boxes import make_box
    from tests.support.daemon import tear_down

    boxes = []
    store = Store(url)
    try:
        for i in range(n):
            box = make_box(where / f"fleet-{i}", f"box{i}", url)
            boxes.append(box)
            box.start_daemon()

        def all_adopted() -> dict[str, Any] | None:
            groups = fleet_status(store.engine)["groups"]
            if len(groups) != 1 or not groups[0]["rollouts"]:
                return None
            r = groups[0]["rollouts"][0]
            done = [a for a in r["adoptions"] if a["state"] in ("adopted", "failed")]
            return r if len(done) == n or r["state"] == "halted" else None
        rollout = wait(all_adopted, 900, "every box adopting the group's winner")
        import sqlalchemy as sa

        with store.engine.connect() as conn:
            published, last = conn.execute(sa.text(
                "SELECT r.created_at, max(a.ended_at) FROM at_fleet_rollouts r JOIN at_fleet_adoptions a "
                "ON a.rollout_id = r.id WHERE r.id = :id GROUP BY r.created_at"), {"id": rollout["id"]}).one()
        runs = count(url, "SELECT count(*) FROM at_trials") + deploys(url)
        failed = sum(a["state"] == "failed" for a in rollout["adoptions"])
        return {"runs": runs, "rollout_s": last - published, "failed": failed}
    finally:
        for box in boxes:
            tear_down(box)
        store.engine.dispose()


def run_independent(n: int, where: Path) -> int:
    import yaml

    from tests.fleet.boxes import make_box
    from tests.support.daemon import tear_down

    boxes = []
    try:
        for i in range(n):
            box = make_box(where / f"alone-{i}", f"alone{i}", "autotuner.db")
            config = yaml.safe_load((box.root / "daemon.yaml").read_text())
            del config["fleet"]  # each box on its own SQLite file, tuning alone
            (box.root / "daemon.yaml").write_text(yaml.safe_dump(config))
            boxes.append(box)
            box.start_daemon()
        urls = [f"sqlite:///{b.root / 'autotuner.db'}" for b in boxes]
        wait(lambda: all(deploys(u) >= 1 for u in urls), 900, "every box deploying its own winner")
        return sum(count(u, "SELECT count(*) FROM at_trials") + deploys(u) for u in urls)
    finally:
        for box in boxes:
            tear_down(box)


def queries_per_poll(url: str, members: int) -> tuple[float, float]:
    """One poll round of `members` idle boxes of one group with a rollout in flight (a canary still serving
    its healthy period): SQL statements per box, and seconds per round."""
    import sqlalchemy as sa

    from autotuner.fleet import rollout
    from autotuner.fleet.coordinator import Fleet
    from autotuner.fleet.tables import create, metadata

    engine = sa.create_engine(url, pool_size=1, max_overflow=0)  # a poll's statements run one after another
    create(engine)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    statements = [0]

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(*_: Any) -> None:
        statements[0] += 1

    now = time.time()
    fleets = [Fleet(engine, f"m{i}", f"prod@m{i}", lease_s=600, healthy_s=1800, hold_s=3600, clock=time.time)
              for i in range(members)]
    for f in fleets:
        f.place("g", "f", {"model": "llama-2-7b"})
        f.heartbeat({"max-num-batched-tokens": 2048}, None, True)
    rid = rollout.publish(engine, "g", "m0", {"max-num-batched-tokens": 4096}, None, "s", 1, now)
    rollout.next_step(engine, "g", "m1", 1800, 600, now)
    rollout.start(engine, rid, "m1", now)
    rollout.finish(engine, rid, "m1", True, None, now)
    statements[0] = 0
    started = time.perf_counter()
    for f in fleets[2:]:
        f.heartbeat({"max-num-batched-tokens": 2048}, None, True)
        f.pending()
    elapsed = time.perf_counter() - started
    engine.dispose()
    return statements[0] / max(1, members - 2), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=4)
    parser.add_argument("--scale", type=int, nargs="*", default=[10, 100, 1000])
    args = parser.parse_args()
    os.environ.setdefault("AUTOTUNER_DAEMON_TOKEN", "bench-token-0123456789")
    with tempfile.TemporaryDirectory(prefix="autotuner-fleet-bench-") as tmp:
        where = Path(tmp)
        with postgres(where / "pg") as url:
            independent = run_independent(args.boxes, where)
            fleet = run_fleet(args.boxes, url, where)
            per_poll, _ = queries_per_poll(url, 10)
            for n in args.scale:
                q, seconds = queries_per_poll(url, n)
                rows = n + 1 + 1 + n  # boxes, one claim, one rollout, one adoption per box
                print(f"scale boxes={n} rows={rows} statements_per_poll={q:.1f} round_s={seconds:.3f} "
                      f"connections={n} (one pooled per daemon, computed)")
    share = fleet["runs"] / max(1, independent)
    print(f"fleet engine runs / independent: {share:.0%} (target ≤ 40 %)")
    print(f"boxes={args.boxes} engine_runs_fleet={fleet['runs']} engine_runs_independent={independent} "
          f"rollout_s={fleet['rollout_s']:.1f} failed_adoptions={fleet['failed']} db_queries_per_poll={per_poll:.1f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
