"""Which proxy, if any, a request would go through — resolved the way httpx resolves it from
HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY — so that a failure through a proxy is named as such."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit


def proxy_for(url: str) -> str | None:
    """The proxy an httpx client with `trust_env=True` uses for `url`, or None (direct)."""
    # httpx builds its mounts with these two helpers; use them rather than re-implementing NO_PROXY.
    import httpx
    from httpx._utils import URLPattern, get_environment_proxies

    target = httpx.URL(url)
    for pattern, proxy in sorted(((URLPattern(k), v) for k, v in get_environment_proxies().items()),
                                 key=lambda item: item[0]):
        if pattern.matches(target):
            return proxy
    return None


def proxy_variable(url: str) -> str:
    """The variable that set the proxy for this URL's scheme (either case)."""
    scheme = urlsplit(url).scheme.upper()
    for name in (f"{scheme}_PROXY", "ALL_PROXY"):
        for key in (name, name.lower()):
            if os.environ.get(key):
                return key
    return "ALL_PROXY"


def mask_url(url: str) -> str:
    """A proxy URL with its password hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def through_proxy(url: str, what: str) -> str | None:
    """`HTTP_PROXY is set and NO_PROXY does not cover 10.0.0.5: the request went through the proxy
    http://proxy:3128, which answered 502` — None when the request went direct."""
    proxy = proxy_for(url)
    if proxy is None:
        return None
    host = urlsplit(url).hostname or url
    return (f"{proxy_variable(url)} is set and NO_PROXY does not cover {host}: the request went through the "
            f"proxy {mask_url(proxy)}, which {what}. Add {host} to NO_PROXY, or fix the proxy")
