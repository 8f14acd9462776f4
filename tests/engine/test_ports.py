"""Ports for engines: the kernel's by default; with AUTOTUNER_PORT_RANGE, only that range (each xdist worker of
this suite has its own); never the same port twice in a row from one process; a bad range is the user's error."""

from __future__ import annotations

import itertools
import socket

import pytest

from autotuner.engine.ports import PORT_RANGE_ENV, free_port, port_range
from autotuner.errors import UserInputError
from tests.support.plugin import worker_port_range


def test_a_range_is_honoured_and_no_port_is_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-23049")
    ports = [free_port() for _ in range(40)]
    assert all(23000 <= p <= 23049 for p in ports)
    assert len(set(ports)) == 40


def _held_below_a_free_one() -> socket.socket:
    """A socket bound to a port whose next port is free now (on a busy box the kernel's next pick may not be)."""
    for _ in range(50):
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", held.getsockname()[1] + 1))
                return held
            except OSError:
                held.close()
    raise AssertionError("no port with a free neighbour in 50 tries")


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with _held_below_a_free_one() as held:
        taken = held.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_ENV, f"{taken}-{taken + 1}")
        assert free_port() == taken + 1


def test_without_a_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # it was free


@pytest.mark.parametrize("spec", ["20000", "x-y", "30000-20000", "80-90", "60000-70000"])
def test_a_bad_range_names_the_variable_and_the_form(spec: str) -> None:
    with pytest.raises(UserInputError, match=rf"{PORT_RANGE_ENV}=.*expected LOW-HIGH"):
        port_range(spec)


def test_workers_get_disjoint_ranges_below_the_ephemeral_ones() -> None:
    ranges = [port_range(worker_port_range(f"gw{i}", 3)) for i in range(3)]
    assert all(r is not None for r in ranges)
    bounds = sorted(r for r in ranges if r is not None)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(bounds))
    assert bounds[-1][1] < 32768  # Linux's ephemeral ports start there: no client connection takes ours
