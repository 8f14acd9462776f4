"""The daemon's verify figures in the certificate's units, held against the range one run of the certified
config falls in (daemon/status.py)."""

from __future__ import annotations

from autotuner.daemon.status import verify_figures

CERT = {"basis": "simulated-hardware time; mean of 3 re-measurements",
        "metrics": {"output_tokens_per_s": 266.0, "ttft_p95_s": 4.9},
        "intervals": {"output_tokens_per_s": {"mean": 266.0, "low": 250.0, "high": 282.0, "n": 3},
                      "ttft_p95_s": {"mean": 4.9, "low": 4.4, "high": 5.4, "n": 3}},
        "next_run": {"output_tokens_per_s": {"mean": 266.0, "low": 240.0, "high": 292.0, "n": 3},
                     "ttft_p95_s": {"mean": 4.9, "low": 4.1, "high": 5.7, "n": 3}}}


def test_wall_clock_figures_are_converted_before_they_are_compared() -> None:
    out = verify_figures(CERT, {"output_tokens_per_s": 2659.0, "ttft_p95_s": 0.61}, production_speedup=10)
    assert out is not None
    figures = out["figures"]
    assert figures["output_tokens_per_s"]["in_certificate_units"] == 265.9
    assert figures["ttft_p95_s"]["in_certificate_units"] == 6.1
    assert "output 265.9 tok/s (within the range one run of the certified config falls in, 95 %: 240.0–292.0" \
        in out["summary"]
    assert "TTFT p95 6.100 s (above the range one run of the certified config falls in" in out["summary"]
    assert "speed-up 10 converted to simulated-hardware time" in out["summary"] and "2659" not in out["summary"]


def test_a_real_box_is_compared_as_measured() -> None:
    out = verify_figures({**CERT, "basis": "wall-clock time on the box"}, {"output_tokens_per_s": 245.0})
    assert out is not None and "output 245.0 tok/s (within" in out["summary"]  # below the mean's interval: no matter
    out = verify_figures({**CERT, "basis": "wall-clock time on the box"}, {"output_tokens_per_s": 230.0})
    assert out is not None and "output 230.0 tok/s (below" in out["summary"]
    assert out["units"] == "one verify run, wall-clock time"
    against_sim = verify_figures(CERT, {"output_tokens_per_s": 240.0})
    assert against_sim is not None and "(the certificate is in simulated-hardware time)" in against_sim["units"]
    assert verify_figures(CERT, {}) is None and verify_figures(None, {"failed": 0}) is None


def test_a_certificate_without_the_next_run_range_shows_its_mean_only() -> None:
    """Certificates written before the range was kept: a single run is not held against the mean's interval."""
    old = {k: v for k, v in CERT.items() if k != "next_run"}
    out = verify_figures(old, {"output_tokens_per_s": 2300.0}, production_speedup=10)
    assert out is not None and "output 230.0 tok/s (certificate: mean 266.0 of 3 runs)" in out["summary"]
    assert "within" not in out["summary"] and "below" not in out["summary"]
