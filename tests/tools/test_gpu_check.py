"""tools/gpu_check without a GPU: the dry run (simulated NVML, CpuStandIn for torch) through every
step, the time boxes, bad arguments, the simulator's predictions, and the wheels the device needs."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.vllm import VllmCpu
from tools.gpu_check.cli import main
from tools.gpu_check.config import CheckConfig
from tools.gpu_check.device import Device
from tools.gpu_check.fits import fit_curve
from tools.gpu_check.predictions import sim_predictions
from tools.gpu_check.prefill import schedule_chunks
from tools.gpu_check.records import Recorder, read_records
from tools.gpu_check.stand_in import CpuStandIn
from tools.gpu_check.step_runner import MIN_STEP_S, SUMMARY_RESERVE_S
from tools.gpu_check.torch_cuda import TorchCuda

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tools" / "gpu_check"
WHEELS = ROOT / "tools" / "gpu_wheels.txt"

# The device machine's image, as /work/.library/device/KINDS.md lists it (read 2026-11-17), by
# distribution name: what the check may import there without carrying a wheel.
_IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
PREINSTALLED = frozenset(_IMAGE_PACKAGES.split())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.gpu_check", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# ---- the dry run, end to end


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    proc = _run("--dry-run", "--out", str(out), "--budgets", "256,1024,4096,16384", "--prompts", "3000,6000",
                "--sampler-seconds", "0.5")
    return proc, out


def test_dry_run_runs_every_step_and_writes_the_summary(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] is True
    assert "CpuStandIn" in report["measured_by"]
    assert {name: s["status"] for name, s in report["steps"].items()} == {"nvml": "ok", "wall": "ok", "oom": "ok"}
    markdown = (out / "gpu_check.md").read_text()
    for heading in ("## 1. NVML through our monitor", "## 2. The memory wall", "## 3. The OOM path", "**Dry run**"):
        assert heading in markdown
    assert markdown in proc.stdout  # what the device tool's output tail shows
    assert (out / "gpu_check.log").is_file()
    assert len(list(out.iterdir())) <= 8  # the device tool brings back at most 8 files


def test_dry_run_nvml_step_reads_the_simulated_h200(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = dry_run
    nvml = json.loads((out / "gpu_check.json").read_text())["steps"]["nvml"]
    device = nvml["facts"]["device"]
    assert device["name"] == "NVIDIA H200"
    assert device["total_bytes"] == int(140.4 * (1 << 30))
    assert device["uuid"].startswith("GPU-")
    hold = nvml["facts"]["hold_1gib"]
    assert hold["used_rise_bytes"] == 1 << 30
    assert hold["own_pid_listed"] is True
    rates = {row["hz"]: row for row in nvml["tables"]["sampler"]}
    assert set(rates) == {100.0, 200.0}
    assert all(row["achieved_hz"] > 0.5 * hz and row["samples"] > 10 for hz, row in rates.items())
    assert nvml["facts"]["query_latency_us"]["n"] == 2000


def test_dry_run_wall_has_every_budget_per_backend_beside_the_simulator(
    dry_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = dry_run
    report = json.loads((out / "gpu_check.json").read_text())
    wall = report["steps"]["wall"]
    rows = wall["tables"]["wall"]
    assert [(r["backend"], r["budget"]) for r in rows] == [
        (b, n) for b in ("flash", "math") for n in (256, 1024, 4096, 16384)
    ]
    for row in rows:
        assert row["allocated_rise_bytes"] > 0 and row["nvml_rise_bytes"] > 0, row
        assert row["engine_steps"] == len(schedule_chunks((3000, 6000), row["budget"]))
    # The stand-in's steady footprint is what the simulator plans for the same shape, so the
    # steady NVML figure must come out within the stand-in's context and rounding.
    steady = wall["facts"]["steady"]["nvml_used_bytes"]
    assert abs(steady - report["simulator"]["startup"]["steady_bytes"]) < 1 << 30
    predicted = report["simulator"]["transient"]
    assert set(predicted) == {"256", "1024", "4096", "16384"}
    assert predicted["256"]["outcome"] == "ok" and predicted["256"]["transient_bytes"] > 0
    assert report["simulator"]["gpu"]["product_name"] == "NVIDIA H200"
    assert "flash/allocated_rise_bytes" in report["fits"] and "math/nvml_rise_bytes" in report["fits"]
    markdown = (out / "gpu_check.md").read_text()
    sim_256 = f"{predicted['256']['transient_bytes'] / (1 << 20):.0f} MiB |"
    assert any(line.startswith("| 256 | flash |") and line.endswith(sim_256) for line in markdown.splitlines())


def test_dry_run_oom_path_trips_kills_releases_and_classifies(
    dry_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = dry_run
    oom = json.loads((out / "gpu_check.json").read_text())["steps"]["oom"]["facts"]
    trip = oom["trip"]
    assert trip["tripped"] is True and trip["released"] is True and trip["group_gone"] is True
    assert trip["used_at_trip_bytes"] >= trip["limit_bytes"]
    assert 0 <= trip["sample_to_kill_ms"] < 1000
    assert trip["kill_to_nvml_release_ms"] >= 400  # the simulator's 0.5 s release delay, seen through NVML
    real = oom["real_oom"]
    assert real["classified_after_ready"] == "oom-crash"
    assert real["classified_before_ready"] == "startup-failed"
    assert real["error_line"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert real["nvml_peak_fraction"] > 0.99


# ---- time boxes and bad input


def test_a_step_past_its_box_is_killed_and_the_others_keep_their_figures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run("--dry-run", "--out", str(out), "--steps", "nvml,oom", "--stall", "nvml", "--box", "nvml=8",
                "--sampler-seconds", "0.3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    nvml, oom = report["steps"]["nvml"], report["steps"]["oom"]
    assert nvml["status"] == "timeout"
    assert 8 <= nvml["seconds"] < 20
    assert nvml["facts"]["device"]["name"] == "NVIDIA H200"  # recorded before the overrun, kept
    assert oom["status"] == "ok" and oom["facts"]["trip"]["tripped"] is True
    assert "| nvml | timeout |" in (out / "gpu_check.md").read_text()


def test_steps_share_the_total_and_a_step_without_time_is_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 20 s in all: the summary's reserve and the minimum kept for the last step leave nvml 7 s of
    # its 60; it overruns them, and what is left then is under the last step's minimum.
    proc = _run("--dry-run", "--out", str(out), "--steps", "nvml,oom", "--total-s", "20", "--box", "nvml=60",
                "--sampler-seconds", "0.3", "--stall", "nvml")
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["steps"]["nvml"]["status"] == "timeout", proc.stdout + proc.stderr
    assert report["steps"]["nvml"]["box_s"] <= 20 - SUMMARY_RESERVE_S - MIN_STEP_S + 0.01
    assert report["steps"]["oom"]["status"] == "skipped"
    assert report["steps"]["oom"]["note"] == "no time left in --total-s"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--steps", "nvml,bogus"], "--steps"),
        (["--budgets", "256,0"], "--budgets"),
        (["--budgets", "many"], "--budgets"),
        (["--prompts", ""], "--prompts"),
        (["--backends", "cudnn"], "--backends"),
        (["--box", "wall=soon"], "--box"),
        (["--box", "train=10"], "--box"),
        (["--utilization", "1.5"], "--utilization"),
        (["--threshold", "1"], "--threshold"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--gpu-spec", "no/such/gpu.yaml"], "no/such/gpu.yaml"),
        (["--layers", "41"], "--layers"),
    ],
)
def test_bad_arguments_exit_2_naming_the_argument_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str,
) -> None:
    out = tmp_path / "out"
    assert main(["--dry-run", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: error:") and named in err and err.count("\n") == 1
    assert not out.exists()


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["--dry-run", "--out", str(target)]) == 2
    assert "--out" in capsys.readouterr().err
    assert target.read_text() == "x"


# ---- pieces


def test_schedule_chunks_prefills_every_prompt_within_the_budget() -> None:
    prompts = (3000, 4000, 5000, 6000)
    for budget in (256, 1000, 4096, 16384, 20000):
        steps = schedule_chunks(prompts, budget)
        assert all(0 < sum(n for _, _, n in step) <= budget for step in steps)
        assert len(steps) == -(-sum(prompts) // budget)
        done: dict[int, int] = {}
        for step in steps:
            for offset, start, n in step:
                assert start == done.get(offset, 0)  # each chunk continues where the last one stopped
                done[offset] = start + n
        assert done == {0: 3000, 3000: 4000, 7000: 5000, 12000: 6000}
    assert schedule_chunks((3000,), 1024)[-1] == [(0, 2048, 952)]


def test_fit_curve_tells_a_line_from_a_parabola() -> None:
    budgets = [256, 512, 1024, 2048, 4096, 8192, 16384]
    line = fit_curve(budgets, [1e6 + 5000.0 * b for b in budgets])
    assert line is not None and line["verdict"] == "linear"
    assert line["slope_bytes_per_token"] == pytest.approx(5000.0)
    parabola = fit_curve(budgets, [1e6 + 100.0 * b + 360.0 * b * b for b in budgets])
    assert parabola is not None and parabola["verdict"] == "not linear"
    assert parabola["quadratic"]["c2_bytes_per_token2"] == pytest.approx(360.0)
    assert fit_curve([256, 512], [1.0, 2.0]) is None


def test_records_survive_a_step_killed_mid_line(tmp_path: Path) -> None:
    path = tmp_path / "step.jsonl"
    rec = Recorder(path)
    rec.set("device", {"name": "x"})
    rec.add("wall", {"budget": 256})
    rec.add("wall", {"budget": 512})
    rec.close()
    with open(path, "a") as f:
        f.write('{"add": "wall", "row": {"bud')
    assert read_records(path) == {"facts": {"device": {"name": "x"}},
                                            "tables": {"wall": [{"budget": 256}, {"budget": 512}]}}


def test_simulator_predictions_use_the_measured_total(tmp_path: Path) -> None:
    config = CheckConfig(out=str(tmp_path), budgets=(1024, 8192), prompts=(3000, 6000))
    measured = 143771 * (1 << 20)
    sim = sim_predictions(config, measured)
    assert sim["errors"] == []
    assert sim["gpu"]["memory_gib"] * (1 << 30) == pytest.approx(measured)
    assert sim["startup"]["kv_tokens"] > 6000
    assert sim["transient"]["1024"]["outcome"] == "ok"
    assert sim["oom"]["classified_after_ready"] == "oom-crash"


def test_simulator_failures_are_reported_not_raised(tmp_path: Path) -> None:
    config = CheckConfig(out=str(tmp_path), gpu_spec=str(tmp_path / "missing.yaml"))
    sim = sim_predictions(config, None)
    assert sim["errors"] and all("HardwareSpecError" in e or "missing.yaml" in e for e in sim["errors"])
    assert "transient" not in sim


# ---- what travels to the device machine


def _wheel_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in WHEELS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not pinned with =="
            assert _norm(name) not in pins, f"{name} listed twice"
            pins[_norm(name)] = version
    return pins


def test_wheel_list_pins_what_the_venv_runs() -> None:
    from importlib.metadata import version

    for name, pinned in _wheel_pins().items():
        assert version(name) == pinned, f"tools/gpu_wheels.txt pins {name}=={pinned}, the venv has {version(name)}"
        assert name not in PREINSTALLED, f"{name} is on the device already: carry it only for another version"


def test_every_runtime_dependency_is_carried_or_already_there() -> None:
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    available = set(_wheel_pins()) | PREINSTALLED
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    missing = [d for d in deps if _norm(Requirement(d).name) not in available]
    assert missing == [], f"add to tools/gpu_wheels.txt: {missing}"
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    for name in _wheel_pins():
        for text in requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                assert _norm(req.name) in available, f"{name} needs {req.name}: carry it"


def test_the_checks_imports_are_carried_or_already_there() -> None:
    """Every module tools/gpu_check imports (at the top or inside a step), and everything those
    import in turn, comes from the standard library, this repository, a carried wheel or the image."""
    imported: set[str] = set()
    for node in (n for path in sorted(PACKAGE.glob("*.py")) for n in ast.walk(ast.parse(path.read_text()))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
            imported |= {f"{node.module}.{alias.name}" for alias in node.names if node.module == "autotuner.sim"}
    ours = sorted(m for m in imported if m.split(".")[0] in {"autotuner", "tools"})
    assert "autotuner.engine.process" in ours and "autotuner.monitor" in ours
    probe = (
        "import importlib, json, sys\n"
        f"for m in {ours!r}: importlib.import_module(m)\n"
        # file-backed modules only: Cython registers a `cython_runtime` that no package provides
        "print(json.dumps(sorted({n.split('.')[0] for n, m in list(sys.modules.items())"
        " if getattr(m, '__file__', None)})))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                       cwd=ROOT).stdout)
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    available = set(_wheel_pins()) | PREINSTALLED
    third_party = {m.split(".")[0] for m in imported} | set(loaded)
    needed: dict[str, str] = {}
    for top in sorted(third_party - set(sys.stdlib_module_names) - {"autotuner", "tools", "__main__", "__future__"}):
        if top.startswith("_"):
            continue  # interpreter and build helpers (editable finders, cython runtime)
        for dist in dists.get(top, [top]):
            needed[top] = _norm(dist)
    # Modules only the device has (torch, transformers) count by their own name.
    missing = {top: dist for top, dist in needed.items() if dist not in available}
    assert missing == {}, f"not on the device and not carried: {missing}"
    assert {"structlog", "psutil", "pynvml", "torch", "transformers"} <= set(needed)


def test_wheels_are_ignored_by_git_and_made_for_the_device() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", ".whl/structlog-26.1.0-py3-none-any.whl"], cwd=ROOT)
    assert ignored.returncode == 0, "add /.whl/ to .gitignore"
    dry = subprocess.run(["make", "-n", "gpu-wheels"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version 3.12", "--implementation cp",
                 "--platform manylinux_2_28_x86_64", "--platform manylinux2014_x86_64", "-d .whl",
                 "-r tools/gpu_wheels.txt"):
        assert flag in dry


def test_wrapper_refuses_to_run_without_wheels(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    wrapper = tmp_path / "tools" / "gpu_check.sh"
    wrapper.write_text((ROOT / "tools" / "gpu_check.sh").read_text())
    proc = subprocess.run(["bash", str(wrapper), "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "make gpu-wheels" in proc.stderr


# ---- the torch path itself, on the CPU


@pytest.mark.vllm
def test_torch_path_matches_transformers_on_cpu(vllm_cpu: VllmCpu) -> None:
    """The check's own layer loop, KV tensor and chunking give transformers' logits for each whole prompt."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([vllm_cpu.python, str(ROOT / "tests" / "tools" / "torch_cpu_probe.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for case in ("kv_heads=4", "kv_heads=2"):
        got = results[case]
        assert got["kv_tokens"] >= 250
        assert got["weights_bytes"] == got["sim_weights_bytes_fp32"]  # the simulator counts the same parameters
        for budget in (64, 1000):
            assert got[f"math/{budget}"] < 1e-4, got  # float32 throughout
        assert got["profile_rows"] == [1, 256]
        # Flash on the CPU: where this torch build has a kernel for it, it must agree too.
        for budget in (64, 1000):
            if f"flash/{budget}" in got:
                assert got[f"flash/{budget}"] < 1e-4, got
    assert results["attention_agreement"] < 2e-2  # bf16 flash and math against float64


def test_the_stand_in_offers_what_the_real_device_does() -> None:
    """The dry run only proves the steps' plumbing if CpuStandIn answers every call TorchCuda does."""
    import inspect

    wanted = {n for n, _ in inspect.getmembers(Device, inspect.isfunction) if not n.startswith("_")}
    assert {"run", "load_model", "reserve_kv", "hold", "peak"} <= wanted
    for cls in (TorchCuda, CpuStandIn):
        for name in wanted:
            ours, theirs = getattr(cls, name), getattr(Device, name)
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), (cls, name)
