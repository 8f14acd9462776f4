"""What the check is asked to do: its constants, the ``CheckConfig`` every step process receives as
JSON, and the command line that builds it (a bad argument raises ``BadInputError``: exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tools.gpu_check

MIB = 1 << 20
GIB = 1 << 30
STEPS = ("nvml", "wall", "oom")
BACKENDS = ("flash", "math")
DEFAULT_BOX_S = {"nvml": 45.0, "wall": 270.0, "oom": 110.0}
DEFAULT_TOTAL_S = 450.0  # the 8 minutes, less the wheel install and the start
DEFAULT_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_PROMPTS = (3000, 4000, 5000, 6000)
DEFAULT_GPU_SPEC = Path(__file__).resolve().parents[1] / "h200.yaml"


class BadInputError(Exception):
    """A bad argument: one message naming it and the fix; exit 2, nothing written."""



@dataclass(frozen=True)
class CheckConfig:
    out: str
    dry_run: bool = False
    steps: tuple[str, ...] = STEPS
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    prompts: tuple[int, ...] = DEFAULT_PROMPTS
    backends: tuple[str, ...] = BACKENDS
    model: str = "llama-2-13b"
    layers: int | None = None  # a slice of the model's layers; None: all of them
    utilization: float = 0.90
    gpu_spec: str = str(DEFAULT_GPU_SPEC)
    gpu_index: int = 0
    threshold_fraction: float = 0.90
    sampler_seconds: float = 2.0
    total_s: float = DEFAULT_TOTAL_S
    box_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BOX_S))
    stall: str | None = None  # testing the time box: this step sleeps past its box once its figures are in
    seed: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CheckConfig:
        raw = json.loads(text)
        for key in ("steps", "budgets", "prompts", "backends"):
            raw[key] = tuple(raw[key])
        return cls(**raw)


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise BadInputError(f"--{what} {text!r}: give comma-separated whole numbers, e.g. 256,1024,4096") from None
    if not values or any(v <= 0 for v in values):
        raise BadInputError(f"--{what} {text!r}: give at least one number, each greater than 0")
    return values


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise BadInputError(f"--{what} {text!r}: use one or more of {', '.join(allowed)}")
    return tuple(n for n in allowed if n in names)  # the documented order, whatever was typed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=tools.gpu_check.__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "out/gpu-check",
                   help="directory for gpu_check.json/.md/.log (default: $OUT, else out/gpu-check)")
    p.add_argument("--dry-run", action="store_true",
                   help="simulated NVML and CpuStandIn instead of torch: checks the plumbing, measures nothing")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="token budgets to sweep")
    p.add_argument("--prompts", default=",".join(map(str, DEFAULT_PROMPTS)), help="prompt lengths in tokens")
    p.add_argument("--backends", default=",".join(BACKENDS), help="SDPA backends: flash, math")
    p.add_argument("--model", default="llama-2-13b", help="a simulator model preset (its shape is built)")
    p.add_argument("--layers", type=int, help="build only this many of the model's layers")
    p.add_argument("--utilization", type=float, default=0.90, help="vLLM's --gpu-memory-utilization")
    p.add_argument("--gpu-spec", default=str(DEFAULT_GPU_SPEC), help="simulator GPU preset or YAML file")
    p.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU to use")
    p.add_argument("--threshold", type=float, default=0.90, help="OOM threshold, fraction of the total")
    p.add_argument("--sampler-seconds", type=float, default=2.0, help="length of each sampler-rate run")
    p.add_argument("--total-s", type=float, default=DEFAULT_TOTAL_S, help="time for all steps together")
    p.add_argument("--box", action="append", default=[], metavar="STEP=SECONDS",
                   help="one step's time box (default " + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_BOX_S.items())
                   + ")")
    p.add_argument("--stall", choices=STEPS, help=argparse.SUPPRESS)  # tests: make a step overrun its box
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_config(argv: list[str]) -> CheckConfig:
    ns = build_parser().parse_args(argv)
    boxes = dict(DEFAULT_BOX_S)
    for item in ns.box:
        step, _, seconds = item.partition("=")
        if step not in STEPS:
            raise BadInputError(f"--box {item!r}: the step must be one of {', '.join(STEPS)}")
        try:
            boxes[step] = float(seconds)
        except ValueError:
            raise BadInputError(f"--box {item!r}: give STEP=SECONDS, e.g. wall=240") from None
        if boxes[step] <= 0:
            raise BadInputError(f"--box {item!r}: the seconds must be greater than 0")
    if not 0 < ns.utilization <= 1:
        raise BadInputError(f"--utilization {ns.utilization}: give a fraction in (0, 1], e.g. 0.9")
    if not 0 < ns.threshold < 1:
        raise BadInputError(f"--threshold {ns.threshold}: give a fraction in (0, 1), e.g. 0.9")
    if ns.layers is not None and ns.layers < 1:
        raise BadInputError(f"--layers {ns.layers}: give at least 1")
    if ns.total_s <= 0 or ns.sampler_seconds <= 0:
        raise BadInputError("--total-s and --sampler-seconds must be greater than 0")
    from autotuner.catalog.gpus import load_gpu
    from autotuner.catalog.models import load_model
    from autotuner.errors import UserInputError

    try:
        spec = load_model(ns.model)
        load_gpu(ns.gpu_spec)
    except UserInputError as exc:
        raise BadInputError(str(exc)) from None
    if ns.layers is not None and ns.layers > spec.num_layers:
        raise BadInputError(f"--layers {ns.layers}: {ns.model} has only {spec.num_layers} layers")
    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out}: exists and is not a directory; name a directory")
    return CheckConfig(
        out=str(out), dry_run=ns.dry_run, steps=_names(ns.steps, STEPS, "steps"),
        budgets=tuple(sorted(set(_int_list(ns.budgets, "budgets")))), prompts=_int_list(ns.prompts, "prompts"),
        backends=_names(ns.backends, BACKENDS, "backends"), model=ns.model, layers=ns.layers,
        utilization=ns.utilization, gpu_spec=ns.gpu_spec, gpu_index=ns.gpu_index,
        threshold_fraction=ns.threshold, sampler_seconds=ns.sampler_seconds, total_s=ns.total_s, box_s=boxes,
        stall=ns.stall, seed=ns.seed,
    )
