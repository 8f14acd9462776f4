"""Run the checks in order: the engine and its version, the model, the GPUs, the flags (typed and
ruled on by the version found), whether the TP holds the model, the workload, the storage, the log
directory, host RAM, proxies."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.preflight.checklist import PreflightError, Report
from autotuner.preflight.engine_checks import check_engine
from autotuner.preflight.flag_checks import check_flags
from autotuner.preflight.machine_checks import check_gpus, check_host_ram, check_log_dir, check_storage
from autotuner.preflight.memory_checks import check_model_fits
from autotuner.preflight.model_checks import check_model
from autotuner.preflight.proxy_checks import check_proxies
from autotuner.preflight.workload_checks import check_workload, served_context
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue, knowledge_for


def run_checks(scenario: Scenario, *, storage: str | None, log_dir: Path | None,
               overrides: Mapping[str, FlagValue] | None = None, fail_fast: bool = False) -> Report:
    """Every check (`doctor`), or up to the first failure (`fail_fast`: `tune` and `measure` refuse
    at once); `overrides` are `measure --set` flags (None for `tune`: a study searches)."""
    report = Report()
    engine_checks, version = check_engine(scenario)
    for check in engine_checks:
        report.add(check)
    if fail_fast and report.failed:
        return report
    vllm = knowledge_for(version)
    report.add(check_model(scenario))
    if fail_fast and report.failed:
        return report
    gpus, platform = check_gpus(scenario)
    report.add(gpus)
    for check in check_flags(scenario, vllm, overrides, platform):
        report.add(check)
    if fail_fast and report.failed:
        return report
    try:
        typed = vllm.coerce_all({**scenario.engine.flags, **(overrides or {})}, "flags")
    except UserInputError:
        typed = {}  # the flags check said why
    report.add(check_model_fits(scenario, typed, platform, served_context(scenario, typed)))
    if fail_fast and report.failed:
        return report
    report.add(check_workload(scenario, typed))
    if storage is not None:
        report.add(check_storage(storage))
    if log_dir is not None and backend_for(scenario).runs_process:
        report.add(check_log_dir(log_dir))
    report.add(check_host_ram(scenario))
    report.add(check_proxies())
    return report


def preflight(scenario: Scenario, *, storage: str | None, log_dir: Path | None,
              overrides: Mapping[str, FlagValue] | None = None) -> Report:
    """Run the checks; raise PreflightError (exit 2) when one failed."""
    report = run_checks(scenario, storage=storage, log_dir=log_dir, overrides=overrides, fail_fast=True)
    if report.failed:
        raise PreflightError(report)
    return report
