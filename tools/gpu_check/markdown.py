"""The summary as Markdown (``gpu_check.md``, also printed last): one table of the steps, one per
step with the measured figure beside the simulator's, the per-budget rows and the fits.
"""

from __future__ import annotations

from typing import Any

from tools.gpu_check.config import GIB, MIB


def _gib(n: float | None) -> str:
    return "—" if n is None else f"{n / GIB:.2f} GiB"


def _mib(n: float | None) -> str:
    return "—" if n is None else f"{n / MIB:.0f} MiB"


def _ms(n: float | None) -> str:
    return "—" if n is None else f"{n:.1f} ms"


def render_markdown(report: dict[str, Any]) -> str:
    steps = report["steps"]
    sim = report["simulator"]
    facts = {name: s["facts"] for name, s in steps.items()}
    lines = [f"# GPU check, {report['started_utc']}", ""]
    if report["dry_run"]:
        lines += ["**Dry run**: simulated NVML and CpuStandIn in place of torch. The figures below are "
                  "formulas carried through the plumbing, not measurements.", ""]
    lines += ["| step | status | seconds | box | note |", "| --- | --- | --- | --- | --- |"]
    for name, s in steps.items():
        lines.append(f"| {name} | {s['status']} | {s['seconds']:.1f} | {s['box_s']:.0f} | {s['note']} |")
    lines.append("")

    if "nvml" in facts:
        f = facts["nvml"]
        dev = f.get("device") or {}
        gpu = sim.get("gpu") or {}
        lat = f.get("query_latency_us") or {}
        hold = f.get("hold_1gib") or {}
        lines += ["## 1. NVML through our monitor", "", "| figure | measured | simulator |", "| --- | --- | --- |",
                  f"| device | {dev.get('name', '—')} | {gpu.get('product_name', '—')} |",
                  f"| total memory | {_gib(dev.get('total_bytes'))} | "
                  f"{gpu.get('memory_gib', 0):.2f} GiB (set to the measured total) |",
                  f"| UUID | {dev.get('uuid', '—')} | — |",
                  f"| driver | {f.get('driver', '—')} | — |",
                  f"| used while idle | {_mib(f.get('idle_used_bytes'))} | — |",
                  f"| processes while idle | {f.get('idle_processes', '—')} | — |",
                  f"| one memory query (median / p99 / max) | {lat.get('median', 0):.1f} / {lat.get('p99', 0):.1f} / "
                  f"{lat.get('max', 0):.1f} µs | — |",
                  f"| holding 1 GiB: NVML used rises by | {_mib(hold.get('used_rise_bytes'))} | 1024 MiB |",
                  f"| holding 1 GiB: our PID in NVML's process list | {hold.get('own_pid_listed', '—')} "
                  f"({hold.get('processes', '—')}) | True |"]
        for row in (steps["nvml"]["tables"].get("sampler") or []):
            lines.append(f"| Sampler at {row['hz']:.0f} Hz: achieved, CPU | {row['achieved_hz']:.1f} Hz, "
                         f"{100 * row['cpu_fraction_of_core']:.1f} % of a core, {row['errors']} errors | — |")
        lines.append("")

    if "wall" in facts:
        lines += _wall_markdown(steps["wall"], sim, report["fits"])

    if "oom" in facts:
        f = facts["oom"]
        trip = f.get("trip") or {}
        real = f.get("real_oom") or {}
        const = sim.get("constants") or {}
        sim_oom = sim.get("oom") or {}
        idle = f.get("idle_wait") or {}
        lines += ["## 3. The OOM path", "", "| figure | measured | simulator |", "| --- | --- | --- |",
                  f"| GPU idle before the baseline | {idle.get('idle', '—')}, "
                  f"{_mib(idle.get('used_bytes'))} used | — |",
                  f"| threshold tripped (at {trip.get('threshold_fraction', '—')} of total) | "
                  f"{trip.get('tripped', '—')}, used {_gib(trip.get('used_at_trip_bytes'))} | — |",
                  f"| child's allocation → threshold callback | {_ms(trip.get('allocation_to_detection_ms'))} | — |",
                  f"| sample → SIGKILL sent | {_ms(trip.get('sample_to_kill_ms'))} | — |",
                  f"| SIGKILL → child exited | {_ms(trip.get('kill_to_exit_ms'))} | — |",
                  f"| SIGKILL → NVML back at baseline | {_ms(trip.get('kill_to_nvml_release_ms'))} | "
                  f"{1000 * const.get('release_delay_s', float('nan')):.0f} ms (release delay) |",
                  f"| process group gone | {trip.get('group_gone', '—')} | True |",
                  f"| NVML peak at the real OOM, share of total | "
                  f"{100 * real.get('nvml_peak_fraction', float('nan')):.2f} % | "
                  f"threshold default {100 * const.get('threshold_default_fraction', float('nan')):.0f} % |",
                  f"| classifier on the real OOM log (after ready / before) | {real.get('classified_after_ready', '—')}"
                  f" / {real.get('classified_before_ready', '—')} | {sim_oom.get('classified_after_ready', '—')} |",
                  "", "Real OOM line:", "", f"    {real.get('error_line', '—')}", "",
                  "Simulator's OOM line:", "", f"    {sim_oom.get('message', '—')}", ""]
    if sim.get("errors"):
        lines += ["Simulator predictions that failed:", ""] + [f"- {e}" for e in sim["errors"]] + [""]
    return "\n".join(lines)


