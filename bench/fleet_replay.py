"""A query API that replays answers recorded from a real backend, for fleets too large
for the benchmark machine's Prometheus (bench/bench_fleet.py).

The recording is one tick of fleet mode's answers over a small fleet of the five
scenarios, split into each scenario's rows per query. The replay serves N servers
(server j plays scenario j % 5, as pod ``vllm-j`` in bucket ``hashmod(llm/vllm-j)``):
an instant query's answer is the rows of the servers in the buckets its shard matcher
names, exactly as the real backend would give them, gzip-compressed when asked, as
Prometheus does. Answers repeat tick after tick (each piece's answer is built once and
kept): the replay's own cost is not what is measured.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: A recorded row: its labels and its value (as the API wrote it).
Row = tuple[dict[str, str], str]
#: {scenario index: {query key: rows of that scenario's one server}}.
Templates = dict[int, dict[str, list[Row]]]
SHARD_LABEL = "vllm_triage_shard"
POD = "@@pod@@"
BUCKET = "@@bucket@@"


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action: MD5, its last 8 bytes, big-endian."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


@dataclass
class Replay:
    """Answers for ``servers`` servers from ``templates`` (``keys``: each query's text
    without its shard matcher -> its key)."""

    templates: Templates
    keys: Mapping[str, str]
    present: list[str]
    servers: int
    buckets: int
    #: Per key, per bucket: the servers' rows as JSON, joined.
    blobs: dict[str, dict[int, bytes]] = field(default_factory=dict)
    cache: dict[tuple[str, frozenset[str], bool], bytes] = field(default_factory=dict)
    sent: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Sent to the server's process before it builds: the recording, not the lock.
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def build(self) -> None:
        # Each scenario's row as JSON with placeholders for the pod and its bucket.
        shapes: dict[int, dict[str, list[str]]] = {}
        for scenario, by_key in self.templates.items():
            shapes[scenario] = {}
            for key, rows in by_key.items():
                out = []
                for metric, value in rows:
                    m = dict(metric)
                    if "pod" in m:
                        m["pod"] = POD
                    if SHARD_LABEL in m:
                        m[SHARD_LABEL] = BUCKET
                    out.append(json.dumps({"metric": m, "value": [0, value]}))
                shapes[scenario][key] = out
        parts: dict[str, dict[int, list[str]]] = {}
        for j in range(self.servers):
            pod = f"vllm-{j}"
            bucket = hashmod(f"llm/{pod}", self.buckets)
            for key, rows in shapes[j % len(shapes)].items():
                held = parts.setdefault(key, {}).setdefault(bucket, [])
                held.extend(r.replace(POD, pod).replace(BUCKET, str(bucket)) for r in rows)
        self.blobs = {
            key: {b: ",".join(rows).encode() for b, rows in by_bucket.items()}
            for key, by_bucket in parts.items()
        }

    def answer(self, query: str, gzipped: bool) -> bytes:
        bare, chosen = piece_of(query)
        key = self.keys[bare]
        wanted = frozenset(chosen) if chosen is not None else frozenset()
        cached = self.cache.get((key, wanted, gzipped))
        if cached is not None:
            return cached
        by_bucket = self.blobs.get(key, {})
        picked = [
            blob for b, blob in sorted(by_bucket.items()) if chosen is None or str(b) in chosen
        ]
        body = (
            b'{"status":"success","data":{"resultType":"vector","result":['
            + b",".join(picked)
            + b"]}}"
        )
        if gzipped:
            body = gzip.compress(body, compresslevel=6)
        with self.lock:
            self.cache[(key, wanted, gzipped)] = body
        return body

    def label_values(self, path: str, query: Mapping[str, list[str]]) -> bytes:
        match = query.get("match[]", [""])[0]
        if path.endswith(f"/label/{SHARD_LABEL}/values"):
            held = {hashmod(f"llm/vllm-{j}", self.buckets) for j in range(self.servers)}
            data: list[str] = [str(b) for b in sorted(held)]
        elif f'{SHARD_LABEL}=""' in match:
            data = []  # every series carries its bucket
        else:
            data = self.present
        return json.dumps({"status": "success", "data": data}).encode()


_PIECE = re.compile(rf'(?:, )?{SHARD_LABEL}=(~?)"([^"]*)"')


def piece_of(query: str) -> tuple[str, set[str] | None]:
    """A query without its shard matchers, and the buckets they name."""
    found = _PIECE.search(query)
    if found is None:
        return query, None
    chosen = set(found.group(2).split("|")) if found.group(1) else {found.group(2)}
    return _PIECE.sub("", query).replace("{}", ""), chosen


def serve(replay: Replay, port: int, *, ready: Any) -> None:
    """Serve ``replay`` on 127.0.0.1:``port`` until killed (a process of its own); ``ready``
    is set once it listens."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, body: bytes, gzipped: bool = False) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(body)
            with replay.lock:
                replay.sent += len(body)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/sent":
                self._reply(str(replay.sent).encode())
                return
            self._reply(replay.label_values(url.path, parse_qs(url.query)))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            self._reply(replay.answer(form["query"][0], gzipped), gzipped)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    replay.build()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ready.set()
    server.serve_forever()
