"""The wall's curve (``gpu_check_wall.png``): the transient above the steady footprint per budget,
measured per backend beside the simulator's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.gpu_check.config import BACKENDS, GIB


def plot_wall(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["steps"].get("wall", {}).get("tables", {}).get("wall", [])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend in BACKENDS:
        ok = [r for r in rows if r.get("backend") == backend and "nvml_rise_bytes" in r
              and not {"oom", "error"} & set(r)]
        if ok:
            ax.plot([r["budget"] for r in ok], [r["nvml_rise_bytes"] / GIB for r in ok], "o-",
                    label=f"{backend} (NVML)")
    sim = report["simulator"].get("transient") or {}
    pts = sorted((int(b), v["transient_bytes"] / GIB) for b, v in sim.items() if v.get("outcome") == "ok")
    if pts:
        ax.plot([b for b, _ in pts], [v for _, v in pts], "k--", label="simulator")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_num_batched_tokens")
    ax.set_ylabel("transient above steady (GiB)")
    ax.set_title("Memory wall: transient vs budget" + (" (dry run)" if report["dry_run"] else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