def _wall_markdown(step: dict[str, Any], sim: dict[str, Any], fits: dict[str, Any]) -> list[str]:
    f = step["facts"]
    start = f.get("startup") or {}
    steady = f.get("steady") or {}
    model = f.get("model") or {}
    plan = sim.get("startup") or {}
    idle = f.get("idle_wait") or {}
    lines = ["## 2. The memory wall", "", f"Versions: {f.get('versions', '—')}. GPU idle before the baseline: "
             f"{idle.get('idle', '—')} (waited {idle.get('seconds', 0):.1f} s, "
             f"{_mib(idle.get('used_bytes'))} used).", "",
             f"Model: {model.get('preset', '—')} shape, {model.get('layers', '—')} layers, random bf16 weights "
             f"(built in {model.get('build_s', 0):.1f} s); prompts of {model.get('prompts', '—')} tokens, all arriving "
             "at once, prefilled in chunks of at most the budget per engine step.", "",
             "flash and math against float64 attention, worst relative error: "
             f"{f.get('attention_rel_error_flash_math_vs_fp64', '—')}",
             "", "| startup figure | measured | simulator |", "| --- | --- | --- |",
             f"| weights | {_gib(model.get('weights_bytes'))} | {_gib(plan.get('weights_bytes'))} |",
             f"| profiled activations ({start.get('profile_tokens', '—')} tokens) | "
             f"{_gib(start.get('profile_peak_bytes'))} | {_gib(plan.get('profile_peak_bytes'))} |",
             f"| CUDA context | {_gib(f.get('context_bytes'))} | {_gib(plan.get('context_bytes'))} |",
             f"| non-torch memory | {_gib(start.get('non_torch_bytes'))} | {_gib(plan.get('non_torch_bytes'))} |",
             f"| KV cache | {_gib(start.get('kv_bytes_planned'))}, {steady.get('kv_tokens', '—')} tokens | "
             f"{_gib(plan.get('kv_bytes'))}, {plan.get('kv_tokens', '—')} tokens |",
             f"| steady NVML footprint | {_gib(steady.get('nvml_used_bytes'))} | {_gib(plan.get('steady_bytes'))} |",
             *(f"| left after a {w['backend']} warm-up (modules loaded, cache emptied) | "
               f"{_mib(w.get('nvml_rise_after_bytes'))} {w.get('error', '')} | — |"
               for w in step["tables"].get("warmup", [])),
             "", "Transient above the steady footprint, per token budget (MiB):", "",
             "| budget | backend | steps | max_allocated rise | reserved rise | NVML rise | seconds | simulator |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    sim_rows = sim.get("transient") or {}
    for row in step["tables"].get("wall", []):
        pred = sim_rows.get(str(row["budget"])) or {}
        predicted = _mib(pred.get("transient_bytes")) if pred.get("outcome") == "ok" else pred.get("outcome", "—")
        if "skipped" in row:
            lines.append(f"| {row['budget']} | {row['backend']} | — | skipped: {row['skipped']} | | | | {predicted} |")
            continue
        oom = f" OOM: {row['oom']}" if "oom" in row else (f" error: {row['error']}" if "error" in row else "")
        lines.append(f"| {row['budget']} | {row['backend']} | {row.get('engine_steps', '—')} | "
                     f"{_mib(row.get('allocated_rise_bytes'))}{oom} | {_mib(row.get('reserved_rise_bytes'))} | "
                     f"{_mib(row.get('nvml_rise_bytes'))} | {row.get('seconds', 0):.2f} | {predicted} |")
    lines += ["", "Fits of transient bytes over budget tokens (y = c0 + c1·B + c2·B²; linear: y = a + s·B):", "",
              "| curve | slope s (KiB/token) | linear R² | c2 (bytes/token²) | quadratic share at max | verdict |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name, fit in fits.items():
        lines.append(f"| {name} | {fit['slope_bytes_per_token'] / 1024:.1f} | {fit['linear_r2']:.4f} | "
                     f"{fit['quadratic']['c2_bytes_per_token2']:.4g} | {100 * fit['quadratic_share_at_max']:.1f} % | "
                     f"{fit['verdict']} |")
    lines.append("")
    return lines
