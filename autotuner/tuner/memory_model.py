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

Before any failure, the model's shape says which candidates cannot start (`Shape`, vLLM's startup
accounting: weights per card, the profiled activation of one budget step and the KV cache of one
max-model-len request must fit in utilization × total), and which offloads are not needed (the same
candidate without offload starts: offloading then only slows every step).

`screen(flags)` returns a `Prediction` when a candidate is over the OOM threshold with the stated
confidence, cannot start, or offloads with no need (the study records it as `oom-predicted`, never
launched), else None. `probe(...)` picks the first trials after the baseline so that they pin the
wall. `rescale(model_from, model_to)` carries a
study's model over to another model (warm start, model swap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autotuner.backends import backend_for
from autotuner.engine import classify as oc
from autotuner.monitor import Threshold
from autotuner.scenario import Scenario
from autotuner.store.db import Store, TrialRecord
from autotuner.trust import TRUST_KINDS
from autotuner.tuner import offload_axis
from autotuner.tuner.space import Space, offload_shape
from autotuner.vllm import FlagValue

BUDGET = "max-num-batched-tokens"
UTIL = "gpu-memory-utilization"
OFFLOAD = "cpu-offload-gb"
GIB = 1 << 30
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
OOM_OUTCOMES = (oc.OOM_THRESHOLD, oc.OOM_CRASH)
MAX_MODEL_LEN = "max-model-len"
# Startup needs besides weights, activation and KV: non-torch buffers and the CUDA-graph estimate
# (vLLM charges both to the budget; 0.3-0.6 GiB seen on 24 GB cards).
STARTUP_OVERHEAD_BYTES = int(0.5 * GIB)
# The shape's accounting is judged with this slack (a fraction of the card) either way: a candidate
# cannot start when its KV room is below -slack, surely starts when above +slack.
STARTUP_SLACK = 0.01
SAMPLER_BYTES_PER_LOGIT = 16
# Repair: a share of the utilization range given up costs this many shares of the budget's (log) range.
# Utilization is the KV cache of every request in flight; a smaller budget only splits long prefills
# into more chunks, and a budget beyond what one step holds buys nothing.
UTIL_WEIGHT = 3.0
DEFAULT_MAX_NUM_SEQS = 256
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
class Shape:
    """What vLLM's startup needs on one card, from the model's shape (bytes)."""

    weights: int  # weights per card before offload
    kv_per_token: int
    activation_per_token: int  # the profiled forward pass, per budget token
    max_model_len: int
    vocab_size: int = 0

    @classmethod
    def of(cls, scenario: Scenario) -> Shape | None:
        """From a preset or a local config.json; None for a hub name we cannot read offline."""
        from autotuner.catalog.models import load_model
        from autotuner.errors import ModelSpecError

        try:
            spec = load_model(scenario.engine.model)
        except ModelSpecError:
            return None
        tp = scenario.tensor_parallel_size()
        length = scenario.engine.flags.get(MAX_MODEL_LEN, spec.derived_max_model_len)
        try:
            length = int(length)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            length = spec.derived_max_model_len
        return cls(spec.weight_bytes // tp, spec.kv_bytes_per_token(tp), int(_activation_per_token(spec, tp)), length,
                   spec.vocab_size)

    def kv_room(self, util: float, budget: float, offload_gib: float, total: int, max_model_len: int,
                max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> float:
        """What the KV cache gets beyond one max-model-len request, as a fraction of the card."""
        weights = max(0.0, self.weights - offload_gib * GIB)
        # The profile run samples min(budget, max-num-seqs) rows: float32 logits plus softmax/sort copies.
        sampler = min(budget, max_num_seqs) * self.vocab_size * SAMPLER_BYTES_PER_LOGIT
        left = util * total - weights - STARTUP_OVERHEAD_BYTES - budget * self.activation_per_token - sampler
        return (left - self.kv_per_token * max_model_len) / total


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
        from autotuner.tuner.trial import threshold_of

        model = cls(threshold=threshold_of(scenario), step_cap=step_cap(scenario), defaults=dict(defaults),
                    shape=Shape.of(scenario), card_bytes=_card_bytes(scenario),
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
        budget = float(_num(flags, BUDGET, self.defaults, 8192))
        util = float(_num(flags, UTIL, self.defaults, 0.9))
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
        if outcome == oc.STARTUP_FAILED and reason and any(s in reason for s in _NO_ROOM):
            self.no_room.append((trial_number, {BUDGET: x[2] * TOKENS, UTIL: x[1], OFFLOAD: x[4] * 100.0}))
            return
        if outcome in OOM_OUTCOMES:
            self.ran_out.append((trial_number, dict(flags)))
            bound = 1.0 if outcome == oc.OOM_CRASH else max(float(peak or 0.0), self.limit_fraction)
            self.observations.append(Observation(trial_number, x, bound, True))
        elif outcome == oc.PRUNED and peak:
            # Stopped early: the peak so far is a lower bound of the whole run's.
            self.observations.append(Observation(trial_number, x, float(peak), True))
        elif outcome == oc.OK and peak:
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
        z = _z((1 + INTERVAL) / 2)
        p_over = 1.0 - _phi((self.limit_fraction - mu) / sd)
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
        length = _num(flags, MAX_MODEL_LEN, self.defaults, self.shape.max_model_len)
        seqs = _num(flags, "max-num-seqs", self.defaults, DEFAULT_MAX_NUM_SEQS)
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


def repair(model: MemoryModel, space: Space, flags: Mapping[str, FlagValue],
           max_p_over: float = PROBE_MAX_P_OVER) -> dict[str, FlagValue] | None:
    """The nearest candidate that is likely to serve to one the model ruled out: utilization (up or
    down), the token budget (log scale) and offload each measured as a share of its range, utilization
    counting UTIL_WEIGHT times, so the cheapest axis moves first — a budget shrunk before a KV cache
    given up, more utilization for a candidate that cannot start, no offload where none is needed.
    The sampler asks where the optimum is, and the optimum of a memory-bound study sits just under the wall."""
    util = space.distributions.get(UTIL)
    budget = space.distributions.get(BUDGET)
    offload = space.distributions.get(OFFLOAD)
    if util is None or not (model.observations or model.no_room or model.kv_room(flags) is not None):
        return None
    u_lo, u_hi = float(getattr(util, "low", 0.0)), float(getattr(util, "high", 1.0))
    step = getattr(util, "step", None) or 0.01
    u0 = float(_num(flags, UTIL, model.defaults, 0.9))
    b0 = float(_num(flags, BUDGET, model.defaults, 8192))
    o0 = float(_num(flags, OFFLOAD, model.defaults, 0.0))
    utils = [u_lo + k * step for k in range(round((u_hi - u_lo) / step) + 1)] if u_hi > u_lo else [u0]
    if budget is not None:
        b_lo, b_hi = float(getattr(budget, "low", 1)), float(getattr(budget, "high", b0))
        budgets = [b for b in (b0 * 0.8 ** j for j in range(-3, 13)) if b_lo - 1e-9 <= b <= b_hi + 1e-9]
        b_span = max(math.log(b_hi / b_lo), 1e-9)
    else:
        budgets, b_span = [b0], 1.0
    offloads = sorted({0.0, o0}) if offload is not None else [o0]
    o_span = max(float(getattr(offload, "high", 1.0)) - float(getattr(offload, "low", 0.0)), 1e-9) if offload else 1.0
    u_span = max(u_hi - u_lo, 1e-9)

    def distance(c: tuple[float, float, float]) -> tuple[float, float]:
        u, b, o = c
        # Dropping offload costs nothing (it only slows every step); any other offload change does.
        moved = 0.0 if o == 0.0 else abs(o - o0) / o_span
        return (UTIL_WEIGHT * abs(u - u0) / u_span + abs(math.log(b / b0)) / b_span + moved, -u)

    for u, b, o in sorted(((u, b, o) for u in utils for b in budgets for o in offloads), key=distance):
        candidate = {**flags, UTIL: round(u, 6), BUDGET: int(b)}
        if offload is not None:
            candidate[OFFLOAD] = o
        candidate = {**flags, **space.to_flags(space.clamp(candidate))}
        if _same(candidate, flags):
            continue
        if model.screen(candidate) is None and (not model.observations
                                                or model.predict(candidate).p_over <= max_p_over):
            return candidate
    return None


def _without_offload(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """The same candidate with no weights offloaded, whichever backend it used (UVA or prefetch)."""
    bare = {k: v for k, v in flags.items() if k != offload_axis.BACKEND_FLAG}
    bare[OFFLOAD] = 0.0
    if offload_axis.GROUP_FLAG in bare:
        bare[offload_axis.GROUP_FLAG] = 0
    return bare


def _same(a: Mapping[str, FlagValue], b: Mapping[str, FlagValue]) -> bool:
    return all(a.get(k) == b.get(k) for k in (UTIL, BUDGET, OFFLOAD))


def rescale(model: MemoryModel, model_from: Any, model_to: Any, tensor_parallel: int = 1,
            total_bytes: int | None = None) -> MemoryModel:
    """The fitted model of one served model carried to another (warm start, model swap), as a prior:
    the per-token terms scale with the activation per token (hidden and MLP widths), the constant with
    the non-KV weights' share when the card's size is known; the spread widens so that the new
    model's first trials dominate. `model_from`/`model_to` are `autotuner.catalog.models.ModelSpec`s (a
    preset name or a config.json directory gives one through `load_model`)."""
    mean, cov, _ = model.fit()
    act_from = _activation_per_token(model_from, tensor_parallel)
    act_to = _activation_per_token(model_to, tensor_parallel)
    ratio = act_to / act_from if act_from else 1.0
    new_mean = mean.copy()
    new_mean[2] *= ratio
    new_mean[3] *= ratio
    if total_bytes:
        # Offload moves weights off the card; its effect per GiB scales with how much of the card the
        # weights take against the KV cache: by the weight ratio, a first-order guess.
        w_from, w_to = model_from.weight_bytes, model_to.weight_bytes
        new_mean[4] *= w_to / w_from if w_from else 1.0
    spread = np.sqrt(np.diag(cov)) * max(ratio, 1 / ratio if ratio else 1.0) * 2 + PRIOR_SD * 0.5
    return MemoryModel(threshold=model.threshold, total_bytes=model.total_bytes, step_cap=model.step_cap,
                       defaults=dict(model.defaults),
                       prior_mean=new_mean, prior_sd=np.minimum(spread, PRIOR_SD))


def warm_started(model: MemoryModel, store: Store, old_study: str, scenario: Scenario) -> MemoryModel:
    """`model` (a new study's, still without measurements) with the prior of an older study's fitted
    model rescaled to this scenario's model (a model swap or a warm start). Unchanged when the old
    study or either model's shape is unknown (a hub name that is not a local config.json)."""
    from autotuner.catalog.models import load_model
    from autotuner.errors import ModelSpecError

    record = store.study(old_study)
    if record is None or model.observations:
        return model
    try:
        old_scenario = Scenario.model_validate(record.scenario)
        shape_from, shape_to = load_model(old_scenario.engine.model), load_model(scenario.engine.model)
    except (ModelSpecError, ValueError):
        return model
    old = MemoryModel.for_scenario(old_scenario, model.defaults, store.trials(old_study))
    if not old.observations:
        return model
    carried = rescale(old, shape_from, shape_to, scenario.tensor_parallel_size(), old.total_bytes)
    return MemoryModel(threshold=model.threshold, total_bytes=model.total_bytes, step_cap=model.step_cap,
                       defaults=model.defaults, prior_mean=carried.prior_mean, prior_sd=carried.prior_sd,
                       shape=model.shape, card_bytes=model.card_bytes)


def step_cap(scenario: Scenario) -> float:
    """Most prompt tokens one step can hold: the streams in flight times the longest prompt (inf when
    the workload does not say, e.g. a trace)."""
    from autotuner.tuner.trial import peak_concurrency

    r = scenario.workload.requests
    if r.kind != "synthetic" or r.prompt_tokens is None:
        return math.inf
    d = r.prompt_tokens
    longest = d.max or d.value or d.high
    if longest is None and d.mean is not None and d.stddev is not None:
        longest = d.mean + 4 * d.stddev
    if longest is None and d.median is not None and d.sigma is not None:
        longest = d.median * math.exp(3 * d.sigma)
    if longest is None:
        return math.inf
    return float(peak_concurrency(scenario) * longest)


def _card_bytes(scenario: Scenario) -> int | None:
    """A simulated GPU's total; a real card's is known once a trial measured it."""
    if not backend_for(scenario).simulated:
        return None
    from autotuner.catalog.gpus import load_gpu

    try:
        return load_gpu(scenario.engine.sim.gpu).memory_bytes
    except Exception:  # an unknown GPU file is the simulator's error to report, not the model's
        return None


def _activation_per_token(spec: Any, tp: int) -> float:
    return float(spec.dtype_bytes * (2 * spec.hidden_size + 3 * spec.intermediate_size // max(1, tp)))


def _num(flags: Mapping[str, FlagValue], key: str, defaults: Mapping[str, FlagValue], fallback: float) -> float:
    value = flags.get(key, defaults.get(key, fallback))
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return fallback


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _z(p: float) -> float:
    """Inverse of the standard normal CDF by bisection (no scipy needed)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _phi(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


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
