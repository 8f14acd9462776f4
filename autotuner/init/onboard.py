"""Build a scenario and a daemon config from the user's `vllm serve` command line and/or a running
endpoint, and write them, all or nothing.

What comes from where: the command line gives the model, the fixed flags (theirs) and the current
values of the three tuned knobs; the endpoint gives the served model, its context length and the
prompt/output lengths of the traffic it has served (from its `/metrics` histograms); NVML gives the
GPUs. Secrets in the command line are never copied: the variable vLLM reads them from is named.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotuner.errors import ScenarioError, UserInputError
from autotuner.export.atomic import write_text_atomic
from autotuner.init.files import daemon_yaml, loads_back, scenario_yaml
from autotuner.init.lengths import LengthFit, length_from_histogram
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue, Platform, VllmRuleError, knowledge_for
from autotuner.vllm.cmdline import SECRET_FLAGS, ServeCommand, parse_serve_command, split_command
from autotuner.watch.inventory import gpu_inventory
from autotuner.watch.probe import probe
from autotuner.watch.snapshot import GpuInfo, ProductionSnapshot

SCENARIO_FILE = "scenario.yaml"
DAEMON_FILE = "autotuner-daemon.yaml"
TUNED_CONFIG_FILE = "vllm-tuned.yaml"
# The flags the tuner searches (tuner/space.py default_space); everything else the user set stays fixed.
KNOBS = ("max-num-batched-tokens", "gpu-memory-utilization", "cpu-offload-gb")
# Fewer finished requests than this say too little about a length distribution to replace the default.
MIN_FIT_REQUESTS = 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class InitResult:
    scenario_path: Path
    daemon_path: Path
    inferred: list[str] = field(default_factory=list)  # what init read and decided
    check: list[str] = field(default_factory=list)  # what the user should look at before running


def run_init(from_cmd: str | None, from_endpoint: str | None, *, api_key_env: str | None = None,
             out: Path = Path("."), force: bool = False, timeout_s: float = 5.0) -> InitResult:
    """Raises UserInputError (exit 2) before writing anything when an input is bad."""
    if not from_cmd and not from_endpoint:
        raise UserInputError("init needs --from-cmd 'vllm serve MODEL ...', --from-endpoint URL, or both")
    if api_key_env is not None and not _ENV_NAME.match(api_key_env):
        raise UserInputError(f"--api-key-env takes the NAME of an environment variable (like VLLM_API_KEY), "
                             f"not {'a key' if len(api_key_env) > 8 else repr(api_key_env)}")
    scenario_path, daemon_path = _targets(out, force)
    result = InitResult(scenario_path, daemon_path)
    cmd = parse_serve_command(split_command(from_cmd)) if from_cmd else None
    snap = _probe(from_endpoint, api_key_env, timeout_s) if from_endpoint else None
    gpus = _inventory(result)
    scenario = _scenario(cmd, snap, gpus, api_key_env, result)
    # One study database for the tuner and the daemon (which uses the scenario's when its own is unset).
    scenario = {"name": scenario.pop("name"),
                "storage": f"sqlite:///{(scenario_path.parent.resolve() / STORAGE_FILE)}", **scenario}
    daemon = _daemon(cmd, snap, from_endpoint, api_key_env, scenario_path, daemon_path, result)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    sources = " and ".join(s for s in (from_cmd and "the command line", from_endpoint and from_endpoint) if s)
    # Both texts are checked before either is written: all or nothing.
    scenario_text = scenario_yaml(scenario, f"Written by `autotuner init` on {stamp} from {sources}.", result.check)
    daemon_text = daemon_yaml(daemon, f"Written by `autotuner init` on {stamp}: run it with "
                              f"`autotuner daemon run {daemon_path}`.")
    texts = [(scenario_path, loads_back(scenario_text, scenario, scenario_path)),
             (daemon_path, loads_back(daemon_text, daemon, daemon_path))]
    scenario_path.parent.mkdir(exist_ok=True)  # only now: bad input leaves no trace
    for path, text in texts:
        write_text_atomic(path, text)
    return result


def _targets(out: Path, force: bool) -> tuple[Path, Path]:
    out = out.expanduser()
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise UserInputError(f"--out {out}: directory {out.parent} does not exist")
    if not os.access(out if out.exists() else out.parent, os.W_OK | os.X_OK):
        raise UserInputError(f"--out {out}: not writable by this user; choose another directory")
    targets = (out / SCENARIO_FILE, out / DAEMON_FILE)
    if not force:
        for path in targets:
            if path.exists():
                raise UserInputError(f"{path} exists: init never overwrites; pass --force to replace it, or "
                                     "--out DIR to write elsewhere")
    return targets


def _probe(endpoint: str, api_key_env: str | None, timeout_s: float) -> ProductionSnapshot:
    snap = asyncio.run(probe(endpoint, api_key_env=api_key_env, timeout_s=timeout_s))
    if not snap.reachable:
        raise UserInputError(f"--from-endpoint {endpoint}: {snap.error}; is vLLM running there?")
    if snap.served_model is None:
        raise UserInputError(f"--from-endpoint {endpoint}: /v1/models lists no model; is this a vLLM server?")
    return snap


def _inventory(result: InitResult) -> tuple[GpuInfo, ...]:
    try:
        gpus = gpu_inventory()
    except Exception as exc:  # NVML is informative here: a broken driver must not stop init
        result.check.append(f"NVML failed ({exc}): GPU inventory unknown")
        return ()
    if gpus:
        kinds = sorted({f"{g.name} ({g.memory_total_mib} MiB)" for g in gpus})
        result.inferred.append(f"GPUs (NVML): {len(gpus)} × {', '.join(kinds)}")
    else:
        result.check.append("NVML sees no GPU on this host: run init on the GPU host, or check the driver")
    return gpus


def _scenario(cmd: ServeCommand | None, snap: ProductionSnapshot | None, gpus: tuple[GpuInfo, ...],
              api_key_env: str | None, result: InitResult) -> dict[str, Any]:
    inferred, check = result.inferred, result.check
    flags: dict[str, FlagValue] = dict(cmd.flags) if cmd else {}
    engine: dict[str, Any] = {"kind": "vllm"}
    if cmd is not None:
        inferred.append(f"model {cmd.model} (command line)")
        if cmd.command != ["vllm", "serve"]:
            engine["command"] = cmd.command
        engine["model"] = cmd.model
        if cmd.served_model_names:
            engine["served_model_name"] = cmd.served_model_names[0]
        if snap is not None and snap.root and snap.root != cmd.model:
            check.append(f"the command line's model {cmd.model} is not what {snap.endpoint} serves ({snap.root}): "
                         "the scenario uses the command line's")
    else:
        assert snap is not None
        engine["model"] = snap.root or snap.served_model
        inferred.append(f"model {engine['model']} (/v1/models root)")
        check.append("engine.model is the path or name the endpoint reports: check this host can load it")
    if snap is not None:
        if "served_model_name" not in engine and snap.served_model and snap.served_model != engine["model"]:
            engine["served_model_name"] = snap.served_model
        inferred.append(f"served as {snap.served_model}, vLLM {snap.vllm_version or 'version unknown'}, "
                        f"model fingerprint {snap.model_fingerprint}")
        if snap.simulator is not None and cmd is None:
            # Production is `autotuner sim serve`: tune the same simulated box.
            sim = snap.simulator
            engine["kind"] = "sim"
            engine["sim"] = {k: sim[k] for k in ("gpu", "gpus", "speedup") if sim.get(k) is not None}
            inferred.append(f"the endpoint is the simulator: engine.kind sim on {engine['sim']}")
        if snap.max_model_len is not None:
            given = flags.get("max-model-len")
            if given is None or given == "auto":
                flags["max-model-len"] = snap.max_model_len
                inferred.append(f"max-model-len {snap.max_model_len} (/v1/models)")
            elif given != snap.max_model_len:
                check.append(f"--max-model-len {given} on the command line, {snap.max_model_len} served: "
                             "the scenario keeps the command line's")
    knobs = {k: flags.pop(k) for k in KNOBS if k in flags}
    tp = int(flags.get("tensor-parallel-size", 1))  # type: ignore[arg-type]
    if cmd is None and "tensor-parallel-size" not in flags:
        check.append("the endpoint does not say its tensor-parallel size: set engine.flags.tensor-parallel-size")
    if gpus and tp > len(gpus):
        check.append(f"tensor-parallel-size {tp} but NVML sees {len(gpus)} GPUs on this host")
    platform = Platform(gpus[0].name, gpus[0].memory_total_mib / 1024, len(gpus)) if gpus else None
    if cmd is not None:
        _rules(flags, knobs, platform)
        env = dict(cmd.env)
        visible = env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None and re.fullmatch(r"\d+(,\d+)*", visible):
            engine["gpus"] = [int(i) for i in visible.split(",")]
        elif visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        if env:
            engine["env"] = env
        for secret in cmd.secrets_dropped:
            name = secret.strip("-=")
            var = SECRET_FLAGS.get(name, name)
            check.append(f"{secret}… on the command line is a secret: not copied; export {var} where the tuner "
                         "runs" + (" (vLLM reads it from there)" if name in SECRET_FLAGS else ""))
    key_env = api_key_env or ("VLLM_API_KEY" if cmd is not None and cmd.api_key_given else None)
    if key_env:
        engine["api_key_env"] = key_env
    if flags:
        engine["flags"] = flags
    data: dict[str, Any] = {"name": _name(engine.get("served_model_name") or engine["model"]), "engine": engine}
    data["workload"] = _workload(snap, flags.get("max-model-len"), result)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"the scenario built from your input does not validate: {exc.errors()[0]['msg']} "
                            f"at {'.'.join(map(str, exc.errors()[0]['loc']))}") from None
    from autotuner.tuner.space import default_space

    data["search_space"] = {name: _param(p.model_dump(exclude_none=True, exclude_defaults=True) | {"type": p.type})
                            for name, p in default_space(scenario).items()}
    inferred.append(f"searched: {', '.join(data['search_space'])}; fixed: "
                    f"{', '.join(f'{k}={v}' for k, v in flags.items()) or 'nothing'}")
    current = _current(knobs, platform, cmd is not None)
    if cmd is not None and "max-num-batched-tokens" not in current:
        check.append("--max-num-batched-tokens is not on the command line and vLLM's default depends on the GPU, "
                     "which NVML did not show: add it to current_config")
    if current:
        data["current_config"] = current
        inferred.append("current config (the baseline trial): "
                        + ", ".join(f"{k}={v}" for k, v in current.items()))
    Scenario.model_validate(data)  # the file we write must load
    return data


def _param(param: dict[str, Any]) -> dict[str, Any]:
    """Bounds of an int parameter written as ints (pydantic holds them as floats)."""
    if param["type"] == "int":
        return {k: int(v) if k in ("low", "high", "step") and isinstance(v, float) else v for k, v in param.items()}
    return param


def _rules(flags: dict[str, FlagValue], knobs: dict[str, FlagValue], platform: Platform | None) -> None:
    try:
        knowledge_for(None).resolve({**flags, **knobs}, platform)
    except VllmRuleError as exc:
        raise UserInputError(f"--from-cmd: vLLM would refuse this command line: {exc.reason}") from None


def _current(knobs: dict[str, FlagValue], platform: Platform | None, from_cmd: bool) -> dict[str, FlagValue]:
    """The user's values of the tuned knobs; vLLM's defaults for the ones they left unset (known for the
    token budget only when the GPU is)."""
    if not from_cmd:
        return {}
    defaults = knowledge_for(None).default_flags(platform) if platform is not None else {
        "gpu-memory-utilization": 0.92, "cpu-offload-gb": 0.0}
    return {k: knobs.get(k, defaults.get(k)) for k in KNOBS if k in knobs or k in defaults}  # type: ignore[misc]


def _workload(snap: ProductionSnapshot | None, max_len: FlagValue | None, result: InitResult) -> dict[str, Any]:
    requests: dict[str, Any] = {"count": 48}
    context = max_len if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0 else None
    if snap is None:
        result.check.append("workload lengths are the defaults (prompts 3000-6000, outputs 256): set them to "
                            "your traffic, or run init --from-endpoint against production")
        top = context - 256 if context is not None else None
        if top is not None and 0 < top < 6000:  # the defaults would not fit the context: every request HTTP 400
            requests["prompt_tokens"] = {"kind": "uniform", "low": max(1, min(3000, top // 2)), "high": top}
            result.check[-1] = (f"workload lengths are the defaults, within the context of {context}: prompts "
                                f"{requests['prompt_tokens']['low']}-{top}, outputs 256; set them to your traffic, "
                                "or run init --from-endpoint against production")
        return {"requests": requests}
    output = _fit("output", snap.generation_tokens, context, result)
    out_top = _top(output) if output else 256
    # Prompt plus answer must fit the context, or vLLM refuses the request (HTTP 400).
    prompt = _fit("prompt", snap.prompt_tokens, context - min(out_top, context // 2) if context else None, result)
    if prompt is not None:
        requests["prompt_tokens"] = prompt.settings.model_dump(exclude_none=True, exclude_defaults=True) | {
            "kind": prompt.settings.kind}
    if output is not None:
        requests["output_tokens"] = output.settings.model_dump(exclude_none=True, exclude_defaults=True) | {
            "kind": output.settings.kind}
    return {"requests": requests}


def _top(fit: LengthFit) -> int:
    s = fit.settings
    return int(s.max or s.value or 256)


def _fit(what: str, hist: Any, max_len: int | None, result: InitResult) -> LengthFit | None:
    metric = f"vllm:request_{'prompt' if what == 'prompt' else 'generation'}_tokens"
    if hist is None:
        result.check.append(f"{metric} is not in /metrics: {what} lengths are the defaults")
        return None
    if hist.count < MIN_FIT_REQUESTS:
        result.check.append(f"{metric} has {int(hist.count)} requests (< {MIN_FIT_REQUESTS}): {what} lengths "
                            "are the defaults; run init again after some traffic")
        return None
    fit = length_from_histogram(hist, max_len)
    if fit is None:
        return None
    shown = ", ".join(f"p{round(q * 100)} {v:.0f}" for q, v in fit.quantiles.items())
    result.inferred.append(f"{what} lengths from {metric}: {fit.requests} requests, mean {fit.mean:.0f}, {shown} "
                           f"(bucket-interpolated) → {fit.note}")
    return fit


# What init writes for the cycle's bounds: a night window, and the downtime a cycle may take inside it.
WINDOW = "01:00-06:00"
MAX_DOWNTIME = "30m"
STORAGE_FILE = "autotuner.db"


def _daemon(cmd: ServeCommand | None, snap: ProductionSnapshot | None, endpoint: str | None,
            api_key_env: str | None, scenario_path: Path, daemon_path: Path, result: InitResult) -> dict[str, Any]:
    if endpoint is None:
        host = cmd.host if cmd and cmd.host not in (None, "", "0.0.0.0", "::") else "127.0.0.1"
        endpoint = f"http://{host}:{cmd.port if cmd and cmd.port else 8000}"
        result.check.append(f"production.endpoint {endpoint} is read from the command line: check it")
    production: dict[str, Any] = {"endpoint": endpoint.rstrip("/")}
    key_env = api_key_env or ("VLLM_API_KEY" if cmd is not None and cmd.api_key_given else None)
    if key_env:
        production["api_key_env"] = key_env
    # Never the user's own --config file: replacing it with the tuned flags alone could drop their settings.
    config_path = (daemon_path.parent / TUNED_CONFIG_FILE).resolve()
    data: dict[str, Any] = {
        "scenario": scenario_path.name if scenario_path.parent == daemon_path.parent else str(scenario_path),
        "production": production,
    }
    if cmd is not None:
        data["deploy"] = {"kind": "command", "config_path": str(config_path), "start": start_argv(cmd, config_path)}
        if cmd.config_file:
            result.check.append(f"your command reads --config {cmd.config_file}: deploy.start carries its settings "
                                f"on the command line instead and reads the tuned flags from --config {config_path} "
                                "(vLLM takes one config file)")
        if cmd.env:
            result.check.append(f"your command line sets {', '.join(sorted(cmd.env))}: set them in the daemon's "
                                "environment too (deploy.start inherits it; the systemd unit's EnvironmentFile)")
        result.check.append(f"deploy.kind is command: the daemon stops production, tunes on its GPUs and starts "
                            f"it again with deploy.start (your command line, with --config {config_path} in place "
                            f"of {', '.join('--' + k for k in KNOBS)})")
    else:
        data["deploy"] = {"kind": "file", "config_path": str(config_path)}
        data["approve"] = "manual"
        result.check.append(f"deploy.kind is file and approve is manual: the daemon writes the tuned flags to "
                            f"{config_path} only after `autotuner daemon approve`; start vLLM with --config "
                            f"{config_path} and drop {', '.join('--' + k for k in KNOBS)} from its command line "
                            "(the command line wins over the file). Without deploy.stop/start it cannot take "
                            "production down to tune on its GPUs: fill them in, or use deploy.kind command, "
                            "systemd or compose")
    data.update({
        "window": WINDOW,
        "max_downtime": MAX_DOWNTIME,
        "triggers": {"poll_interval_s": 60, "model_swap": True, "engine_upgrade": True, "gpu_change": True,
                     "workload_drift": {"p95_ratio": 1.25, "window_s": 3600, "min_requests": 200},
                     "production_oom": True, "schedule": None},
        "min_interval_s": 3600,
        "tune": {"trials": 20, "timeout": "2h", "confirm": "3x3", "soak": "10m"},
        "listen": {"host": "127.0.0.1", "port": 8765, "token_env": "AUTOTUNER_DAEMON_TOKEN"},
    })
    return data


def start_argv(cmd: ServeCommand, config_path: Path) -> list[str]:
    """The user's serve command with the tuned flags moved into `--config config_path`: what the
    command target starts (and, being production's own command line, what it recognises running)."""
    from autotuner.vllm import flag_argv

    argv = [*cmd.command, cmd.model, *flag_argv({k: v for k, v in cmd.flags.items() if k not in KNOBS})]
    if cmd.served_model_names:
        argv += ["--served-model-name", *cmd.served_model_names]
    if cmd.host is not None:
        argv += ["--host", cmd.host]
    if cmd.port is not None:
        argv += ["--port", str(cmd.port)]
    return [*argv, "--config", str(config_path)]


def _name(model: str) -> str:
    base = Path(model.rstrip("/")).name or model
    return re.sub(r"[^\w.-]+", "-", base).strip("-") or "scenario"
