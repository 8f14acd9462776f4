"""`autotuner export`: choose the trial, check that this machine is the study's, render the format,
write it atomically (or print it)."""

from __future__ import annotations

import sys
from pathlib import Path

from autotuner.analysis.candidates import check_policy
from autotuner.analysis.compare import COMPARED, show
from autotuner.analysis.evidence import higher_is_better
from autotuner.analysis.selection import Selection, select
from autotuner.analysis.slo import parse_slo
from autotuner.errors import UserInputError
from autotuner.export.atomic import check_output_file, replacement_mode, write_text_atomic
from autotuner.export.certificate import build_certificate
from autotuner.export.formats import FORMATS, RENDERERS, deployment
from autotuner.export.target import check_target

STDOUT = "-"


def run_export(storage: str, study: str | None, slo: list[str], policy: str, fmt: str, output: Path | None,
               force: bool, allow_unverified: bool = False) -> int:
    """Exit code 0 on success; bad input raises UserInputError (the CLI prints it and exits 2), having
    written nothing."""
    # Everything the user typed is checked before the database is opened.
    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    check_policy(policy)
    for text in slo:
        parse_slo(text)
    to_stdout = output is None or str(output) == STDOUT
    if output is not None and not to_stdout:
        check_output_file(output, force)

    selection = select(storage, study, slo, policy)
    if selection.study.note:
        _say(f"note: {selection.study.note}")
    target = check_target(selection.study, force)
    for warning in target.warnings:
        _say(f"warning: {warning}")
    if selection.missing and not allow_unverified:
        raise UserInputError(f"trial {selection.chosen.trial_number} of study {selection.study.name} is not verified; "
                             "missing: " + "; ".join(selection.missing)
                             + ". Or export it anyway with --allow-unverified (the certificate will say so)")
    if selection.single_shot is not None:
        _say(f"note: the single-shot best, trial {selection.single_shot.trial_number}, did not hold up when "
             f"re-measured; exporting the confirmed best, trial {selection.chosen.trial_number}")
    certificate = build_certificate(selection, target.notes, allow_unverified)
    text = RENDERERS[fmt](deployment(selection, certificate))

    summary = summary_line(selection)
    if certificate.recommendation:
        _say(f"recommendation: {certificate.recommendation}")
    if to_stdout:
        sys.stdout.write(text)
        sys.stdout.flush()
        _say(summary)
    else:
        assert output is not None
        write_text_atomic(output, text, replacement_mode(output))
        _say(f"wrote {output} ({fmt}): {summary}")
    return 0


def summary_line(selection: Selection) -> str:
    """What was exported, each figure saying what it is: the re-measured mean with its 95 % interval and
    the bound the selection counted on, or the one run it was; then the comparison with the reference."""
    chosen = selection.chosen
    c = selection.confirmation
    parts = []
    for metric, name, unit, digits in COMPARED:
        iv = c.intervals.get(metric) if c is not None else None
        if iv is not None:
            bound, side = (iv.low, "at least") if higher_is_better(metric) else (iv.high, "at most")
            parts.append(f"{name} mean {show(iv, unit, digits)} ({side} {bound:.{digits}f}, 95 % bound)")
        elif isinstance(value := chosen.metrics.get(metric), int | float):
            parts.append(f"{name} {value:.{digits}f} {unit} (one run)")
    peak = c.worst_peak_fraction if c is not None else chosen.memory.get("peak_fraction")
    parts.append(f"memory peak {(peak or 0):.1%} ({'worst of all runs' if c is not None else 'one run'})")
    line = f"trial {chosen.trial_number} of study {selection.study.name} ({selection.policy}): " + ", ".join(parts)
    if selection.comparisons:
        line += f"; {selection.comparisons[0].sentence()}"
    return line


def _say(line: str) -> None:
    # Messages go to stderr so that `export ... > file` and `-o -` keep stdout for the artefact.
    print(line, file=sys.stderr)
