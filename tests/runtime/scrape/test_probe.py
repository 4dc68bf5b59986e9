"""Tests for daemon/vllm_triage/scrape/probe.py: the one-token probe, against a fake OpenAI API on
127.0.0.1; and, through the daemon, the hang that metrics cannot show."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from vllm_triage.config.auth import auth_headers
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import ProbeSettings, TargetSettings
from vllm_triage.scrape.probe import Prober, completions_url

from support.captures import fixture_text
from support.clirun import HANG_S
from support.clock import FakeClock
from support.harness import refused_port, running_daemon, wait_for
from support.localserver import Exchange, serving


@dataclass
class Api:
    """How the fake server answers POST /v1/completions; GET /metrics serves ``metrics``."""

    status: int = 200
    body: bytes = b'{"choices": [{"text": "!"}]}'
    delay: float = 0.0
    metrics: bytes = b""
    requests: list[tuple[dict[str, str], Any]] = field(default_factory=list)


@contextmanager
def api(answer: Api) -> Iterator[str]:
    """A fake vLLM on 127.0.0.1; yields its base URL."""

    def handle(x: Exchange) -> None:
        if x.request.method != "POST":
            x.reply(200, answer.metrics)
            return
        answer.requests.append((x.request.headers, json.loads(x.request.body)))
        if answer.delay:
            x.hang(answer.delay)  # a hung engine: the answer never comes
        x.reply(answer.status, answer.body)

    with serving(handle) as server:
        yield server.url()


def target(base: str, **probe: Any) -> TargetSettings:
    return TargetSettings(
        name="llama",
        url=f"{base}/metrics",
        bearer_token="s3cret",
        probe=ProbeSettings(enabled=True, **probe),
    )


def probe_once(prober: Prober) -> None:
    async def main() -> None:
        async with httpx.AsyncClient() as client:
            prober._client = client
            await prober.run()

    asyncio.run(main())


def prober(t: TargetSettings, clock: FakeClock, model: str | None = "tiny-llama") -> Prober:
    return Prober(
        t.name,
        t.probe,
        url=completions_url(t.url, t.probe.url),
        headers=auth_headers(t),
        client=httpx.AsyncClient(),
        model=lambda: model,
        clock=clock,
    )


class TestProbe:
    def test_asks_for_one_token_and_says_who_asks(self) -> None:
        answer = Api()
        with api(answer) as base:
            p = prober(target(base), FakeClock(1000.0))
            probe_once(p)
        [(headers, body)] = answer.requests
        assert body == {
            "model": "tiny-llama",
            "prompt": "ping",
            "max_tokens": 1,
            "temperature": 0,
            "user": "vllm-triage-probe",
        }
        assert headers["X-Request-Id"] == "vllm-triage-probe-1"
        assert headers["Authorization"] == "Bearer s3cret"
        assert p.stats.probes == 1 and not p.stats.failures
        assert p.status().unanswered_since is None and p.status().last_reason is None
        t = target(base)
        # Answered, so within its deadline: the seconds it took are kept.
        assert p.stats.last_seconds is not None
        assert 0 < p.stats.last_seconds < t.probe.timeout_seconds

    def test_a_probe_past_its_deadline_stays_unanswered(self) -> None:
        """No answer within the deadline: a timeout, and the probe counts as unanswered
        from when it was sent, across the next probes, until one is answered."""
        answer = Api(delay=30.0)
        clock = FakeClock(1000.0)
        with api(answer) as base:
            # Long enough that only the hung answers miss it, even on a busy machine.
            p = prober(target(base, timeout_seconds=1.0), clock)
            probe_once(p)
            assert p.status().unanswered_since == 1000.0
            assert p.status().last_reason == "timeout"
            clock.now = 1030.0
            probe_once(p)
            assert p.status().unanswered_since == 1000.0  # the oldest one still counts
            assert p.stats.failures["timeout"] == 2
            answer.delay = 0.0
            clock.now = 1060.0
            probe_once(p)
        assert p.status().unanswered_since is None and p.status().last_reason is None

    @pytest.mark.parametrize(
        ("status", "body", "reason"),
        [
            (500, b"engine dead", "http_status"),
            (404, b'{"error": "model not found"}', "http_status"),
            (200, b"<html>", "bad_response"),
            (200, b'{"choices": []}', "bad_response"),
            (200, b"[1, 2]", "bad_response"),
        ],
    )
    def test_a_bad_answer_is_a_failure_but_an_answer(
        self, status: int, body: bytes, reason: str
    ) -> None:
        """Something answered: counted by reason, but not evidence of a hung engine."""
        with api(Api(status=status, body=body)) as base:
            p = prober(target(base), FakeClock(1000.0))
            probe_once(p)
        assert p.stats.failures == {reason: 1}
        assert p.status().last_reason == reason and p.status().unanswered_since is None

    def test_refused(self) -> None:
        p = prober(target(f"http://127.0.0.1:{refused_port()}"), FakeClock(1000.0))
        probe_once(p)
        assert p.stats.failures == {"connect": 1} and p.status().unanswered_since is None

    def test_waits_for_a_model_name(self) -> None:
        """Before a scrape has said which model the server serves, nothing is sent."""
        answer = Api()
        with api(answer) as base:
            p = prober(target(base), FakeClock(1000.0), model=None)
            probe_once(p)
        assert answer.requests == [] and p.stats.probes == 0

    def test_where_it_goes(self) -> None:
        t = TargetSettings(name="t", url="https://u:p@vllm.internal:8443/prefix/metrics?x=1")
        assert completions_url(t.url) == "https://u:p@vllm.internal:8443/v1/completions"
        own = TargetSettings(
            name="t",
            url="http://a:1/metrics",
            probe=ProbeSettings(url="http://b:2/openai/v1/completions", model="m"),
        )
        assert completions_url(own.url, own.probe.url) == "http://b:2/openai/v1/completions"

    def test_off_unless_enabled(self) -> None:
        assert TargetSettings(name="t", url="http://a:1/metrics").probe.enabled is False


class TestThroughTheDaemon:
    def test_an_idle_looking_engine_that_never_answers_is_stalled(self, tmp_path: Any) -> None:
        """/metrics answers, frozen, and says nothing is running; the probe's one-token
        request never returns. Metrics alone call this idle; with the probe the daemon
        calls it stalled, and the API and /metrics say so."""
        answer = Api(delay=60.0, metrics=fixture_text("kvwarden-vllm-0.19.1-v1.txt").encode())
        with api(answer) as base:
            cfg = tmp_path / "t.yaml"
            cfg.write_text(
                "interval_seconds: 0.2\n"
                "window_seconds: 10\n"
                "thresholds: {stall_after_seconds: 1.5}\n"
                "incident: {open_after: 2}\n"
                "listen: 127.0.0.1:0\n"
                "targets:\n"
                f"  - name: idle\n    url: {base}/metrics\n"
                "    probe: {enabled: true, interval_seconds: 0.2, timeout_seconds: 0.5}\n"
            )
            with running_daemon(load_settings(cfg)) as daemon:
                [w] = daemon.targets

                def stalled() -> bool:
                    return any(t.cause == "stalled" and t.event == "firing" for t in w.state.recent)

                wait_for(stalled, timeout=HANG_S)
                doc = httpx.get(daemon.url + "/api/v1/diagnoses", timeout=5).json()
                metrics = httpx.get(daemon.url + "/metrics", timeout=5).text
        [t] = doc["targets"]
        [m] = t["models"]
        assert m["diagnosis"] == "stalled"
        assert m["evidence"]["requests_running"] == 0
        assert m["evidence"]["probe_unanswered_seconds"] >= 1.5
        assert t["probe"]["failures"]["timeout"] >= 1
        assert 'vllm_triage_probe_failures_total{reason="timeout",target="idle"}' in metrics
        assert (
            answer.requests and answer.requests[0][1]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        )
