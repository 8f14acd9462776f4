"""The daemon under seeded faults, measured from outside (printed, not asserted).

    .venv/bin/python benchmarks/daemon_chaos.py [--cycles 8] [--seed 0] [--speedup 50] [--max-wall-s 480]

A real `autotuner daemon run` process watches a simulated production (`autotuner sim serve` llama-2-7b on one
RTX 4090 behind a `command` target, tests/daemon/prodctl.py, as tests/support/daemon.py sets it up: the
scenario of tests/daemon/test_cycle.py's OOM story, short prompts, and a hand-made config with a large token
budget). Short prompts like the scenario's are sent all along, one at a time. Every 12-30 s (seeded) the
benchmark injects one fault, each kind once first, in a seeded order:

- foreign-memory: `python -m autotuner sim hold --gpu 0 --mib N` appears, and is killed (by its PID) later;
- oom: a burst of long prompts at once, which OOMs a config with too large a token budget;
- crash: the maintenance window closed (SIGHUP), then production's process group SIGKILLed (its PID file);
  the window opens again later;
- daemon-kill: the daemon's process group SIGKILLed at a seeded step (tune, confirm, deploy, verify, any),
  then started again;
- refused: production's box turns against new configs (prodctl's trusted.yaml + break_args.json: any config
  but the one running now starts at utilization 0.3 and dies), until the next cycle has ended;
- window: SIGHUP with a window that closes a few seconds later, open again later;
- drift: production traffic of longer prompts than the scenario's (sequential: no OOM).

The cycles come from those faults and from a `schedule` trigger. The run ends after --cycles cycles or
--max-wall-s. What is measured is measured from outside: production's /health polled every 0.25 s, the
faults and long prompts the benchmark sent, the OOMs it read in production's log (vLLM's scheduler dump),
GET /status during the run and the daemon's database after it (cycles and transitions, refusals, soak
trials). See benchmarks/chaos_figures.py for what each figure counts. The last line:

    cycles= faults= unplanned_down_s= unplanned_down_share= cycles_ending_down= max_time_to_serving_s=
    redeployed_refused= drift_false_triggers= oom_prompts_replayed=<replayed>/<production OOMs>

max_time_to_serving_s is in simulated seconds: the wall time of the longest unplanned outage (first down
sample to first up sample) with one engine start's wall time (measured here before the run, most of it
Python's imports) replaced by the start the simulator models (`init engine ... took N seconds` in its log,
~26 s for this model); the daemon's own waits are real time on a real box too. The line before it gives
the wall seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import chaos_figures as fig  # noqa: E402

KINDS = ("foreign-memory", "oom", "crash", "daemon-kill", "refused", "window", "drift")
KILL_STEPS = ("tune", "confirm", "deploy", "verify", "any")
DRIFT_WINDOW_S = 30.0
# The OOM story of tests/daemon/test_cycle.py: the scenario was written for short prompts; production's
# hand-made config has a token budget that survives one long prompt at a time, not a burst of them.
INITIAL = {"max-model-len": 4096, "max-num-batched-tokens": 3072, "gpu-memory-utilization": 0.93}
OUTPUT_TOKENS = 32


@dataclass
class Chaos:
    d: Any  # tests.support.daemon.Deployment
    rng: random.Random
    speedup: float
    samples: list[fig.Sample] = field(default_factory=list)
    states: list[tuple[float, str]] = field(default_factory=list)  # GET /status: (time, cycle state)
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (time, kind, what)
    long_traffic: list[tuple[float, float]] = field(default_factory=list)
    ooms: list[fig.Oom] = field(default_factory=list)
    pending: list[tuple[float, str, Any]] = field(default_factory=list)  # undo actions: (due, what, arg)
    holders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    window: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    log_offset: int = 0
    start_ooms: int = 0
    prompt_seed: int = 0
    window_cuts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- watching from outside ------------------------------------------------------------------------
    def poll_health(self) -> None:
        with httpx.Client(trust_env=False, timeout=1.0) as http:
            while not self.stop.is_set():
                try:
                    up = http.get(self.d.endpoint + "/health").status_code == 200
                except httpx.HTTPError:
                    up = False
                self.samples.append(fig.Sample(time.time(), up))
                self.stop.wait(0.25)

    def poll_status(self) -> None:
        while not self.stop.is_set():
            try:
                s = self.d.status()
                self.states.append((time.time(), (s.get("cycle") or {}).get("state") or s.get("state") or "?"))
            except (httpx.HTTPError, OSError):
                self.states.append((time.time(), "?"))  # the daemon is dead, or a trial holds its loop
            self.stop.wait(0.5)

    def state(self) -> str:
        return self.states[-1][1] if self.states else "?"

    def background(self) -> None:
        """Production's normal traffic: prompts like the scenario's (100-600 tokens), one at a time."""
        rng = random.Random(self.rng.random())
        with httpx.Client(trust_env=False, timeout=30) as http:
            while not self.stop.is_set():
                n = rng.randint(100, 600)
                with contextlib.suppress(httpx.HTTPError):
                    http.post(self.d.endpoint + "/v1/completions", json={
                        "model": "llama-2-7b", "prompt": self.prompt(n), "max_tokens": OUTPUT_TOKENS,
                        "ignore_eos": True})
                self.stop.wait(1.0)

    def prompt(self, n: int) -> list[int]:
        """n token ids no earlier prompt starts with (a prompt seen before would hit the prefix cache)."""
        with self.lock:
            self.prompt_seed += 1
            seed = self.prompt_seed
        return [(7919 * seed + 7 * j + seed * j) % 31000 + 100 for j in range(n)]

    def watch_log(self) -> None:
        while not self.stop.is_set():
            self.read_ooms()
            self.stop.wait(0.25)

    def read_ooms(self) -> None:
        """New CUDA OOMs in production's log, each with its crashing step's request lengths."""
        from autotuner.watch.scheduler_dump import crash_steps

        path = self.d.root / "vllm.log"
        if not path.is_file():
            return
        with open(path, "rb") as f:
            f.seek(self.log_offset)
            text = f.read().decode(errors="replace")
        cut = text.rfind("\n") + 1  # only whole lines: a dump being written is read next time
        if cut <= 0:
            return
        self.log_offset += len(text[:cut].encode())
        # vLLM dumps the crashing step, then raises the OOM: each OOM's dump is in the text before it.
        pieces = text[:cut].split("CUDA out of memory")
        # An OOM without a dump is a start that did not fit (vLLM's "Failed to load model"), not one under
        # production's prompts.
        for piece in pieces[:-1]:
            steps = crash_steps(piece)
            if steps:
                self.ooms.append(fig.Oom(time.time(), tuple(n for s in steps for n in s.prompt_lengths)))
            else:
                self.start_ooms += 1

    # --- sending prompts ------------------------------------------------------------------------------
    def send(self, lengths: list[int], concurrency: int) -> list[int]:
        async def one(http: httpx.AsyncClient, n: int) -> int:
            try:
                r = await http.post(self.d.endpoint + "/v1/completions", json={
                    "model": "llama-2-7b", "prompt": self.prompt(n), "max_tokens": OUTPUT_TOKENS,
                    "ignore_eos": True})
                return r.status_code
            except httpx.HTTPError:
                return 0

        async def run() -> list[int]:
            async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
                out: list[int] = []
                for i in range(0, len(lengths), concurrency):
                    out += await asyncio.gather(*(one(http, n) for n in lengths[i:i + concurrency]))
                return out
        start = time.time()
        try:
            return asyncio.run(run())
        finally:
            self.long_traffic.append((start, time.time()))

    # --- the daemon's config ------------------------------------------------------------------------------
    def set_window(self, window: str | None) -> None:
        """Rewrite the daemon's config with `window` (None: always open) and SIGHUP it."""
        path = self.d.root / "daemon.yaml"
        config = yaml.safe_load(path.read_text())
        config.pop("window", None)
        if window is not None:
            config["window"] = window
        path.write_text(yaml.safe_dump(config))
        self.window = window
        if self.d.daemon is not None and self.d.daemon.poll() is None:
            self.d.daemon.send_signal(signal.SIGHUP)

    # --- faults -------------------------------------------------------------------------------------------
    def inject(self, kind: str) -> str:
        return getattr(self, "_" + kind.replace("-", "_"))()

    def _foreign_memory(self) -> str:
        mib = self.rng.choice([3000, 5000, 7000])
        proc = subprocess.Popen([sys.executable, "-m", "autotuner", "sim", "hold", "--gpu", "0", "--mib", str(mib)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.holders.append(proc)
        leave = self.rng.uniform(15, 45)
        self.pending.append((time.time() + leave, "release", proc))
        return f"{mib} MiB held on GPU 0 for {leave:.0f} s (pid {proc.pid})"

    def _oom(self) -> str:
        n = self.rng.choice([4, 6])
        lengths = [self.rng.randint(1800, 3000) for _ in range(n)]
        statuses = self.send(lengths, concurrency=n)
        return f"{n} prompts of {min(lengths)}-{max(lengths)} tokens at once: HTTP {sorted(set(statuses))}"

    def _crash(self) -> str:
        closed = datetime.now() + timedelta(hours=1)
        self.set_window(f"{closed:%H:%M:%S}-{closed + timedelta(hours=1):%H:%M:%S}")
        time.sleep(1.5)  # the daemon reloads between polls
        try:
            pid = int((self.d.root / "pid").read_text())
            os.killpg(pid, signal.SIGKILL)
            what = f"production (pid {pid}) SIGKILLed, window closed"
        except (OSError, ValueError) as exc:
            what = f"no production to kill ({exc})"
        self.pending.append((time.time() + self.rng.uniform(15, 30), "open-window", None))
        return what

    def _daemon_kill(self) -> str:
        step = self.rng.choice(KILL_STEPS)
        deadline = time.time() + 45
        while step != "any" and self.state() != step and time.time() < deadline:
            time.sleep(0.1)
        at = self.state()
        daemon = self.d.daemon
        assert daemon is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.d.start_daemon()
        return f"daemon SIGKILLed (wanted step {step}, it was at {at}), started again"

    def _refused(self) -> str:
        (self.d.root / "trusted.yaml").write_bytes(self.d.config_file.read_bytes())
        (self.d.root / "break_args.json").write_text(json.dumps(["--gpu-memory-utilization", "0.3"]))
        self.pending.append((time.time() + 120, "unbreak", self.cycles_done() + 1))
        return "production refuses any config but the one it runs, until the next cycle ends"

    def _window(self) -> str:
        start, end = datetime.now() - timedelta(minutes=1), datetime.now() + timedelta(seconds=self.rng.uniform(3, 10))
        self.set_window(f"{start:%H:%M:%S}-{end:%H:%M:%S}")
        self.pending.append((end.timestamp() + self.rng.uniform(15, 35), "open-window", None))
        self.window_cuts.append(f"window closing at {end:%H:%M:%S} while the daemon was at {self.state()}")
        return f"window closes at {end:%H:%M:%S}"

    def _drift(self) -> str:
        n = self.rng.randint(14, 20)
        lengths = [self.rng.randint(1200, 1800) for _ in range(n)]
        statuses = self.send(lengths, concurrency=1)
        return f"{n} prompts of 1200-1800 tokens, one at a time: HTTP {sorted(set(statuses))}"

    def undo_due(self, everything: bool = False) -> None:
        now = time.time()
        keep = []
        for due, what, arg in self.pending:
            if what == "unbreak" and not everything and self.cycles_done() < arg and now < due:
                keep.append((due, what, arg))
                continue
            if due > now and what != "unbreak" and not everything:
                keep.append((due, what, arg))
                continue
            if what == "release":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(arg.pid, signal.SIGKILL)
                arg.wait(timeout=10)
            elif what == "open-window":
                if not any(w == "open-window" and d > due for d, w, _ in self.pending):
                    self.set_window(None)
            elif what == "unbreak":
                with contextlib.suppress(FileNotFoundError):
                    (self.d.root / "trusted.yaml").unlink()
        self.pending = keep

    def cycles_done(self) -> int:
        return len([c for c in db_rows(self.d.root, "cycles") if c["state"] == "done"])


def db_rows(root: Path, table: str) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    from autotuner.daemon.refusals import refusals
    from autotuner.daemon.state import cycles, events
    from autotuner.store.db import at_trials

    t = {"cycles": cycles, "events": events, "refusals": refusals, "trials": at_trials}[table]
    engine = sa.create_engine(f"sqlite:///{root / 'autotuner.db'}")
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(t))]
    except sa.exc.OperationalError:
        return []  # the daemon has not created it yet
    finally:
        engine.dispose()


