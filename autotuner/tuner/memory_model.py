"""Peak GPU memory per card as a function of the searched flags, fitted from the study's own trials.

The form is vLLM V1's accounting (autotuner/sim/memory.py walks it step by step): at startup the
engine takes `utilization × total` for weights, the profiled activation of one `max-num-batched-tokens`
step, CUDA graphs and the KV cache (the KV cache gets whatever is left), and the CUDA context sits
outside that budget. While serving, a step of T tokens adds what the profile never charged, linear in
T (T ≤ the budget and ≤ what the workload can put in one step). Offloaded weights leave the card but
the KV cache takes their room, so offload mostly changes whether the engine starts, not its peak; its
coefficient is fitted like the others. Per card, as a fraction of the card's total:

    peak ≈ c0 + c_util · util + c_budget · budget + c_step · min(budget, step_cap) + c_off · offload

Coefficients: Bayesian linear regression (Gaussian prior centred on the accounting: context ≈ 1-2 %,
c_util ≈ 1, the rest ≈ 0 with wide spread), noise variance from the residuals with a prior of a few
percent of the card, so the prediction interval is wide at first and shrinks as trials come in. The
coefficients come from the measurements, never from the simulator: a real box differs from any
simulator. Evidence:
- an OK trial: its measured peak;
- an OOM trial (threshold trip or CUDA OOM): a lower bound (the peak at abort; a crash filled the
  card). Censored points enter as observations at their bound while the fit predicts less (a Tobit
  fit in a few passes);
- a startup failure for lack of KV room ("No available memory for the cache blocks", max-model-len
  does not fit, weights do not fit): every candidate with no more utilization, no more offload and no
  smaller budget fails too (monotone in each flag, no fit needed).

Before any failure, the model's shape says which candidates cannot start (`Shape`, in
tuner/scenario_memory.py with the rest of what the scenario says before any trial), and which
offloads are not needed (the same candidate without offload starts: offloading then only slows
every step).

`screen(flags)` returns a `Prediction` when a candidate is over the OOM threshold with the stated
confidence, cannot start, or offloads with no need (the study records it as `oom-predicted`, never
launched), else None. `probe(...)` picks the first trials after the baseline so that they pin the
wall. Moving a ruled-out candidate to the nearest likely one is tuner/memory_repair.py; carrying a
study's model over to another model (warm start, model swap) is tuner/memory_warm_start.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from autotuner.monitor import Threshold
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord
from autotuner.trials import offload_axis
from autotuner.trials.outcomes import OOM_OUTCOMES, TRUST_KINDS, Outcome
from autotuner.tuner.scenario_memory import DEFAULT_MAX_NUM_SEQS, MAX_MODEL_LEN, Shape, simulated_card_bytes, step_cap
from autotuner.tuner.space import Space, offload_shape
from autotuner.vllm import FlagValue
from autotuner.vllm.flags import UTILIZATION

BUDGET = "max-num-batched-tokens"
UTIL = UTILIZATION
OFFLOAD = "cpu-offload-gb"
TOKENS = 10_000.0  # budget features in units of 10k tokens: coefficients of order 0.01–0.1
FEATURES = ("const", "util", "budget", "step", "offload")
# Prior: the accounting's shape, loose enough that the first measurements move it.
PRIOR_MEAN = np.array([0.015, 1.0, 0.0, 0.0, 0.0])
PRIOR_SD = np.array([0.10, 0.15, 0.30, 0.30, 0.05])
# Noise on one card's peak (fraction of the card): prior guess and its weight in pseudo-observations.
NOISE_PRIOR_SD = 0.01
NOISE_PRIOR_N = 1.0
NOISE_FLOOR_SD = 0.004
# Skip a candidate when P(peak > threshold) is at least this.
SKIP_CONFIDENCE = 0.9
# A probe after the baseline may cross the threshold with at most this probability.
PROBE_MAX_P_OVER = 0.2
# The interval stored with a prediction (two-sided).
INTERVAL = 0.9
# The shape's accounting is judged with this slack (a fraction of the card) either way: a candidate
# cannot start when its KV room is below -slack, surely starts when above +slack.
STARTUP_SLACK = 0.01
# Startup failures that mean "no room left for the KV cache or the weights" (monotone in the flags).
_NO_ROOM = ("No available memory for the cache blocks", "To serve at least one request",
            "Failed to load model - not enough GPU memory", "CUDA out of memory occurred when warming up")


@dataclass(frozen=True)
class Prediction:
    """The model's word on one candidate, stored in the trial's user attrs."""

    peak_fraction: float  # predicted peak / total on the fullest card
    low: float  # the INTERVAL prediction interval
    high: float
    p_over: float  # probability that the peak crosses the threshold
    limit_fraction: float
    trials: int  # measurements behind the fit
    reason: str = ""
    blocker: int | None = None  # a trial whose failure implies this one's (startup room)

    def to_attrs(self) -> dict[str, Any]:
        return {f"predicted:{k}": v for k, v in asdict(self).items() if v is not None and k != "reason"}


@dataclass(frozen=True)
class Observation:
    trial_number: int
    x: tuple[float, ...]
    y: float
    censored: bool  # y is a lower bound (the trial ran out of memory)


@dataclass
class MemoryModel:
    """Fitted peak memory for one study (one model, one GPU type, one workload)."""

    threshold: Threshold
    total_bytes: int | None = None  # one card's total, once a trial measured it
    step_cap: float = math.inf  # most tokens the workload can put in one step
    defaults: dict[str, FlagValue] = field(default_factory=dict)
    prior_mean: np.ndarray = field(default_factory=PRIOR_MEAN.copy)
    prior_sd: np.ndarray = field(default_factory=PRIOR_SD.copy)
    observations: list[Observation] = field(default_factory=list)
    no_room: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    ran_out: list[tuple[int, dict[str, FlagValue]]] = field(default_factory=list)
    shape: Shape | None = None
    card_bytes: int | None = None  # one card's total before any measurement (a simulated GPU's)
    offload_shape: offload_axis.LayerShape | None = None  # turns prefetch flags into GiB freed
    _fit: tuple[np.ndarray, np.ndarray, float] | None = None

    # --- building -----------------------------------------------------------------------------------
    @classmethod
    def for_scenario(cls, scenario: Scenario, defaults: Mapping[str, FlagValue],
                     records: Sequence[TrialRecord] = ()) -> MemoryModel:
        """A study's model from its recorded trials so far (resume, or a fresh study with none)."""
        from autotuner.trials.scoring import threshold_of

        model = cls(threshold=threshold_of(scenario), step_cap=step_cap(scenario), defaults=dict(defaults),
                    shape=Shape.of(scenario), card_bytes=simulated_card_bytes(scenario),
                    offload_shape=offload_shape(scenario))
        for r in records:
            if r.kind not in TRUST_KINDS:
                model.observe(r.trial_number, r.flags, r.outcome, r.result.get("memory"), r.reason)
        return model

    @property
    def limit_fraction(self) -> float:
        if self.threshold.fraction is not None:
            return self.threshold.fraction
        if not self.total_bytes:
            return 1.0
        return self.threshold.limit_bytes(self.total_bytes) / self.total_bytes

    def features(self, flags: Mapping[str, FlagValue]) -> tuple[float, ...]:
        budget = float(flag_number(flags, BUDGET, self.defaults, 8192))
        util = float(flag_number(flags, UTIL, self.defaults, 0.9))
        # GiB freed per GPU whatever the backend (UVA's --cpu-offload-gb, or prefetch's layers less buffers).
        offload = offload_axis.freed_gib({**self.defaults, **flags}, self.offload_shape)
        return (1.0, util, budget / TOKENS, min(budget, self.step_cap) / TOKENS, offload / 100.0)

    def observe(self, trial_number: int, flags: Mapping[str, FlagValue], outcome: str,
                memory: Mapping[str, Any] | None, reason: str | None = None) -> None:
        """One finished trial's evidence (any outcome; those that say nothing are ignored)."""
        memory = memory or {}
        totals = [int(t) for t in memory.get("total_bytes") or [] if t]
        if totals:
            self.total_bytes = min(totals)
        x = self.features(flags)
        peak = memory.get("peak_fraction")
        if outcome == Outcome.STARTUP_FAILED and reason and any(s in reason for s in _NO_ROOM):
            self.no_room.append((trial_number, {BUDGET: x[2] * TOKENS, UTIL: x[1], OFFLOAD: x[4] * 100.0}))
            return
        if outcome in OOM_OUTCOMES:
            self.ran_out.append((trial_number, dict(flags)))
            bound = 1.0 if outcome == Outcome.OOM_CRASH else max(float(peak or 0.0), self.limit_fraction)
            self.observations.append(Observation(trial_number, x, bound, True))
        elif outcome == Outcome.PRUNED and peak:
            # Stopped early: the peak so far is a lower bound of the whole run's.
            self.observations.append(Observation(trial_number, x, float(peak), True))
        elif outcome == Outcome.OK and peak:
            self.observations.append(Observation(trial_number, x, float(peak), False))
        else:
            return
        self._fit = None

    # --- fitting ------------------------------------------------------------------------------------
    def fit(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Posterior mean and covariance of the coefficients, and the noise variance."""
        if self._fit is not None:
            return self._fit
        precision0 = np.diag(1.0 / self.prior_sd ** 2)
        exact = [o for o in self.observations if not o.censored]
        censored = [o for o in self.observations if o.censored]
        noise = NOISE_PRIOR_SD ** 2
        mean, cov = self.prior_mean.copy(), np.diag(self.prior_sd ** 2)
        for _ in range(4):  # Tobit by passes: a bound counts while the fit predicts below it
            rows = exact + [o for o in censored if float(np.dot(o.x, mean)) < o.y]
            x = np.array([o.x for o in rows]).reshape(-1, len(FEATURES))
            y = np.array([o.y for o in rows])
            precision = precision0 + x.T @ x / noise
            cov = np.linalg.inv(precision)
            mean = cov @ (precision0 @ self.prior_mean + x.T @ y / noise)
            ssr = float(np.sum((y - x @ mean) ** 2)) if len(rows) else 0.0
            noise = max(NOISE_FLOOR_SD ** 2, (NOISE_PRIOR_N * NOISE_PRIOR_SD ** 2 + ssr) / (NOISE_PRIOR_N + len(rows)))
        self._fit = (mean, cov, noise)
        return self._fit

    def predict(self, flags: Mapping[str, FlagValue]) -> Prediction:
        mean, cov, noise = self.fit()
        x = np.array(self.features(flags))
        mu = float(x @ mean)
        sd = math.sqrt(noise + float(x @ cov @ x))
        normal = NormalDist()
        z = normal.inv_cdf((1 + INTERVAL) / 2)
        p_over = 1.0 - normal.cdf((self.limit_fraction - mu) / sd)
        return Prediction(round(mu, 4), round(mu - z * sd, 4), round(mu + z * sd, 4), round(p_over, 4),
                          self.limit_fraction, len(self.observations))

    @property
    def coefficients(self) -> dict[str, float]:
        return dict(zip(FEATURES, (float(c) for c in self.fit()[0]), strict=True))

    # --- decisions ----------------------------------------------------------------------------------
    def screen(self, flags: Mapping[str, FlagValue], confidence: float = SKIP_CONFIDENCE) -> Prediction | None:
        """A Prediction when the candidate runs out of memory with at least `confidence`, else None.
        Never on the prior alone: a card that has not been measured once is not judged."""
        x = self.features(flags)
        for number, oom in self.ran_out:
            if _at_least_as_large(flags, oom):
                p = self._predict_or_unknown(flags)
                return Prediction(p.peak_fraction, p.low, p.high, 1.0, self.limit_fraction, p.trials,
                                  f"at least as large as trial {number}, which ran out of memory, in every "
                                  "memory-growing flag", number)
        for number, failed in self.no_room:  # less room than a trial that could not start
            if x[1] <= failed[UTIL] + 1e-9 and x[4] * 100 <= failed[OFFLOAD] + 1e-9 and x[2] * TOKENS >= failed[BUDGET]:
                p = self._predict_or_unknown(flags)
                return Prediction(p.peak_fraction, p.low, p.high, 1.0, self.limit_fraction, p.trials,
                                  f"no more memory room than trial {number}, which could not start", number)
        room = self.kv_room(flags)
        if room is not None and room < -STARTUP_SLACK and not self._started_with_less_room(x):
            p = self._predict_or_unknown(flags)
            return Prediction(p.peak_fraction, p.low, p.high, 1.0, self.limit_fraction, p.trials,
                              f"cannot start: the model's weights, one budget step and one max-model-len "
                              f"request leave {room:.1%} of a card for the KV cache")
        bare = _without_offload(flags)
        if x[4] > 0 and self.starts(bare) and self.screen(bare) is None:
            p = self._predict_or_unknown(flags)
            return Prediction(p.peak_fraction, p.low, p.high, 1.0, self.limit_fraction, p.trials,
                              "offload not needed: the same candidate without offload starts (offloading "
                              "only slows every step)")
        if not self.observations:
            return None
        p = self.predict(flags)
        if p.p_over < confidence:
            return None
        return Prediction(p.peak_fraction, p.low, p.high, p.p_over, p.limit_fraction, p.trials,
                          f"predicted peak {p.peak_fraction:.1%} of a card ({INTERVAL:.0%} interval "
                          f"{p.low:.1%}–{p.high:.1%}) over the threshold {p.limit_fraction:.1%} with "
                          f"probability {p.p_over:.0%} ({p.trials} measured trials)")

    def kv_room(self, flags: Mapping[str, FlagValue]) -> float | None:
        """The shape's KV room at startup (fraction of a card); None when the shape or the card is unknown."""
        total = self.total_bytes or self.card_bytes
        if self.shape is None or not total:
            return None
        x = self.features(flags)
        length = flag_number(flags, MAX_MODEL_LEN, self.defaults, self.shape.max_model_len)
        seqs = flag_number(flags, "max-num-seqs", self.defaults, DEFAULT_MAX_NUM_SEQS)
        return self.shape.kv_room(x[1], x[2] * TOKENS, x[4] * 100.0, total, int(length), int(seqs))

    def starts(self, flags: Mapping[str, FlagValue]) -> bool:
        """Surely starts: measured with less room, or the shape leaves room to spare; never against a
        startup failure with more room."""
        x = self.features(flags)
        if any(x[1] <= f[UTIL] + 1e-9 and x[4] * 100 <= f[OFFLOAD] + 1e-9 and x[2] * TOKENS >= f[BUDGET]
               for _, f in self.no_room):
            return False
        if self._started_with_less_room(x):
            return True
        room = self.kv_room(flags)
        return room is not None and room > STARTUP_SLACK

    def _started_with_less_room(self, x: tuple[float, ...]) -> bool:
        return any(o.x[1] <= x[1] + 1e-9 and o.x[4] <= x[4] + 1e-9 and o.x[2] >= x[2] - 1e-9
                   for o in self.observations)

    def _predict_or_unknown(self, flags: Mapping[str, FlagValue]) -> Prediction:
        if self.observations:
            return self.predict(flags)
        return Prediction(math.nan, math.nan, math.nan, 1.0, self.limit_fraction, 0)

    def probe(self, space: Space, base: Mapping[str, FlagValue], index: int,
              max_p_over: float = PROBE_MAX_P_OVER) -> dict[str, FlagValue] | None:
        """The `index`-th trial after the baseline: the wall pinned at both ends of the utilization
        range — at the highest utilization (then the lowest), the largest token budget the model
        expects to serve (chance of crossing the threshold at most `max_p_over`). The two ends and the
        baseline fix the wall's slope in both flags, and the best configs of a memory-bound study lie
        along it (a big KV cache with a small budget, or the reverse). Never a measured point again."""
        util, budget = space.distributions.get(UTIL), space.distributions.get(BUDGET)
        if util is None or budget is None or not (self.observations or self.no_room or self.kv_room(base) is not None):
            return None
        lo, hi = float(getattr(util, "low", 0.0)), float(getattr(util, "high", 1.0))
        step = getattr(util, "step", None) or 0.01
        # The low end is the lowest utilization that can start (a probe that cannot start pins nothing).
        utils = [hi] if index % 2 == 0 else [lo + k * step for k in range(round((hi - lo) / step) + 1)]
        b_lo, b_hi = float(getattr(budget, "low", 256)), float(getattr(budget, "high", 16384))
        seen = {o.x for o in self.observations}
        for i in range(24, -1, -1):
            for u in utils:
                flags = {**base, UTIL: round(u, 6), BUDGET: b_lo * (b_hi / b_lo) ** (i / 24)}
                flags = {**base, **space.to_flags(space.clamp(flags))}
                if self.features(flags) in seen or self.screen(flags) is not None:
                    continue
                if self.predict(flags).p_over <= max_p_over:
                    return flags
                break  # more utilization only raises the peak
        return None


def _without_offload(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """The same candidate with no weights offloaded, whichever backend it used (UVA or prefetch)."""
    bare = {k: v for k, v in flags.items() if k != offload_axis.BACKEND_FLAG}
    bare[OFFLOAD] = 0.0
    if offload_axis.GROUP_FLAG in bare:
        bare[offload_axis.GROUP_FLAG] = 0
    return bare



def flag_number(flags: Mapping[str, FlagValue], key: str, defaults: Mapping[str, FlagValue], fallback: float) -> float:
    """A numeric flag of the candidate, else the study's default, else `fallback` (also for a non-number)."""
    value = flags.get(key, defaults.get(key, fallback))
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return fallback



# +1: more memory as the value grows; -1: less (vLLM and the simulator alike).
MONOTONE = {BUDGET: +1, UTIL: +1, "max-num-seqs": +1, "max-model-len": +1, OFFLOAD: -1}


def _at_least_as_large(candidate: Mapping[str, FlagValue], oom: Mapping[str, FlagValue]) -> bool:
    """Every memory-growing flag at least as large as in `oom`, every other flag equal."""
    if set(candidate) != set(oom):
        return False
    for name, value in candidate.items():
        other = oom[name]
        direction = MONOTONE.get(name)
        if direction is None or isinstance(value, bool) or isinstance(other, bool):
            if value != other:
                return False
            continue
        try:
            if direction * (float(value) - float(other)) < 0:  # type: ignore[arg-type]
                return False
        except (TypeError, ValueError):
            return False
    return True
