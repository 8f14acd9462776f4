"""Run-to-run variation of the simulated engine, on purpose.

A real box never measures the same configuration twice alike: clocks boost and throttle, the PCIe
fabric is shared, the caching allocator fragments differently. Without that, a tuner cannot be tested
for the one mistake that matters most once deployed — crowning a lucky single measurement (TUNA,
arXiv 2503.01801: with ~5 % measurement noise, up to 63 % of "best" configs lose ≥ 30 % deployed).

One `RunNoise` per engine lifetime, drawn from (seed, run): the same seed and run give the same run;
another run of the same seed gives another draw. Applied outside the timing and memory formulas, as a
multiplier on each step's duration and an offset on each step's transient, so it never changes what
the roofline or the memory model compute.

- Speed of the run: log-normal with coefficient of variation `level` (default 3 %).
- Slow runs: one in `SLOW_RUN_EVERY` runs is a further 10–20 % slower (contention, thermals).
- Step jitter: each step's duration varies by `level` around the run's speed (ITL noise; it averages
  out over a run's thousands of steps).
- Memory: the run's transients carry an extra 0–`TRANSIENT_JITTER_BYTES` × level/DEFAULT_LEVEL
  (allocator fragmentation differs from one run to the next).
- Within a lifetime (off by default, `within` > 0): each replay of the workload on the same engine runs
  at the lifetime's speed times its own log-normal factor of CV `within` — the spread real vLLM shows
  between replays on one server (benchmarks/noise_split.py), for benchmarks of confirmation's replays.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from autotuner.filelocks import exclusive

DEFAULT_LEVEL = 0.03
SLOW_RUN_EVERY = 20
SLOW_RUN_FACTOR = (1.10, 1.20)
TRANSIENT_JITTER_BYTES = 384 << 20


@dataclass
class RunNoise:
    level: float
    speed: float = 1.0  # multiplier on step durations (> 1: slower)
    slow: bool = False
    transient_bytes: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    @classmethod
    def draw(cls, level: float, seed: int, run: int, replay: int = 0, within: float = 0.0) -> RunNoise:
        if level <= 0 and within <= 0:
            return cls(0.0)
        # A string seed is hashed with SHA-512: stable across processes and Python versions.
        rng = random.Random(f"sim-noise:{seed}:{run}")
        speed = _lognormal(rng, level)
        slow = level > 0 and rng.random() < 1.0 / SLOW_RUN_EVERY
        if slow:
            speed *= rng.uniform(*SLOW_RUN_FACTOR)
        transient = int(rng.random() * TRANSIENT_JITTER_BYTES * level / DEFAULT_LEVEL)
        if within > 0:
            rng = random.Random(f"sim-noise:{seed}:{run}:replay:{replay}")
            speed *= _lognormal(rng, within)
        return cls(max(level, within), speed, slow, transient, rng)

    @property
    def active(self) -> bool:
        return self.level > 0

    def step_seconds(self, seconds: float) -> float:
        if not self.active:
            return seconds
        return seconds * self.speed * max(0.5, self._rng.gauss(1.0, self.level))

    def transient(self, nbytes: int) -> int:
        return nbytes + self.transient_bytes if self.active and nbytes else nbytes

    def describe(self) -> str:
        if not self.active:
            return "off"
        return (f"level {self.level:.1%}, run speed ×{self.speed:.3f}{' (slow run)' if self.slow else ''}, "
                f"transient +{self.transient_bytes / 2**20:.0f} MiB")


def _lognormal(rng: random.Random, cv: float) -> float:
    """Mean 1, coefficient of variation `cv`."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def next_run(state_dir: Path, seed: int) -> int:
    """The server's launch counter per seed, in the simulated host's state directory: each `sim serve`
    of the same seed is another run, as each `vllm serve` on a real box is."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"noise-runs-{seed}"
    with exclusive(path) as fd:
        raw = os.read(fd, 32).decode(errors="replace").strip()
        run = int(raw) if raw.isdigit() else 0
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(run + 1).encode())
        return run
