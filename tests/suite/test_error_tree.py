"""errors.py's promise: every exception autotuner defines is under one root, AutotunerError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import autotuner
from autotuner.errors import AutotunerError


def test_every_exception_autotuner_defines_is_an_autotuner_error() -> None:
    outside, seen = [], set()
    for info in pkgutil.walk_packages(autotuner.__path__, "autotuner."):
        if info.name.endswith("__main__"):  # runs its command when imported
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                seen.add(f"{info.name}.{name}")
                if not issubclass(value, AutotunerError):
                    outside.append(f"{info.name}.{name}")
    assert {"autotuner.watch.probe.ProbeError", "autotuner.sim.nvml.NVMLError"} <= seen  # the walk reaches them
    assert outside == []
