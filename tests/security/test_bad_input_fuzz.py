"""The generated corpus of benchmarks/fuzz.py, a small seeded slice of it: every case (scenario, trace, GPU file,
model config, daemon config, `--set`, raw requests to the daemon's endpoint) is certainly invalid, so each must
end as exit 2 with no traceback and nothing written; the endpoint answers no 5xx and keeps answering."""

from __future__ import annotations

from pathlib import Path

from benchmarks.fuzz import generate, run_fuzz


def test_the_generator_covers_every_surface_and_is_seeded() -> None:
    cases = generate(0, 850)
    assert len(cases) == 850
    assert {c.kind for c in cases} == {"scenario", "trace", "gpu", "model", "daemon", "set"}
    assert [c.what for c in generate(3, 900)] == [c.what for c in generate(3, 900)]
    assert len(generate(0, 100)) == 100


def test_a_slice_of_the_corpus_is_refused_cleanly(tmp_path: Path) -> None:
    counts = run_fuzz(tmp_path, seed=7, n=220, http_n=40, workers=2, subprocess_sample=2)
    failures = counts.pop("failures")
    assert counts["fuzz_tried"] >= 220
    assert (counts["fuzz_tracebacks"], counts["fuzz_wrong_exit"], counts["fuzz_files_left"]) == (0, 0, 0), failures[:5]
