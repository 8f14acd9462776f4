"""The simulator image for real: it builds, tunes a `sim` scenario with the study on a volume, exports
the winner there, runs as the non-root user, and `docker stop` interrupts a trial cleanly so that the
next `docker run` resumes the study."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.store.db import Store
from tests.support.docker import TUNER_UID, Docker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800, func_only=True)]


def tune_args(image: str, volume: str, scenarios: Path, *extra: str) -> list[str]:
    # --network none: the engine and the tuner talk over the container's own loopback.
    return ["--init", "--network", "none", "-v", f"{volume}:/data", "-v", f"{scenarios}:/scenarios:ro", image,
            "tune", "/scenarios/quick.yaml", "--storage", "/data/autotuner.db", "--log-dir", "/data/logs",
            "--confirm", "0", *extra]


def test_the_image_runs_the_tuner_as_a_non_root_user(docker: Docker, sim_image: str) -> None:
    # That every process of a running container is this user: the `docker stop` test below.
    assert docker.inspect(sim_image, "{{.Config.User}}") == "tuner"
    assert docker.inspect(sim_image, "{{json .Config.Entrypoint}}") == '["autotuner"]'
    assert docker.inspect(sim_image, "{{.Config.StopSignal}}") == "SIGTERM"


def test_tune_then_export_to_the_volume(docker: Docker, sim_image: str, scenarios: Path, volume: str) -> None:
    done = docker.run("run", "--rm", *tune_args(sim_image, volume, scenarios, "--trials", "3"), timeout=900)
    assert "done, 3/3 trials" in done.stdout, done.stdout + done.stderr
    docker.run("run", "--rm", "--network", "none", "-v", f"{volume}:/data", sim_image,
               "export", "--format", "yaml", "-o", "/data/vllm.yaml", "--allow-unverified", timeout=600)
    data = docker.volume_path(volume)
    exported = yaml.safe_load((data / "vllm.yaml").read_text())
    assert exported["tensor-parallel-size"] == 8
    assert int(exported["max-num-batched-tokens"]) > 0
    assert (data / "vllm.yaml").stat().st_uid == TUNER_UID
    store = Store(str(data / "autotuner.db"))
    rows = store.trials(store.studies()[0].study_name)
    assert sum(r.state == "COMPLETE" for r in rows) >= 3


def test_docker_stop_interrupts_the_trial_and_the_next_run_resumes(docker: Docker, sim_image: str,
                                                                    scenarios: Path, volume: str) -> None:
    name = f"autotuner-test-{uuid.uuid4().hex[:10]}"
    data = docker.volume_path(volume)

    def engine_log() -> str:
        return "".join(p.read_text(errors="replace") for p in (data / "logs").rglob("*.log") if p.is_file())

    docker.run("run", "-d", "--name", name, *tune_args(sim_image, volume, scenarios, "--trials", "2"), timeout=600)
    try:
        def engine_serving() -> bool:
            assert docker.inspect(name, "{{.State.Running}}") == "true", docker.run("logs", name).stderr[-3000:]
            return "autotuner.sim serve" in docker.run("top", name, "-o", "pid,uid,args").stdout and bool(engine_log())

        wait_for(engine_serving, 300, "the simulator started by the tuner inside the container, logging")
        processes = docker.run("top", name, "-o", "pid,uid,args").stdout.splitlines()[1:]
        assert processes and all(line.split()[1] == str(TUNER_UID) for line in processes), processes
        time.sleep(1.5)  # into the trial
        t0 = time.monotonic()
        docker.run("stop", "-t", "60", name, timeout=120)
        stopped_in = time.monotonic() - t0
        logs = docker.run("logs", name)
        # 0, not 137: the tuner ended by itself well within the grace period; docker killed nothing.
        assert docker.inspect(name, "{{.State.ExitCode}}") == "0", logs.stdout[-2000:] + logs.stderr[-3000:]
        assert stopped_in < 50
        assert "interrupted" in logs.stdout
    finally:
        docker.run("rm", "-f", name, check=False)

    # The engine was stopped by the tuner, not torn down with the container: it logged its shutdown.
    assert "Shutting down" in engine_log(), engine_log()[-3000:]
    store = Store(str(data / "autotuner.db"))
    study = store.studies()[0].study_name
    rows = store.trials(study)
    interrupted = rows[-1]
    assert interrupted.outcome == "interrupted" and interrupted.state == "FAIL"

    done = docker.run("run", "--rm", *tune_args(sim_image, volume, scenarios, "--trials", "2"), timeout=900)
    assert "done, 2/2 trials" in done.stdout, done.stdout + done.stderr
    after = Store(str(data / "autotuner.db")).trials(study)
    numbers = [r.trial_number for r in after]
    assert len(numbers) == len(set(numbers))
    assert interrupted.trial_number in numbers
    # The same study went on: the interrupted candidate was queued again, and the second run added
    # completed trials after it.
    optuna_study = optuna.load_study(study_name=study, storage=Store(str(data / "autotuner.db")).optuna_storage())
    trials = optuna_study.get_trials(deepcopy=False)
    before = next(t for t in trials if t.number == interrupted.trial_number)
    again = [t for t in trials if t.user_attrs.get("requeued_from") == interrupted.trial_number]
    assert again and (again[0].params or again[0].system_attrs.get("fixed_params")) == before.params, again
    assert any(t.number > interrupted.trial_number and t.state == TrialState.COMPLETE for t in trials)
