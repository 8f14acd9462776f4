"""Least-squares fits of the transient over the token budget: a line and a parabola, and whether the
curve is linear.
"""

from __future__ import annotations

from typing import Any


def fit_curve(budgets: list[int], values: list[float]) -> dict[str, Any] | None:
    """Least-squares line and parabola of transient bytes over budget tokens; None with < 3 points."""
    if len(budgets) < 3:
        return None
    import numpy as np

    x = np.asarray(budgets, dtype=float)
    y = np.asarray(values, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    curv, b1, b0 = np.polyfit(x, y, 2)
    residual = y - (slope * x + intercept)
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / spread if spread > 0 else 1.0
    top = float(x.max())
    quad_at_top = float(curv * top * top)
    y_top = float(curv * top * top + b1 * top + b0)
    share = abs(quad_at_top) / abs(y_top) if y_top else 0.0
    return {
        "slope_bytes_per_token": float(slope), "intercept_bytes": float(intercept), "linear_r2": r2,
        "quadratic": {"c2_bytes_per_token2": float(curv), "c1_bytes_per_token": float(b1), "c0_bytes": float(b0)},
        "quadratic_share_at_max": share, "verdict": "linear" if share < 0.10 and r2 > 0.98 else "not linear",
    }