def startup_wall_s(d: Any) -> float:
    """How long production's simulator takes from `start` to /health 200 here (Python's start-up included)."""
    assert d.prodctl("stop") == 0
    t0 = time.time()
    d.start_production()
    return time.time() - t0


def startup_simulated_s(log: Path) -> float:
    """The engine start as the simulator models it on the GPU (vLLM's `init engine ... took N seconds`)."""
    found = re.findall(r"init engine \(.*?\) took ([0-9.]+) seconds", log.read_text(errors="replace"))
    return max((float(x) for x in found), default=0.0)


def figures(chaos: Chaos, scenario: dict[str, Any]) -> fig.Figures:
    from autotuner.daemon.cycle_context import apply_changes
    from autotuner.daemon.evidence import prompt_cap
    from autotuner.daemon.fingerprints import refusal_fingerprint
    from autotuner.scenario import Scenario

    root = chaos.d.root
    cycles = sorted(db_rows(root, "cycles"), key=lambda c: c["id"])
    events = db_rows(root, "events")
    transitions = [e for e in events if e["kind"] == "transition"]
    planned = fig.planned_intervals(transitions)
    samples = chaos.samples
    f = fig.Figures(faults=len(chaos.faults))
    f.cycles = len([c for c in cycles if c["state"] == "done"])
    f.run_s = samples[-1].at - samples[0].at if len(samples) > 1 else 0.0
    f.unplanned_down_s, f.planned_down_s = fig.downtime(samples, planned)
    f.outages = fig.outages(samples, planned)
    crashes = [t for t, kind, _ in chaos.faults if kind in ("crash", "oom", "daemon-kill")]
    f.cycles_ending_down = fig.ending_down(cycles, samples, crashes)
    base = Scenario.model_validate({**scenario, "source": root / "scenario.yaml"})

    def scenario_of(c: dict[str, Any]) -> Scenario:
        return apply_changes(base, (json.loads(c["scenario"] or "{}") or {}).get("changes") or {})

    def fingerprint_of(c: dict[str, Any]) -> str | None:
        try:
            return refusal_fingerprint(json.loads(c["observed"]), scenario_of(c))
        except Exception:
            return None

    deploy_at = {}
    for t in sorted(transitions, key=lambda r: r["at"]):
        if t["to_state"] == "deploy" and t["cycle_id"] not in deploy_at:
            deploy_at[t["cycle_id"]] = t["at"]
    f.redeployed_refused, f.redeployed_refused_any = fig.redeployed(cycles, deploy_at, db_rows(root, "refusals"),
                                                                    fingerprint_of)
    drift = [e["at"] for e in events if e["kind"] == "trigger"
             and json.loads(e["detail"] or "{}").get("kind") == "workload-drift"]
    f.drift_triggers = len(drift)
    f.drift_false = fig.drift_false(drift, chaos.long_traffic, DRIFT_WINDOW_S)
    trials = db_rows(root, "trials")
    f.ooms = len(chaos.ooms)
    cap = prompt_cap(base, INITIAL["max-model-len"]) or INITIAL["max-model-len"]
    for oom in chaos.ooms:
        # oom.at is when the log was read, at most one read (0.25 s) after the OOM.
        after = next((c for c in cycles if c["started_at"] >= oom.at - 0.3), None)
        soak = None
        if after is not None and after["study_name"]:
            for t in trials:
                if t["study_name"] == after["study_name"] and t["kind"] == "soak":
                    text = (json.loads(t["result"]).get("soak") or {}).get("workload") or ""
                    words = text.split(" prompts of ")
                    if len(words) > 1:
                        soak = max(soak or 0, int(words[1].split()[0]))
        ok, note = fig.replayed(oom, after, soak, cap)
        f.oom_replayed.append(ok)
        f.oom_notes.append(note)
    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8, help="stop after this many cycles have ended")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speedup", type=float, default=50, help="production simulator's --sim-speedup")
    parser.add_argument("--max-wall-s", type=float, default=480, help="stop injecting after this long anyway")
    parser.add_argument("--fault-gap-s", type=float, nargs=2, default=(12.0, 30.0), metavar=("MIN", "MAX"))
    parser.add_argument("--schedule", default="45s", help="the daemon's schedule trigger (cycles without faults)")
    parser.add_argument("--keep", type=Path, default=None, help="copy the deployment directory here at the end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="daemon-chaos-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["AUTOTUNER_HOME"] = str(tmp / "home")  # the daemon reaps orphans of its home: its own
        os.environ["AUTOTUNER_SIM_STATE_DIR"] = str(tmp / "gpus")  # the holders and production share it
        run(args, tmp)


def run(args: argparse.Namespace, tmp: Path) -> None:
    from tests.support.daemon import SCENARIO, make_deployment, tear_down

    scenario = json.loads(json.dumps(SCENARIO))
    scenario["workload"]["requests"]["prompt_tokens"] = {"kind": "uniform", "low": 100, "high": 600}
    scenario["workload"]["arrivals"]["concurrency"] = 4
    sim_args = ["--sim-gpu", "rtx-4090", "--sim-speedup", f"{args.speedup:g}", "--sim-noise", "0"]
    d = make_deployment(tmp / "prod", scenario=scenario, initial=INITIAL, sim_args=sim_args, daemon={
        "triggers": {"poll_interval_s": 1, "schedule": {"every": args.schedule},
                     "workload_drift": {"p95_ratio": 1.25, "window_s": DRIFT_WINDOW_S, "min_requests": 8}},
        "min_interval_s": 5, "tune": {"trials": 6, "timeout": "5m", "confirm": "2x2", "soak": "20s"}})
    rng = random.Random(args.seed)
    chaos = Chaos(d, rng, args.speedup)
    threads: list[threading.Thread] = []
    try:
        startup = startup_wall_s(d)
        print(f"production's simulator starts in {startup:.2f} s wall at speed-up {args.speedup:g}", flush=True)
        d.start_daemon()
        for target in (chaos.poll_health, chaos.poll_status, chaos.background, chaos.watch_log):
            threads.append(threading.Thread(target=target, daemon=True))
            threads[-1].start()
        order = list(KINDS)
        rng.shuffle(order)
        began = time.time()
        next_at = began + 10.0
        while time.time() - began < args.max_wall_s and chaos.cycles_done() < args.cycles:
            chaos.undo_due()
            if d.daemon is not None and d.daemon.poll() is not None:
                print(f"the daemon exited {d.daemon.returncode}: started again", flush=True)
                chaos.faults.append((time.time(), "daemon-exit", f"exit {d.daemon.returncode}"))
                d.start_daemon()
            if time.time() >= next_at:
                kind = order.pop(0) if order else rng.choice(KINDS)
                at = time.time()
                what = chaos.inject(kind)
                chaos.faults.append((at, kind, what))
                print(f"[{at - began:6.1f} s] fault {len(chaos.faults)} {kind}: {what} "
                      f"(cycles ended {chaos.cycles_done()})", flush=True)
                next_at = time.time() + rng.uniform(*args.fault_gap_s)
            time.sleep(0.5)
        # Faults undone, then a last look: the daemon gets time to finish what it is doing.
        chaos.undo_due(everything=True)
        deadline = time.time() + 90
        while time.time() < deadline and chaos.state() not in ("idle",):
            time.sleep(0.5)
        time.sleep(3.0)
        chaos.stop.set()
        for t in threads:
            t.join(timeout=35)
        with contextlib.suppress(Exception):
            status = d.status()
            print(f"GET /status at the end: state {status.get('state')}, counts {status.get('counts')}, "
                  f"refused {len(status.get('refused') or [])}", flush=True)
        d.stop_daemon()
        if args.keep is not None:
            import shutil

            shutil.copytree(d.root, args.keep, dirs_exist_ok=True)
        report(chaos, figures(chaos, scenario), startup, args.speedup)
    finally:
        chaos.stop.set()
        for proc in chaos.holders:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        tear_down(d)


def report(chaos: Chaos, f: fig.Figures, startup: float, speedup: float) -> None:
    root = chaos.d.root
    for c in sorted(db_rows(root, "cycles"), key=lambda c: c["id"]):
        print(f"cycle {c['id']}: trigger {c['trigger_kind']}, {c['state']} {c['outcome'] or ''}, "
              f"{c['trials'] or 0} trials, downtime {c['downtime_s'] or 0:.1f} s (daemon's count): "
              f"{(c['reason'] or '')[:160]}", flush=True)
    kinds = [k for _, k, _ in chaos.faults]
    print("faults: " + ", ".join(f"{k} {kinds.count(k)}" for k in sorted(set(kinds))))
    for line in chaos.window_cuts:
        print(line)
    unplanned = [o for o in f.outages if not o.planned]
    print(f"outages seen by our /health poll: {len(f.outages)} ({len(unplanned)} unplanned); unplanned ones, wall s: "
          + ", ".join("open" if o.seconds is None else f"{o.seconds:.1f}" for o in unplanned))
    print(f"planned downtime {f.planned_down_s:.1f} s; run {f.run_s:.0f} s wall")
    daemon_rt = db_rows(root, "events")
    mitigations = len([e for e in daemon_rt if e["kind"] == "mitigation"])
    print(f"emergency mitigations (daemon's events): {mitigations}; OOMs at engine start (no scheduler dump) in "
          f"production's log: {chaos.start_ooms}")
    print(f"cycles ending down: {f.cycles_ending_down}; redeployed refused (same fingerprint) "
          f"{f.redeployed_refused}, (same flags, any fingerprint) {f.redeployed_refused_any}")
    print(f"drift triggers: {f.drift_triggers}, without long production traffic before them: {len(f.drift_false)}")
    for i, note in enumerate(f.oom_notes, start=1):
        print(f"production OOM {i}: {'replayed' if f.oom_replayed[i - 1] else 'NOT replayed'}: {note}")
    wall = f.max_to_serving_s
    engine = startup_simulated_s(root / "vllm.log")
    # The engine start's wall time (mostly Python's imports) replaced by the start the simulator models.
    simulated = max(0.0, wall - startup) + engine if wall else 0.0
    print(f"longest crash → serving: {wall:.1f} s wall, {simulated:.1f} s simulated (its engine start of "
          f"{startup:.2f} s wall counted as the {engine:.1f} s the simulator models at speed-up {speedup:g})",
          flush=True)
    print(f"cycles={f.cycles} faults={f.faults} unplanned_down_s={f.unplanned_down_s:.1f} "
          f"unplanned_down_share={f.unplanned_share:.3f} cycles_ending_down={len(f.cycles_ending_down)} "
          f"max_time_to_serving_s={simulated:.1f} redeployed_refused={len(f.redeployed_refused)} "
          f"drift_false_triggers={len(f.drift_false)} oom_prompts_replayed={sum(f.oom_replayed)}/{f.ooms}")


if __name__ == "__main__":
    main()
