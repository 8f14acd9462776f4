"""Webhook notifications: a JSON POST for each event an operator wants to hear about (a cycle's end, a
rollback, an emergency mitigation, production down and back up, a config proposed for approval).

The body is `{"text", "event", "deployment", "detail"}`; `text` is what Slack's (and Mattermost's, and
Teams' workflow) incoming webhooks show, so one URL works for a chat channel or a receiver of one's own.

A webhook URL is a secret (whoever has it can post to the channel): the config names the environment
variable that holds it, the URL is read from the environment, registered with `autotuner.secrets` so that
every writer masks it, and never put in a log line or an error of ours.

`Notifier.notify` never raises and never blocks the daemon: it schedules the POST on the running loop and
returns. The posts of one notifier go out one after another, in the order of the events (a
production-down is never overtaken by its production-up)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
from typing import Any

import httpx
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from autotuner.errors import InfrastructureError
from autotuner.logs import redact_secrets
from autotuner.secrets import redact, remember

log = structlog.get_logger("autotuner.daemon")

CYCLE_END, ROLLBACK, MITIGATION = "cycle-end", "rollback", "mitigation"
PRODUCTION_DOWN, PRODUCTION_UP, PROPOSED = "production-down", "production-up", "proposed"
EVENTS = (CYCLE_END, ROLLBACK, MITIGATION, PRODUCTION_DOWN, PRODUCTION_UP, PROPOSED)

ATTEMPTS = 3  # one post and two retries, 0.5 s then 1 s apart
MAX_PENDING = 100  # a dead receiver must not make the daemon hold events without bound
MAX_TEXT = 3000  # a chat line, not a report


class NotifySettings(BaseModel):
    """`notify:` in the daemon config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhook_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                             description="the NAME of the environment variable that holds the webhook URL")
    events: list[str] = Field(default_factory=lambda: list(EVENTS))
    timeout_s: float = Field(default=5.0, gt=0, le=120, allow_inf_nan=False)

    @field_validator("events")
    @classmethod
    def _known(cls, events: list[str]) -> list[str]:
        unknown = [e for e in events if e not in EVENTS]
        if unknown:
            raise ValueError(f"unknown event {unknown[0]!r}: choose from {', '.join(EVENTS)}")
        return list(dict.fromkeys(events))


class _ServerError(InfrastructureError):
    """A 5xx from the receiver: worth another try (internal to the retry loop, never raised out)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _RedactRecords(logging.Filter):
    """httpx logs each request's URL (INFO, or DEBUG through httpcore): mask it there too, should anyone
    turn the standard library's logging up."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


_FILTER = _RedactRecords()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Notifier:
    """Posts the daemon's events to the webhook named by `settings` (nothing at all when it is None)."""

    def __init__(self, settings: NotifySettings | None, deployment: str) -> None:
        self.settings = settings
        self.deployment = deployment
        self._pending: set[asyncio.Task[None]] = set()
        self._last: asyncio.Task[None] | None = None
        self._said: set[str] = set()  # what was logged once already
        for name in ("httpx", "httpcore"):
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # --- the caller's side: returns at once, whatever happens ---------------------------------------
    def notify(self, event: str, text: str, detail: dict[str, Any] | None = None) -> None:
        try:
            if self.settings is None or event not in self.settings.events:
                return
            url = self._url()
            if url is None:
                return
            body = self._body(event, text, detail or {})
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a worker thread of the daemon's: hand it to the daemon's loop
                if self._loop is None or self._loop.is_closed():
                    self._once("no_loop", "daemon.notify_dropped", reason="no event loop to send from",
                               notification=event)
                    return
                self._loop.call_soon_threadsafe(self._schedule, url, body)
                return
            self._loop = loop
            self._schedule(url, body)
        except Exception as exc:  # a notification is never worth the daemon's life
            log.warning("daemon.notify_failed", notification=event, error=type(exc).__name__)

    def _url(self) -> str | None:
        assert self.settings is not None
        url = os.environ.get(self.settings.webhook_env, "").strip()
        if not url:
            self._once("unset", "daemon.notify_unset", variable=self.settings.webhook_env,
                       hint=f"export {self.settings.webhook_env}=<webhook URL> to receive notifications")
            return None
        remember(url)
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            self._once("bad_url", "daemon.notify_bad_url", variable=self.settings.webhook_env,
                       hint="the variable must hold an http:// or https:// URL")
            return None
        return url

    def _body(self, event: str, text: str, detail: dict[str, Any]) -> bytes:
        # Masked before it leaves: a chat channel is not a place for a secret either. Anything that is not
        # JSON already becomes its string.
        detail = json.loads(json.dumps(detail, default=str))
        # What the event's evidence says, in the same words as the certificate and /status.
        text = "\n".join([text, *(str(detail[k]) for k in ("comparison", "verify") if detail.get(k))])
        body = redact_secrets(None, "notify", {"text": f"[{self.deployment}] {text}"[:MAX_TEXT], "event": event,
                                               "deployment": self.deployment, "detail": detail})
        return json.dumps(body, ensure_ascii=False).encode()

    def _schedule(self, url: str, body: bytes) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._once("full", "daemon.notify_dropped", reason=f"{MAX_PENDING} notifications already waiting")
            return
        loop = asyncio.get_running_loop()
        last = self._last
        previous = last if last is not None and not last.done() and last.get_loop() is loop else None
        task = loop.create_task(self._send(previous, url, body))
        self._last = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _once(self, key: str, event: str, **fields: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(event, deployment=self.deployment, **fields)

    # --- the background side ------------------------------------------------------------------------
    async def _send(self, previous: asyncio.Task[None] | None, url: str, body: bytes) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # in order; a failed one does not stop the next
        assert self.settings is not None
        event = json.loads(body)["event"]
        try:
            status = await self._post(url, body)
        except asyncio.CancelledError:
            raise
        except _ServerError as exc:
            log.warning("daemon.notify_failed", notification=event, status=exc.status, attempts=ATTEMPTS)
        except httpx.HTTPError as exc:  # the type says what went wrong; its text could hold the URL
            log.warning("daemon.notify_failed", notification=event, error=type(exc).__name__, attempts=ATTEMPTS)
        except Exception as exc:
            log.warning("daemon.notify_failed", notification=event, error=type(exc).__name__)
        else:
            if status >= 400:
                log.warning("daemon.notify_refused", notification=event, status=status,
                            hint=f"the receiver refused the post: check the URL in ${self.settings.webhook_env}")
            else:
                log.debug("daemon.notified", notification=event, status=status)

    async def _post(self, url: str, body: bytes) -> int:
        assert self.settings is not None
        # The environment's proxy settings are for the outside world, not for a receiver on this box.
        trust_env = not _is_loopback(httpx.URL(url).host)
        async with httpx.AsyncClient(timeout=self.settings.timeout_s, trust_env=trust_env,
                                     follow_redirects=False) as client:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(ATTEMPTS),
                                               wait=wait_exponential(multiplier=0.5, max=4),
                                               retry=retry_if_exception_type((httpx.TransportError, _ServerError)),
                                               reraise=True):
                with attempt:
                    r = await client.post(url, content=body, headers={"content-type": "application/json"})
                    if r.status_code >= 500:
                        raise _ServerError(r.status_code)
                    return r.status_code
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """At shutdown: let the posts in flight finish for up to `timeout_s`, then give up on the rest."""
        if not self._pending:
            return
        pending = set(self._pending)
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if late:
            log.warning("daemon.notify_dropped", reason="shutdown", dropped=len(late))
