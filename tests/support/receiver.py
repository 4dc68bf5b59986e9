"""A webhook receiver on 127.0.0.1 (support/localserver.py) that keeps every POST and
answers from a plan: a status with headers, after a delay, or a hang.

It can be made before it serves (its port held, connections refused: a receiver that is
down), started late, stopped and started again on the same port. ``behaviour`` is the
plan's last reply, the one that repeats: change it while the receiver runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from support.localserver import Exchange, LocalServer, Request

#: How long a hang holds a request (released early when the receiver stops).
HANG_S = 5.0


@dataclass
class Reply:
    """One answer: ``status`` with ``headers`` after ``delay`` seconds; or, with ``hang``,
    none at all (until the receiver stops)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False


@dataclass(frozen=True)
class Received:
    """A request the receiver accepted (answered 2xx)."""

    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


class Receiver:
    """``plan``: the replies in turn, the last one repeating (default: 200).

    With ``hmac_secret`` each request's ``X-Vllm-Triage-Signature`` is checked (the result
    in ``signature_ok``); ``refuse_bad_signatures`` then answers 401 to one that fails.
    """

    def __init__(
        self,
        plan: list[Reply] | None = None,
        *,
        port: int = 0,
        http11: bool = False,
        hmac_secret: bytes | None = None,
        refuse_bad_signatures: bool = False,
    ) -> None:
        self.plan = plan or [Reply()]
        self.hmac_secret = hmac_secret
        self.refuse_bad_signatures = refuse_bad_signatures
        self.signature_ok: list[bool] = []
        self.requests: list[Received] = []
        self._answered = 0
        self._lock = threading.Lock()
        self.server = LocalServer(self._answer, port=port, http11=http11)

    @property
    def behaviour(self) -> Reply:
        return self.plan[-1]

    @behaviour.setter
    def behaviour(self, reply: Reply) -> None:
        self.plan = [reply]

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url("/hook")

    @property
    def seen(self) -> list[Request]:
        """Every request that arrived, answered or not."""
        return self.server.requests

    @property
    def attempts(self) -> int:
        return len(self.server.requests)

    def raw_bodies(self) -> list[bytes]:
        """The body of every request that arrived."""
        return [r.body for r in self.server.requests]

    def bodies(self) -> list[Any]:
        """The JSON bodies the receiver accepted, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    def _answer(self, x: Exchange) -> None:
        with self._lock:
            reply = self.plan[min(self._answered, len(self.plan) - 1)]
            self._answered += 1
        status = reply.status
        if self.hmac_secret is not None:
            want = (
                "sha256=" + hmac.new(self.hmac_secret, x.request.body, hashlib.sha256).hexdigest()
            )
            ok = hmac.compare_digest(x.request.header("X-Vllm-Triage-Signature"), want)
            with self._lock:
                self.signature_ok.append(ok)
            if not ok and self.refuse_bad_signatures:
                status = 401
        if reply.hang:
            x.hang(HANG_S)
            return
        if reply.delay:
            time.sleep(reply.delay)
        if status // 100 == 2:
            with self._lock:
                self.requests.append(Received(x.request.path, x.request.headers, x.request.body))
        x.reply(status, headers=reply.headers)

    def start(self) -> Receiver:
        self.server.start()
        return self

    def stop(self) -> None:
        """Down: connections are refused until ``start``; the port stays this one's."""
        self.server.stop()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.server.close()
