"""Secrets stay secret, and receivers can trust what they get.

Every secret a user can configure (a target's bearer token, a receiver's URL token,
basic-auth password, extra header value, HMAC key) is set to a marker string; the daemon
then runs with a receiver that fails and a target that fails, so that every error path
logs. The markers must appear in no log line, no endpoint, no exception text. GET-only
routes are tested in tests/runtime/test_listener.py, the non-root image in
tests/deploy/test_dockerfile.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import structlog

from vllm_triage.config.load import load_settings
from vllm_triage.simulator import get_scenario

from support.harness import metrics_url, refused_port, running_daemon, simulated, wait_for

SECRETS = {
    "target_token": "S3CRET-target-bearer",
    "url_token": "S3CRET-url-path-token",
    "password": "S3CRET-basic-password",
    "header": "S3CRET-header-value",
    "hmac": "S3CRET-hmac-key",
}


def test_no_secret_reaches_logs_endpoints_or_errors() -> None:
    dead_receiver = f"http://127.0.0.1:{refused_port()}/hooks/{SECRETS['url_token']}"
    dead_target = f"http://127.0.0.1:{refused_port()}/metrics"
    with simulated(get_scenario("kv_pressure"), speed=10.0) as sim:
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 0.5,
                "targets": [
                    {
                        "name": "kv",
                        "url": metrics_url(sim),
                        "bearer_token": SECRETS["target_token"],
                    },
                    {"name": "dead", "url": dead_target, "bearer_token": SECRETS["target_token"]},
                ],
                "receivers": [
                    {
                        "type": "slack",
                        "name": "slack",
                        "url": dead_receiver,
                        "headers": {"X-Api-Key": SECRETS["header"]},
                        "hmac_secret": SECRETS["hmac"],
                        "retry_initial_seconds": 0.05,
                        "retry_max_seconds": 0.1,
                        "retry_for_seconds": 0.5,
                    },
                    {
                        "type": "alertmanager_webhook",
                        "name": "basic",
                        "url": f"http://127.0.0.1:{refused_port()}/hook",
                        "basic_auth": {"username": "u", "password": SECRETS["password"]},
                        "retry_initial_seconds": 0.05,
                        "retry_max_seconds": 0.1,
                        "retry_for_seconds": 0.5,
                    },
                ],
            }
        )
        seen: list[str] = [repr(settings), settings.model_dump_json(), str(settings)]
        with structlog.testing.capture_logs() as logs, running_daemon(settings) as daemon:
            wait_for(
                lambda: all(d.stats.failed >= 1 for d in daemon.notifier.deliveries), timeout=60
            )
            for path in (
                "/metrics",
                "/healthz",
                "/readyz",
                "/api/v1/diagnoses",
                "/api/v1/series",
                "/",
            ):
                seen.append(httpx.get(daemon.url + path, timeout=5).text)
            seen.extend(d.stats.last_error for d in daemon.notifier.deliveries)
            seen.extend(w.state.last_error for w in daemon.targets)
    seen.append(json.dumps(logs, default=str))
    assert any(e["event"] == "notification_failed" for e in logs)  # the error paths ran
    assert any(e["event"] == "scrape_failed" for e in logs)
    everything = "\n".join(seen)
    for name, secret in SECRETS.items():
        assert secret not in everything, f"{name} leaked"


def test_a_receiver_verifies_the_hmac_signature() -> None:
    """A receiver that checks X-Vllm-Triage-Signature against the shared key accepts what
    the daemon sends (and would refuse anything else)."""
    key = b"shared-key"
    verified: list[bool] = []

    class Verifying(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            want = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(want, self.headers.get("X-Vllm-Triage-Signature", ""))
            verified.append(ok)
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Verifying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with simulated(get_scenario("kv_pressure"), speed=10.0) as sim:
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.5,
                    "targets": [{"name": "kv", "url": metrics_url(sim)}],
                    "receivers": [
                        {
                            "type": "alertmanager_webhook",
                            "url": f"http://127.0.0.1:{server.server_address[1]}/hook",
                            "hmac_secret": key.decode(),
                        }
                    ],
                }
            )
            with running_daemon(settings) as daemon:
                wait_for(lambda: verified, timeout=60)
                # The receiver records before it answers: wait for the answer to count.
                delivery = daemon.notifier.deliveries[0]
                wait_for(lambda: delivery.stats.sent + delivery.stats.failed >= 1, timeout=10)
                sent = delivery.stats.sent
        # The same receiver refuses a body signed with another key.
        forged = "sha256=" + hmac.new(b"wrong-key", b"{}", hashlib.sha256).hexdigest()
        refused = httpx.post(
            f"http://127.0.0.1:{server.server_address[1]}/hook",
            content=b"{}",
            headers={"X-Vllm-Triage-Signature": forged},
            timeout=5,
        ).status_code
    finally:
        server.shutdown()
        server.server_close()
    assert verified[0] is True and sent >= 1
    assert refused == 401 and verified[-1] is False
