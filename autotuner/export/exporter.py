"""`autotuner export`: choose the trial, check that this machine is the study's, render the format,
write it atomically (or print it)."""

from __future__ import annotations

import sys
from pathlib import Path

from autotuner.analysis.candidates import check_policy
from autotuner.analysis.selection import select
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

    chosen = selection.chosen
    summary = (f"trial {chosen.trial_number} of study {selection.study.name} ({policy}): "
               f"{chosen.metrics.get('output_tokens_per_s', 0):.1f} tok/s, TTFT p95 "
               f"{chosen.metrics.get('ttft_p95_s', 0):.3f} s, memory peak "
               f"{(chosen.memory.get('peak_fraction') or 0):.1%}")
    if to_stdout:
        sys.stdout.write(text)
        sys.stdout.flush()
        _say(summary)
    else:
        assert output is not None
        write_text_atomic(output, text, replacement_mode(output))
        _say(f"wrote {output} ({fmt}): {summary}")
    return 0


def _say(line: str) -> None:
    # Messages go to stderr so that `export ... > file` and `-o -` keep stdout for the artefact.
    print(line, file=sys.stderr)
