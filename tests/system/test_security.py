"""Secrets stay secret, and receivers can trust what they get.

Every secret a user can configure (a target's bearer token, a receiver's URL token,
basic-auth password, extra header value, HMAC key) is set to a marker string; the daemon
then runs with a receiver that fails and a target that fails, so that every error path
logs. The markers must appear in no log line, no endpoint, no exception text. GET-only
routes are tested in tests/runtime/serve/test_listener.py, the non-root image in
tests/deploy/test_dockerfile.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import httpx
import structlog

from vllm_triage.config.load import load_settings
from vllm_triage.simulator import get_scenario

from support.clirun import HANG_S
from support.harness import metrics_url, refused_port, running_daemon, simulated, wait_for
from support.receiver import Receiver

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
                lambda: all(d.stats.failed >= 1 for d in daemon.notifier.deliveries), timeout=HANG_S
            )
            for path in (
                "/metrics",
                "/healthz",
                "/readyz",
                "/api/v1/diagnoses",
                "/api/v1/series",
                "/",
            ):
                seen.append(httpx.get(daemon.url + path, timeout=HANG_S).text)
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
    with Receiver(hmac_secret=key, refuse_bad_signatures=True) as rx:
        verified = rx.signature_ok
        with simulated(get_scenario("kv_pressure"), speed=10.0) as sim:
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.5,
                    "targets": [{"name": "kv", "url": metrics_url(sim)}],
                    "receivers": [
                        {
                            "type": "alertmanager_webhook",
                            "url": rx.url,
                            "hmac_secret": key.decode(),
                        }
                    ],
                }
            )
            with running_daemon(settings) as daemon:
                wait_for(lambda: verified, timeout=HANG_S)
                # The receiver records before it answers: wait for the answer to count.
                delivery = daemon.notifier.deliveries[0]
                wait_for(lambda: delivery.stats.sent + delivery.stats.failed >= 1, timeout=HANG_S)
                sent = delivery.stats.sent
        # The same receiver refuses a body signed with another key.
        forged = "sha256=" + hmac.new(b"wrong-key", b"{}", hashlib.sha256).hexdigest()
        refused = httpx.post(
            rx.url, content=b"{}", headers={"X-Vllm-Triage-Signature": forged}, timeout=HANG_S
        ).status_code
    assert verified[0] is True and sent >= 1
    assert refused == 401 and verified[-1] is False
