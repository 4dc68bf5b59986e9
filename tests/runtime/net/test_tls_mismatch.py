"""A scheme that does not match the port says so (daemon/vllm_triage/net/bounded.py): an https://
URL answered in plain HTTP tells the http:// URL to use instead of a bare ``[SSL:
WRONG_VERSION_NUMBER]`` (or, worse, "Operation not permitted": the TLS error's code read as a system
errno); an http:// URL whose connection is closed unanswered asks whether the port serves TLS. The
URLs said never hold the target's secrets."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import httpx
import pytest

from vllm_triage.errors import ScrapeError
from vllm_triage.net.bounded import transport_error
from vllm_triage.net.fetch import fetch_async

from support.clirun import vllm_triage
from support.localserver import Exchange, replies, serving

BODY = b'vllm:num_requests_running{model_name="m"} 1.0\n'


def fetched(url: str) -> ScrapeError:
    async def go() -> None:
        async with httpx.AsyncClient() as client:
            await fetch_async(client, url, timeout=5, max_body_bytes=1 << 20)

    with pytest.raises(ScrapeError) as info:
        asyncio.run(go())
    return info.value


def test_https_to_a_plain_http_port_says_to_use_http() -> None:
    with serving(replies((200, BODY))) as srv:
        port = srv.port
        err = fetched(f"https://watcher:S3CRET-pw@127.0.0.1:{port}/metrics?token=S3CRET-q")
    said = str(err)
    assert said.startswith("the target answered plain HTTP to an https:// URL")
    assert f"use http://127.0.0.1:{port}/metrics" in said
    assert "S3CRET" not in said and "WRONG_VERSION_NUMBER" not in said
    assert "Operation not permitted" not in said
    assert err.reason == "connect"


def test_http_to_a_port_that_hangs_up_asks_about_tls() -> None:
    """A TLS server reading a plain request closes the connection unanswered."""

    with serving(Exchange.drop) as srv:
        err = fetched(f"http://127.0.0.1:{srv.port}/metrics?token=S3CRET-q")
    said = str(err)
    assert "closed without an answer" in said
    assert f"if that port serves TLS, use https://127.0.0.1:{srv.port}/metrics" in said
    assert "S3CRET" not in said


def test_a_body_cut_short_is_not_taken_for_tls() -> None:
    """An answer that began (a status line came) and then broke is not a scheme problem."""

    def cut(x: Exchange) -> None:
        x.begin(200, {"Content-Type": "text/plain"}, length=10_000)
        x.write(BODY)
        x.hang_up()

    with serving(cut) as srv:
        err = fetched(f"http://127.0.0.1:{srv.port}/metrics")
    assert "TLS" not in str(err)


def test_check_says_it_too(tmp_path: Path) -> None:
    with serving(replies((200, BODY))) as srv:
        result = vllm_triage("check", f"https://127.0.0.1:{srv.port}/metrics", cwd=tmp_path)
    assert result.returncode != 0
    assert "answered plain HTTP to an https:// URL" in result.stderr + result.stdout
    assert f"use http://127.0.0.1:{srv.port}/metrics" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("exc", "answered", "hinted"),
    [
        (httpx.ReadError("Broken pipe"), False, True),
        (httpx.WriteError("Broken pipe"), False, True),
        (httpx.ReadError(""), False, True),  # a reset, as the async transport says it
        (httpx.ReadError("Broken pipe"), True, False),  # an answer had begun
        (httpx.ReadError("certificate unknown"), False, False),
    ],
    ids=["read-epipe", "write-epipe", "reset", "after-an-answer", "another-error"],
)
def test_https_closed_before_an_answer_names_the_client_certificate(
    exc: httpx.HTTPError, answered: bool, hinted: bool
) -> None:
    """TLS 1.3 refuses a client certificate after the handshake: on a busy host the client
    often sees a broken pipe or a reset before the server's alert, so a connection closed
    before any answer says what the alert would have."""
    if "Broken pipe" in str(exc):
        exc.__cause__ = OSError(errno.EPIPE, os.strerror(errno.EPIPE))
    url = "https://127.0.0.1:9/api/v1/query"
    said = str(transport_error(exc, url, 5.0, url, answered=answered))
    assert ("wants a client certificate" in said) is hinted
    assert url in said
