"""The active probe: a one-token completion sent to a target's OpenAI API, one at a time.

Metrics cannot show every hang. vLLM writes its gauges only when the engine completes a
step, so an engine that hangs while idle keeps saying "0 running, 0 waiting" for ever,
and the next request simply never gets an answer (``docs/physics.md``, "stalled"). The
probe asks for one token, on an interval, with a deadline; what the core receives is
``ProbeStatus`` (attached to each snapshot by the watcher): since when a probe has gone
unanswered, if one has. The core decides what that means, together with the metrics:
an unanswered probe while the engine makes progress is a busy server, not a stall.

Failures are counted by reason (``timeout``, ``connect``, ``http_status``, ``http_error``,
``bad_response``) and logged once, then once a minute while they last. The probe's own
request shows in vLLM's metrics like any other (one prompt, one generated token).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog

from vllm_triage.config.schema import ProbeSettings
from vllm_triage.core.model import ProbeStatus
from vllm_triage.errors import ScrapeError
from vllm_triage.logs import Throttle
from vllm_triage.net.bounded import request
from vllm_triage.state import ProbeStats

log = structlog.get_logger("vllm_triage.probe")

#: What the probe asks: any prompt will do, the engine only has to produce one token.
PROMPT = "ping"
#: A one-token completion is a few hundred bytes; an answer past this is read no further
#: (a peer that sends a gzip bomb or an endless body is answered, badly, not waited on).
ANSWER_MAX_BYTES = 64 * 1024


def one_token(body: bytes) -> bool:
    """Whether ``body`` is a completion with at least one choice. Whatever a peer sends
    (not JSON, JSON nested a million deep, a number) is a bad answer, never an error."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    choices = data.get("choices") if isinstance(data, dict) else None
    return isinstance(choices, list) and bool(choices)


def completions_url(metrics_url: str, probe_url: str | None = None) -> str:
    """Where the probe goes: ``probe.url``, else the target's address at /v1/completions."""
    if probe_url is not None:
        return probe_url
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, "/v1/completions", "", ""))


class Prober:
    """One target's probe. ``run`` is one probe (the scheduler calls it on an interval,
    never two at once); ``status`` is what the core is told at each scrape."""

    def __init__(
        self,
        target: str,
        settings: ProbeSettings,
        *,
        url: str,
        headers: Mapping[str, str],
        client: httpx.AsyncClient,
        model: Callable[[], str | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``url``: the completions endpoint (``completions_url``); ``headers``: the
        target's credentials; ``model``: the model to ask for when the settings name none
        (the first one the target's metrics expose)."""
        self.settings = settings
        self.target = target
        self.stats = ProbeStats(url=url)
        self._client = client
        self._model = model
        self._clock = clock
        self._headers = dict(headers)
        self._failures = Throttle()
        self._task: asyncio.Task[Any] | None = None

    def status(self) -> ProbeStatus:
        st = self.stats
        return ProbeStatus(
            unanswered_since=st.unanswered_since,
            last_seconds=st.last_seconds,
            last_reason=st.last_reason,
        )

    def cancel(self) -> None:
        """Abandon a probe in flight (at shutdown: nobody waits for its answer)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def run(self) -> None:
        """Send one probe and record what came of it; never raises for what the target did."""
        model = self.settings.model or self._model()
        if model is None:
            log.debug("probe_waiting_for_model", target=self.target)
            return
        st = self.stats
        st.probes += 1
        started_at = self._clock()
        if st.unanswered_since is None:
            st.unanswered_since = started_at
        st.in_flight = True
        self._task = asyncio.current_task()
        began = time.monotonic()
        reason: str | None
        try:
            reason = await self._ask(model, st.probes)
        except asyncio.CancelledError:
            log.debug("probe_cancelled", target=self.target)
            return
        finally:
            st.in_flight = False
            self._task = None
        st.last_seconds = time.monotonic() - began
        st.last_at = started_at
        st.last_reason = reason
        if reason != "timeout":
            # Answered, well or badly: the engine (or the server in front of it) is alive.
            st.unanswered_since = None
        if reason is None:
            self._recovered()
        else:
            st.failures[reason] += 1
            self._failed(reason)

    async def _ask(self, model: str, n: int) -> str | None:
        """One request; the failure reason, or None when one token came back in time."""
        s = self.settings
        body = {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 1,
            "temperature": 0,
            "user": s.user,
        }
        headers = {**self._headers, "X-Request-Id": f"{s.user}-{n}"}
        try:
            answer = await request(
                self._client,
                "POST",
                self.stats.url,
                json=body,
                headers=headers,
                timeout=s.timeout_seconds,
                max_bytes=ANSWER_MAX_BYTES,
            )
        except ScrapeError as exc:
            if exc.reason in ("timeout", "connect"):
                return exc.reason
            # Too big, a compression refused, a broken stream: something answered, badly.
            return "bad_response" if exc.reason in ("too_large", "encoding") else "http_error"
        if not answer.ok:
            return "http_status"
        return None if one_token(answer.body) else "bad_response"

    def _failed(self, reason: str) -> None:
        self._failures.warn(
            log,
            "probe_failed",
            target=self.target,
            reason=reason,
            seconds=round(self.stats.last_seconds or 0.0, 3),
        )

    def _recovered(self) -> None:
        self._failures.recovered(log, "probe_recovered", target=self.target)
