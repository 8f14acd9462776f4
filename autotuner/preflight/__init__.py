"""Preflight: what a run needs, checked before anything is launched or written.

`tune` and `measure` run it first (a failed check: one message naming the field or command and the
fix, exit 2, nothing written); `autotuner doctor` shows every check in a table.
"""

from autotuner.preflight.checklist import Check, PreflightError, Report, Status
from autotuner.preflight.run import preflight, run_checks

__all__ = ["Check", "PreflightError", "Report", "Status", "preflight", "run_checks"]
