"""The summary: the steps' figures, the simulator's predictions and the fits in one dict, written
as ``gpu_check.json``, ``gpu_check.md`` and, where matplotlib works, the plot.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tools.gpu_check.config import CheckConfig
from tools.gpu_check.fits import fit_curve
from tools.gpu_check.markdown import render_markdown
from tools.gpu_check.plot import plot_wall
from tools.gpu_check.predictions import sim_predictions
from tools.gpu_check.records import StepResult
from tools.gpu_check.stand_in import CpuStandIn

JSON_NAME, MD_NAME, LOG_NAME, PLOT_NAME = "gpu_check.json", "gpu_check.md", "gpu_check.log", "gpu_check_wall.png"


def build_report(config: CheckConfig, steps: list[StepResult], started: float) -> dict[str, Any]:
    by = {s.name: s for s in steps}
    total = None
    for name in ("nvml", "wall", "oom"):
        facts = by[name].facts if name in by else {}
        total = total or (facts.get("device") or {}).get("total_bytes") or (facts.get("startup") or {}).get(
            "total_bytes") or (facts.get("trip") or {}).get("total_bytes")
    predictions = sim_predictions(config, total)
    fits: dict[str, Any] = {}
    rows = by["wall"].tables.get("wall", []) if "wall" in by else []
    for backend in config.backends:
        ok = [r for r in rows if r.get("backend") == backend and not {"oom", "skipped", "error"} & set(r)]
        for metric in ("allocated_rise_bytes", "nvml_rise_bytes"):
            fit = fit_curve([r["budget"] for r in ok], [r[metric] for r in ok])
            if fit is not None:
                fits[f"{backend}/{metric}"] = fit
    sim_rows = predictions.get("transient") or {}
    sim_ok = [(int(b), v["transient_bytes"]) for b, v in sim_rows.items() if v.get("outcome") == "ok"]
    sim_fit = fit_curve([b for b, _ in sim_ok], [v for _, v in sim_ok])
    if sim_fit is not None:
        fits["simulator/transient_bytes"] = sim_fit
    return {
        "dry_run": config.dry_run,
        "measured_by": CpuStandIn.label if config.dry_run else "real GPU (torch, NVML)",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
        "config": asdict(config),
        "steps": {s.name: asdict(s) for s in steps},
        "simulator": predictions,
        "fits": fits,
    }


def write_report(out: Path, report: dict[str, Any]) -> None:
    """The JSON, the Markdown and, where matplotlib works, the curve; each written whole then renamed."""
    for name, text in ((JSON_NAME, json.dumps(report, indent=2, default=str)), (MD_NAME, render_markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
    with contextlib.suppress(Exception):
        plot_wall(out / PLOT_NAME, report)
