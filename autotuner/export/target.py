"""Is this machine the one the study measured? A config certified on 8× RTX 3090 with one model says
nothing about an A100 or about a model whose weights changed since: the memory peaks would not hold.

Checked here: the GPUs (as NVML sees them, formatted the way the study key was) and the model (its
fingerprint recomputed when it is a local directory). A difference refuses the export unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotuner.analysis.study_data import StudyData
from autotuner.errors import AutotunerError, UserInputError
from autotuner.export.certificate import inventory_summary
from autotuner.monitor import factory
from autotuner.tuner.runners import model_fingerprint


@dataclass
class TargetCheck:
    notes: list[str] = field(default_factory=list)  # what was checked, for the certificate
    warnings: list[str] = field(default_factory=list)  # what the user should hear now


def local_inventory(gpu_indices: list[int] | None) -> list[str]:
    """This machine's GPUs, named as `MeasureRunner.study_key` names them. Raises AutotunerError when
    NVML cannot tell."""
    with factory.open_monitor("nvml", None) as monitor:
        devices = monitor.devices()
    if gpu_indices is not None:
        by_index = {d.index: d for d in devices}
        devices = [by_index[i] for i in gpu_indices if i in by_index]
    return [f"{d.name} ({d.total_bytes / 2**30:.2f} GiB)" for d in devices]


def check_target(study: StudyData, force: bool) -> TargetCheck:
    check = TargetCheck()
    problems = [p for p in (_gpus(study, check), _model(study, check)) if p]
    if problems and not force:
        raise UserInputError("; ".join(problems) + ". Re-tune on this machine with the current model "
                             "(`autotuner tune`), or pass --force to export anyway")
    for problem in problems:
        check.notes.append(f"exported with --force although {problem}")
        check.warnings.append(f"--force: {problem}")
    return check


def _gpus(study: StudyData, check: TargetCheck) -> str | None:
    expected = study.record.key.gpu_inventory
    if study.simulated:
        # The study's machine is the simulated one in its key: there is no other to compare with.
        check.notes.append(f"GPUs: the simulated {inventory_summary(expected)} of the study key")
        return None
    try:
        here = local_inventory(study.scenario.engine.gpus)
    except AutotunerError as exc:
        check.notes.append("GPUs: not checked (NVML unavailable where this was exported)")
        check.warnings.append(f"GPU check skipped, NVML is unavailable here ({exc}); make sure the target has "
                              f"{inventory_summary(expected)}")
        return None
    if here != expected:
        return (f"this machine's GPUs ({inventory_summary(here)}) differ from the study's "
                f"({inventory_summary(expected)}), so its memory peaks do not hold here")
    check.notes.append(f"GPUs: {inventory_summary(here)}, as in the study key")
    return None


def _model(study: StudyData, check: TargetCheck) -> str | None:
    model = study.scenario.engine.model
    expected = study.record.key.model_fingerprint
    path = Path(model).expanduser()
    if not path.is_dir():
        if path.is_absolute() or model.startswith((".", "~")):
            check.warnings.append(f"model directory {model} is not here: its fingerprint was not checked")
            check.notes.append("model: not checked (directory absent where this was exported)")
        else:
            check.notes.append(f"model: {model} by name (fingerprint {expected} not recomputable)")
        return None
    try:
        now = model_fingerprint(study.scenario)
    except AutotunerError as exc:
        return f"the model in {model} cannot be read ({exc})"
    if now != expected:
        return (f"the model in {model} changed since the study (fingerprint {now}, study {expected}): the "
                "measured memory and speed belong to the old model")
    check.notes.append(f"model: fingerprint {now} recomputed, as in the study key")
    return None
