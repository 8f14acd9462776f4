"""The command line: the check itself, and the two child entries it starts itself (``_step``, ``_hog``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.gpu_check.config import STEPS, BadInputError, CheckConfig, parse_config
from tools.gpu_check.markdown import render_markdown
from tools.gpu_check.report import JSON_NAME, LOG_NAME, MD_NAME
from tools.gpu_check.step_oom import run_hog
from tools.gpu_check.step_runner import run_check, run_step_child


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_step":
        p = argparse.ArgumentParser(prog="gpu_check.py _step")
        p.add_argument("step", choices=STEPS)
        for flag in ("--config", "--results", "--home", "--deadline"):
            p.add_argument(flag, required=True)
        ns = p.parse_args(argv[1:])
        config = CheckConfig.from_json(Path(ns.config).read_text())
        return run_step_child(config, ns.step, Path(ns.results), Path(ns.home), float(ns.deadline))
    if argv and argv[0] == "_hog":
        p = argparse.ArgumentParser(prog="gpu_check.py _hog")
        p.add_argument("--config-json", required=True)
        p.add_argument("--mode", choices=("grow", "oom"), required=True)
        ns = p.parse_args(argv[1:])
        return run_hog(CheckConfig.from_json(ns.config_json), ns.mode)
    try:
        config = parse_config(argv)
    except BadInputError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    report = run_check(config)
    print(render_markdown(report))
    print(f"\nwritten: {Path(config.out) / JSON_NAME}, {Path(config.out) / MD_NAME}, {Path(config.out) / LOG_NAME}")
    bad = [s["name"] for s in report["steps"].values() if s["status"] != "ok"]
    return 1 if bad else 0
