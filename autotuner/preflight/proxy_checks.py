"""Proxy variables: what they are used for, and what they are not."""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotuner.preflight.checklist import Check
from autotuner.workload.proxies import mask_url

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def proxy_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The proxy variables set (either case), passwords masked."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for name in PROXY_VARS:
        for key in (name, name.lower()):
            if env.get(key):
                out[key] = mask_url(env[key])
    return out


def check_proxies() -> Check:
    seen = proxy_settings()
    if not seen:
        return Check("proxies", "ok", "no proxy variables set")
    listed = ", ".join(f"{k}={v}" for k, v in seen.items())
    return Check("proxies", "ok", f"{listed}: never used for the engines autotuner starts on 127.0.0.1; the "
                 "engine process keeps them (model downloads); `verify` uses them for --base-url unless "
                 "NO_PROXY covers its host")
