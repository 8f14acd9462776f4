"""The fleet's decisions as database rows, on real SQLite and real PostgreSQL: one box wins a group's
claim, a lease that runs out is taken over with its study, a canary goes first and the rest follow after
its healthy period, a failed adoption halts the group. Time is passed in, never waited for."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.engine import Engine

from autotuner.daemon.config import DaemonConfigError, FleetSettings, load_config
from autotuner.fleet import lease, rollout
from autotuner.fleet.coordinator import WARM_START, Fleet, Retune
from autotuner.fleet.membership import Member, family_study, heartbeat
from autotuner.fleet.status import fleet_status, render
from autotuner.store.db import Store
from tests.support.daemon import SCENARIO

GROUP, FAMILY = "g1", "f1"
FLAGS = {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.9}


def member(box: str, healthy: bool, at: float, group: str = GROUP) -> Member:
    return Member(box, group, FAMILY, f"prod@{box}", {"model": "m"}, FLAGS, None, healthy, at)


def test_one_box_wins_the_claim_when_many_ask_at_once(engine: Engine) -> None:
    barrier = threading.Barrier(6)
    won: list[str] = []

    def ask(box: str) -> None:
        barrier.wait()
        if lease.claim(engine, GROUP, FAMILY, box, ttl_s=60, now=100.0) is not None:
            won.append(box)

    threads = [threading.Thread(target=ask, args=(f"box{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    held = lease.current(engine, GROUP)
    assert held is not None and held.holder == won[0] and held.state == lease.TUNING
    # The same race once the row exists: renewal by its holder, refusal of the others.
    assert lease.claim(engine, GROUP, FAMILY, won[0], 60, 120.0) is not None
    assert lease.claim(engine, GROUP, FAMILY, "late", 60, 130.0) is None


def test_a_lease_that_runs_out_is_taken_over_with_its_study(engine: Engine) -> None:
    assert lease.claim(engine, GROUP, FAMILY, "a", ttl_s=30, now=0.0) is not None
    assert lease.renew(engine, GROUP, "a", 30, 10.0, study="s-a")
    assert lease.claim(engine, GROUP, FAMILY, "b", 30, 39.0) is None  # renewed at 10: good until 40
    taken = lease.claim(engine, GROUP, FAMILY, "b", 30, 41.0)
    assert taken is not None and taken.holder == "b" and taken.taken_over_from == "a" and taken.study_name == "s-a"
    assert not lease.renew(engine, GROUP, "a", 30, 42.0)  # a, back from the dead, no longer holds it
    # After a successful tune the claim is held for the group's interval: nobody re-tunes meanwhile.
    lease.finish(engine, GROUP, "b", ok=True, hold_s=100, now=50.0)
    assert lease.claim(engine, GROUP, FAMILY, "c", 30, 149.0) is None
    fresh = lease.claim(engine, GROUP, FAMILY, "c", 30, 151.0)
    assert fresh is not None and fresh.study_name is None and fresh.taken_over_from is None
    # A failed tune frees the claim at once.
    lease.finish(engine, GROUP, "c", ok=False, hold_s=100, now=160.0, reason="no feasible config")
    assert lease.claim(engine, GROUP, FAMILY, "a", 30, 160.5) is not None


def test_canary_first_then_the_rest_after_its_healthy_period(engine: Engine) -> None:
    rid = rollout.publish(engine, GROUP, "a", FLAGS, {"trial": 3}, "s-a", 3, now=0.0)
    for box in ("a", "b", "c"):
        heartbeat(engine, member(box, True, 0.0))
    assert rollout.next_step(engine, GROUP, "a", 60, 300, 1.0) is None  # it tuned it: adopted already
    canary = rollout.next_step(engine, GROUP, "b", 60, 300, 1.0)
    assert canary is not None and canary.adopt and canary.canary and canary.rollout.flags == FLAGS
    waiting = rollout.next_step(engine, GROUP, "c", 60, 300, 2.0)
    assert waiting is not None and not waiting.adopt and "canary b" in waiting.why
    assert rollout.start(engine, rid, "b", 3.0) and not rollout.start(engine, rid, "b", 3.5)
    rollout.finish(engine, rid, "b", ok=True, reason=None, now=10.0)
    heartbeat(engine, member("b", True, 50.0))
    early = rollout.next_step(engine, GROUP, "c", 60, 300, 50.0)
    assert early is not None and not early.adopt and "40 of 60 s" in early.why
    follow = rollout.next_step(engine, GROUP, "c", 60, 300, 71.0)
    assert follow is not None and follow.adopt and not follow.canary
    assert rollout.latest(engine, GROUP).state == rollout.ROLLING  # type: ignore[union-attr]


def test_a_failed_adoption_keeps_the_config_and_halts_the_group(engine: Engine) -> None:
    rid = rollout.publish(engine, GROUP, "a", FLAGS, None, "s-a", 1, now=0.0)
    step = rollout.next_step(engine, GROUP, "b", 60, 300, 1.0)
    assert step is not None and step.canary
    rollout.start(engine, rid, "b", 1.0)
    rollout.finish(engine, rid, "b", ok=False, reason="verify failed: 2 of 8 requests failed", now=5.0)
    halted = rollout.latest(engine, GROUP)
    assert halted is not None and halted.state == rollout.HALTED
    assert halted.reason == "b: verify failed: 2 of 8 requests failed"
    assert rollout.next_step(engine, GROUP, "c", 0, 300, 1000.0) is None  # nobody else adopts it


def test_a_canary_unhealthy_after_adopting_halts_the_group(engine: Engine) -> None:
    rid = rollout.publish(engine, GROUP, "a", FLAGS, None, "s-a", 1, now=0.0)
    rollout.next_step(engine, GROUP, "b", 60, 300, 1.0)
    rollout.start(engine, rid, "b", 1.0)
    rollout.finish(engine, rid, "b", ok=True, reason=None, now=5.0)
    heartbeat(engine, member("b", False, 20.0))
    assert rollout.next_step(engine, GROUP, "c", 60, 300, 30.0) is None
    assert "not serving healthily" in (rollout.latest(engine, GROUP).reason or "")  # type: ignore[union-attr]


def test_a_box_with_less_memory_free_retunes_instead_of_adopting(engine: Engine) -> None:
    """The same GPUs, but another process holds 3 GiB more on one of them than on the box that tuned: the
    winner's headroom above its utilization was not soaked there. That box declines (the rollout goes on
    for the others) and tunes for itself from the group's study; 0.5 GiB more is within the estimate's error."""
    gib = 1 << 30
    rid = rollout.publish(engine, GROUP, "a", FLAGS, None, "s-a", 1, now=0.0, foreign_bytes=gib // 4)
    fleets = {box: Fleet(engine, box, f"prod@{box}", lease_s=30, healthy_s=60, hold_s=100, clock=lambda: 5.0)
              for box in ("b", "c")}
    for f in fleets.values():
        f.place(GROUP, FAMILY, {"model": "m"})
        f.heartbeat(FLAGS, None, healthy=True)
    busy = fleets["b"].pending(foreign_bytes=gib // 4 + 3 * gib)
    assert isinstance(busy, Retune), busy
    assert busy.evidence()[WARM_START] == "s-a" and "3072 MiB more than on a" in busy.why
    assert fleets["b"].pending(foreign_bytes=gib // 4 + 3 * gib) is None  # answered once: not asked again
    near = fleets["c"].pending(foreign_bytes=gib // 4 + gib // 2)
    assert isinstance(near, rollout.Step) and near.adopt and near.canary  # b's decline left the canary free
    doc = fleet_status(engine, GROUP)["groups"][0]["rollouts"][0]
    assert doc["state"] == rollout.CANARY and doc["foreign_mib"] == 256
    assert {a["box"]: a["state"] for a in doc["adoptions"]} == {"a": "adopted", "b": "retuned"}
    assert rid == doc["id"]


def test_other_gpus_tune_their_own_group_warm_started_from_the_family(engine: Engine) -> None:
    clock = [0.0]
    a = Fleet(engine, "a", "prod@a", lease_s=30, healthy_s=60, hold_s=3600, clock=lambda: clock[0])
    d = Fleet(engine, "d", "prod@d", lease_s=30, healthy_s=60, hold_s=3600, clock=lambda: clock[0])
    a.place(GROUP, FAMILY, {})
    d.place("g-other-gpus", FAMILY, {})
    assert a.ask_to_tune().tune
    a.renew("s-a")
    answer = d.ask_to_tune()  # not a's group: its own claim, and a's study to start from
    assert answer.tune and answer.warm_start == "s-a"
    a.tune_ended(True, None, FLAGS, None, "s-a", 2)
    assert d.pending() is None  # never a's winner
    assert family_study(engine, FAMILY, GROUP) is None  # d has no study yet


def test_status_of_a_storage_without_a_fleet_writes_nothing(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "plain.db"))
    assert fleet_status(store.engine) == {"groups": []}
    assert render(fleet_status(store.engine)) == "no fleet in this storage"
    assert not sa.inspect(store.engine).has_table("at_fleet_claims")
    store.engine.dispose()



def load_fleet(tmp_path: Path, fleet: dict[str, object]) -> FleetSettings | None:
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    config = {"scenario": "scenario.yaml", "production": {"endpoint": "http://127.0.0.1:8000"},
              "deploy": {"kind": "file", "config_path": "tuned.yaml"}, "fleet": fleet}
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump(config))
    return load_config(tmp_path / "daemon.yaml").config.fleet


def test_the_fleet_section_of_a_daemon_config(tmp_path: Path) -> None:
    fleet = load_fleet(tmp_path, {"box": "gpu-07", "lease_s": "10m", "soak_s": "90s"})
    assert fleet is not None
    assert (fleet.box, fleet.lease_s, fleet.canary_healthy_s, fleet.soak_s) == ("gpu-07", 600, 1800, 90)
    default = load_fleet(tmp_path, {})
    assert default is not None and default.box == socket.gethostname()
    with pytest.raises(DaemonConfigError, match=r"daemon\.yaml:\d+: fleet\.box"):
        load_fleet(tmp_path, {"box": "-a; rm"})
    with pytest.raises(DaemonConfigError, match=r"fleet\.lease_s"):
        load_fleet(tmp_path, {"lease_s": "0s"})
