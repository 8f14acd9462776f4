"""A preflight's result: named checks, each ok, warning or failed, with the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from autotuner.errors import UserInputError

Status = Literal["ok", "warning", "failed"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None

    def message(self) -> str:
        """The detail (it names the field or command) and the fix."""
        end = "" if self.detail.endswith(".") else "."
        return f"{self.detail}{end}" + (f" Fix: {self.fix}." if self.fix else "")

    def line(self) -> str:
        end = "" if self.detail.endswith(".") else "."
        fix = f" Fix: {self.fix}." if self.fix else ""
        return f"{self.name}: {self.detail}{end}{fix}"


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "failed"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warning"]

    @property
    def exit_code(self) -> int:
        """`autotuner doctor`: 0 all ok, 1 warnings only, 2 something failed."""
        return 2 if self.failed else 1 if self.warnings else 0


class PreflightError(UserInputError):
    """A failed preflight check: bad input or a machine that cannot run the job (exit 2)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        super().__init__("\n".join(c.message() for c in report.failed))
