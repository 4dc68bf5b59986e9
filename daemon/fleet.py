"""Fleet mode: every vLLM server a Prometheus-compatible query API knows, diagnosed by the
same core as a scraped one, from range queries instead of scrapes.

Each tick asks ``/api/v1/query_range`` for the series the parser reads (by exact name,
every naming era), from just after the last step it evaluated to now, one step per
``interval_seconds`` (the first tick reaches back one window, so a diagnosis is ready at
once). The samples are grouped by ``identity_labels`` (default ``job`` and
``instance``): each group is one server, discovered the first time it appears and kept
as a target with its own window and incidents. Each step of each server is turned back
into exposition text and goes through the same parser, window, diagnosis and incident
tracker as a scrape would: same exports, same webhooks.

The query API itself is a target too (named ``prometheus``), so ``vllm_triage_target_up``
and ``vllm_triage_scrape_failures_total`` say when it cannot be read.

Its answer is read as a target's body is (``daemon.scrape.BodyLimit``): at most
``max_body_bytes`` once decoded, with one layer of gzip accepted and inflated inside that
limit (a range query's JSON shrinks about tenfold, and the query API is often across a
network), redirects not followed (its credentials stay with its URL), the whole request
bounded by ``timeout_seconds``; the JSON is decoded on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx
import structlog

from daemon.core.names import SAMPLES
from daemon.errors import ParseError, ScrapeError, TooCostlyError
from daemon.exporter import label_value
from daemon.httpauth import auth_headers
from daemon.notifier import Notifier
from daemon.redact import safe_url
from daemon.scrape import BodyLimit, scrape_error
from daemon.settings import PrometheusSourceSettings, Settings, TargetSettings
from daemon.state import TargetState
from daemon.store import StateStore
from daemon.watcher import TargetWatcher

log = structlog.get_logger("vllm_triage.fleet")

#: Every sample name the parser reads, as one anchored regular expression.
NAMES_REGEX = "|".join(re.escape(name) for name in sorted(SAMPLES))
_NAME_OK = re.compile(r"[^A-Za-z0-9_.:/@-]+")


def series_query(selector: str) -> str:
    """The PromQL selecting the parser's series, narrowed by the user's label matchers."""
    inner = selector.strip().removeprefix("{").removesuffix("}").strip()
    matchers = f'__name__=~"{NAMES_REGEX}"' + (f", {inner}" if inner else "")
    return "{" + matchers + "}"


def target_name(labels: Mapping[str, str], identity: Iterable[str]) -> str:
    """``job/instance`` (or the configured identity labels), usable as a label value."""
    parts = [labels.get(k, "") for k in identity]
    name = "/".join(p for p in parts if p) or "unlabelled"
    name = _NAME_OK.sub("_", name)
    return label_value(name if name[0].isalnum() else "t" + name)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(samples: Iterable[tuple[Mapping[str, str], str]]) -> str:
    """Exposition text for one server at one step: one line per (labels, value)."""
    lines = []
    for labels, value in samples:
        name = labels["__name__"]
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items() if k != "__name__")
        lines.append(f"{name}{{{inner}}} {value}")
    return "\n".join(lines) + "\n"


def group_steps(
    result: list[dict[str, Any]], identity: list[str]
) -> dict[str, dict[float, list[tuple[dict[str, str], str]]]]:
    """A ``query_range`` matrix as {server: {step time: [(labels, value)]}}."""
    out: dict[str, dict[float, list[tuple[dict[str, str], str]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for series in result:
        labels: dict[str, str] = series["metric"]
        name = target_name(labels, identity)
        for at, value in series["values"]:
            out[name][float(at)].append((labels, value))
    return out


class PrometheusSource:
    """The fleet's one scheduled job: query, split by server, feed each server's core."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: httpx.AsyncClient,
        notifier: Notifier | None,
        clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        assert settings.prometheus is not None
        self.settings = settings
        self.source: PrometheusSourceSettings = settings.prometheus
        self.watchers: dict[str, TargetWatcher] = {}
        self.in_flight = False
        self._client = client
        self._notifier = notifier
        self._clock = clock
        self._store = store
        self._headers = {
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            **auth_headers(self.source),
        }
        self._query = series_query(self.source.selector)
        self._last: float | None = None
        # The query API's own health, reported like a target's.
        self.api = TargetWatcher(
            TargetSettings(name="prometheus", url=self.source.url),
            settings,
            client=client,
            notifier=None,
            clock=clock,
        )

    def states(self) -> list[TargetState]:
        return [self.api.state] + [w.state for _, w in sorted(self.watchers.items())]

    def _watcher(self, name: str) -> TargetWatcher:
        watcher = self.watchers.get(name)
        if watcher is None:
            url = f"{self.source.url.rstrip('/')}/api/v1/query_range#{name}"
            watcher = TargetWatcher(
                TargetSettings(name=name, url=url),
                self.settings,
                client=self._client,
                notifier=self._notifier,
                clock=self._clock,
                store=self._store,
            )
            self.watchers[name] = watcher
            log.info("fleet_target_discovered", target=name)
        return watcher

    async def query_range(self, start: float, end: float, step: float) -> list[dict[str, Any]]:
        url = f"{self.source.url.rstrip('/')}/api/v1/query_range"
        params = {"query": self._query, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        params["step"] = f"{step:g}"
        timeout = self.source.timeout_seconds
        try:
            async with (
                asyncio.timeout(timeout),
                self._client.stream(
                    "GET",
                    url,
                    params=params,
                    headers=self._headers,
                    timeout=timeout,
                    follow_redirects=False,
                ) as resp,
            ):
                if resp.status_code // 100 != 2:
                    raise ScrapeError(
                        f"HTTP {resp.status_code} from {safe_url(url)}", reason="http_status"
                    )
                limit = BodyLimit(
                    self.settings.max_body_bytes, url, resp.headers.get("Content-Encoding", "")
                )
                async for chunk in resp.aiter_raw():
                    limit.add(chunk)
                body = limit.body()
        except TimeoutError as exc:
            raise ScrapeError(
                f"timed out after {timeout:g} s: {safe_url(url)}", reason="timeout"
            ) from exc
        except httpx.HTTPError as exc:
            raise scrape_error(exc, url, timeout) from exc
        try:
            doc = await asyncio.to_thread(json.loads, body)
            if not isinstance(doc, dict) or doc.get("status") != "success":
                raise ValueError("status is not success")
            result: list[dict[str, Any]] = doc["data"]["result"]
            if not isinstance(result, list):
                raise TypeError("data.result is not a list")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ScrapeError(
                f"not a query_range answer from {safe_url(url)}: {str(exc)[:200]}",
                reason="parse",
            ) from exc
        return result

    async def tick(self) -> None:
        """One evaluation round for the whole fleet; never raises for what the API did."""
        self.in_flight = True
        step = self.settings.interval_seconds
        now = self._clock()
        # Steps on a fixed grid, so that consecutive ticks neither skip nor repeat one.
        end = now - now % step
        start = end - self.settings.window_seconds if self._last is None else self._last + step
        api = self.api.state
        started = time.monotonic()
        try:
            if start > end:
                return
            result = await self.query_range(start, end, step)
        except ScrapeError as exc:
            self.api.failed(exc.reason, str(exc))
            return
        finally:
            api.attempted(now, time.monotonic() - started)
            self.in_flight = False
        try:
            grouped = group_steps(result, self.source.identity_labels)
        except (KeyError, TypeError, ValueError) as exc:
            self.api.failed("parse", f"not a query_range matrix: {type(exc).__name__}")
            return
        api.up, api.last_success_at = True, now
        self._last = end
        for name, watcher in self.watchers.items():
            if name not in grouped:
                watcher.failed("absent", "no series for this server in the query API")
        for name, steps in sorted(grouped.items()):
            watcher = self._watcher(name)
            for at in sorted(steps):
                watcher.state.attempted(at)
                try:
                    snapshot = watcher.parser.parse(
                        exposition(steps[at]), at, keep=watcher.known_models()
                    )
                except TooCostlyError as exc:
                    watcher.failed("too_costly", f"refused: reading it would cost too much: {exc}")
                    continue
                except ParseError as exc:
                    watcher.failed("parse", f"unusable series from the query API: {exc}")
                    continue
                watcher.consume(snapshot)
