"""The shipped inhibit rule (deploy/compose/alertmanager.yml, documented in
docs/operations.md) through a real Alertmanager, read back with amtool: the daemon's
alert mutes the rules' alert of the same diagnosis, model and server, and no other
server's, including where a label is absent on both sides (which Alertmanager counts
as equal: the rule it replaces muted every server's alert that way, as the last test
shows).

The daemon's alerts are the bytes it pushes (``core.alerts``: its identity labels from
``server_labels``); the rules' alerts are added with ``amtool alert add`` as Prometheus
sends them: the series' labels (namespace, pod, job, instance, model_name) and the rule's
(alertname, severity, diagnosis), no ``target``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from vllm_triage.commands.render import objectives_of
from vllm_triage.config.load import load_settings
from vllm_triage.core.alerts import firing_alert, postable_alerts
from vllm_triage.render.templates import rules
from vllm_triage.simulator import get_scenario

from support.components import alertmanager, binary, prometheus
from support.diagnosis import firing
from support.harness import metrics_url, running_daemon, simulated, wait_for
from support.paths import ROOT
from support.receiver import Receiver

pytestmark = pytest.mark.prometheus

SHIPPED = ROOT / "deploy" / "compose" / "alertmanager.yml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The inhibit rule this one replaced: equal on the diagnosis and model alone.
BEFORE = [
    {
        "source_matchers": ['target=~".+"'],
        "target_matchers": ['instance=~".+"'],
        "equal": ["diagnosis", "model_name"],
    }
]

#: The daemon's alerts: (target, server labels).
DAEMON = {
    "k8s-a": {"namespace": "llm", "pod": "vllm-llama3-a"},
    "host-1": {"job": "vllm", "instance": "host-1:8000"},
    # Told only its namespace: no pod, so it names no server and mutes nothing.
    "ns-only": {"namespace": "batch"},
}
#: The rules' alerts: (a name for the test, the series' labels), and whether the
#: shipped rule mutes each.
RULES = {
    # Kubernetes: the daemon's own pod is muted, the next pod is not.
    "pod-a": (
        {
            "namespace": "llm",
            "pod": "vllm-llama3-a",
            "job": "llm/vllm",
            "instance": "10.0.0.1:8000",
        },
        True,
    ),
    "pod-b": (
        {
            "namespace": "llm",
            "pod": "vllm-llama3-b",
            "job": "llm/vllm",
            "instance": "10.0.0.2:8000",
        },
        False,
    ),
    # Elsewhere: job and instance.
    "host-1": ({"job": "vllm", "instance": "host-1:8000"}, True),
    "host-2": ({"job": "vllm", "instance": "host-2:8000"}, False),
    # `pod` absent on both sides (the daemon knows only the namespace, this series has no
    # pod label): Alertmanager would count them equal; the rule must not mute it.
    "no-pod": ({"namespace": "batch", "job": "batch", "instance": "10.0.0.9:8000"}, False),
}


def config(receiver_url: str, inhibit: list[dict[str, Any]] | None = None) -> str:
    """The shipped configuration, routed to ``receiver_url`` within a second."""
    doc = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    doc["route"].update(receiver="hook", group_wait="1s", group_interval="1s")
    doc["receivers"] = [{"name": "hook", "webhook_configs": [{"url": receiver_url}]}]
    if inhibit is not None:
        doc["inhibit_rules"] = inhibit
    return yaml.safe_dump(doc)


def daemon_alert(target: str, labels: dict[str, str], now: float) -> dict[str, Any]:
    t = firing("kv_pressure", now, MODEL)
    alert = firing_alert(
        t, target=target, severity="warning", external_url="http://x", server_labels=labels
    )
    [body] = postable_alerts([alert], now=now, valid_for=600)
    return body


def amtool(url: str, *args: str) -> Any:
    result = subprocess.run(
        [binary("amtool"), f"--alertmanager.url={url}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if "-o" in args else result.stdout


def add_rule_alert(url: str, labels: dict[str, str]) -> None:
    """As Prometheus sends a firing VllmKvPressure of the rendered rules."""
    words = [f"{k}={v}" for k, v in labels.items()]
    amtool(
        url,
        "alert",
        "add",
        "VllmKvPressure",
        "severity=warning",
        "diagnosis=kv_pressure",
        f"model_name={MODEL}",
        *words,
        "--annotation=summary=KV cache full",
    )


def states(url: str) -> dict[str, str]:
    """Each alert's state by its name here: the daemon's by target, the rules' by the
    RULES key its labels match."""
    out = {}
    for which in ("--active", "--inhibited"):
        for a in amtool(url, "alert", "query", which, "-o", "json"):
            labels = a["labels"]
            if "target" in labels:
                name = "daemon:" + labels["target"]
            else:
                name = next(k for k, (ls, _) in RULES.items() if ls.items() <= labels.items())
            out[name] = a["status"]["state"]
    return out


def everything_in(url: str) -> dict[str, str]:
    """Add every alert, then wait until Alertmanager has judged all of them."""
    now = time.time()
    bodies = [daemon_alert(t, labels, now) for t, labels in DAEMON.items()]
    httpx.post(url + "/api/v2/alerts", json=bodies, timeout=5).raise_for_status()
    for labels, _ in RULES.values():
        add_rule_alert(url, labels)

    def judged() -> dict[str, str] | None:
        got = states(url)
        return got if len(got) == len(DAEMON) + len(RULES) else None

    found: dict[str, str] = wait_for(judged, timeout=30, every=0.3)
    return found


def test_the_daemon_mutes_the_rules_alert_of_its_own_server_only(tmp_path: Path) -> None:
    with Receiver() as rx, alertmanager(tmp_path, config(rx.url)) as am:
        got = everything_in(am)
        # Inhibition is decided as the alerts arrive; asked again, it is the same.
        time.sleep(2)
        assert states(am) == got
        # What is delivered: every alert the rule does not mute, and nothing else.
        want_delivered = {f"daemon:{t}" for t in DAEMON} | {
            k for k, (_, muted) in RULES.items() if not muted
        }

        def delivered() -> set[str] | None:
            seen = set()
            for body in rx.bodies():
                for a in body["alerts"]:
                    labels = a["labels"]
                    seen.add(
                        "daemon:" + labels["target"]
                        if "target" in labels
                        else next(k for k, (ls, _) in RULES.items() if ls.items() <= labels.items())
                    )
            return seen if seen >= want_delivered else None

        assert wait_for(delivered, timeout=30, every=0.3) == want_delivered
    assert got == {
        **{f"daemon:{t}": "active" for t in DAEMON},
        **{k: "suppressed" if muted else "active" for k, (_, muted) in RULES.items()},
    }


def test_the_rule_it_replaces_muted_other_servers(tmp_path: Path) -> None:
    """The same alerts under the previous rule (equal: diagnosis and model only): every
    rules' alert of kv_pressure on that model is muted, other pods and hosts included:
    the over-muting the shipped rule ends (and the check above can see)."""
    with Receiver() as rx, alertmanager(tmp_path, config(rx.url, BEFORE)) as am:
        got = everything_in(am)
    assert {k: got[k] for k in RULES} == {k: "suppressed" for k in RULES}


def host_port(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]


def test_one_incident_one_page_with_rules_and_daemon_both_running(tmp_path: Path) -> None:
    """Two pods in KV pressure, as Kubernetes' discovery labels them (namespace, pod);
    Prometheus evaluates the rendered rules over both and sends their alerts; the sidecar
    of pod a (its namespace and pod from its settings, as the downward API gives them)
    pushes its own. One page for pod a, the daemon's (the rules' is muted), and pod b's
    rules' alert is not muted."""
    # The rendered rules, quicker: one evaluation to open (`for: 15s`), groups every
    # 2 s; the expressions and labels are the shipped ones.
    settings = load_settings(flags={"incident": {"open_after": 1}})
    text = rules(objectives_of(settings, "test")).replace("interval: 15s", "interval: 2s")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(text, encoding="utf-8")
    with (
        Receiver() as rx,
        alertmanager(tmp_path, config(rx.url)) as am,
        simulated(get_scenario("kv_pressure"), speed=10.0) as a,
        simulated(get_scenario("kv_pressure"), speed=10.0) as b,
    ):
        pods = {
            host_port(metrics_url(a)): "vllm-llama3-a",
            host_port(metrics_url(b)): "vllm-llama3-b",
        }
        labels = {addr: {"namespace": "llm", "pod": pod} for addr, pod in pods.items()}
        sidecar = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 0.5,
                "targets": [{"name": "vllm-llama3", "url": metrics_url(a)}],
                "receivers": [{"type": "alertmanager", "name": "am", "url": am}],
                "alerting": {"server_labels": {"namespace": "llm", "pod": "vllm-llama3-a"}},
            }
        )
        with (
            prometheus(
                tmp_path, {"vllm": list(pods)}, labels=labels, rules=rules_file, alertmanager=am
            ),
            running_daemon(sidecar),
        ):

            def both_judged() -> dict[str, str] | None:
                found = {}
                for which in ("--active", "--inhibited"):
                    for alert in amtool(am, "alert", "query", which, "-o", "json"):
                        ls = alert["labels"]
                        who = ("daemon:" if "target" in ls else "rules:") + ls.get("pod", "?")
                        found[who] = alert["status"]["state"]
                return found if len(found) == 3 else None

            got = wait_for(both_judged, timeout=120, every=1.0)
            time.sleep(3)  # a group_interval more: anything muted would have been sent
            sent = {
                ("daemon:" if "target" in x["labels"] else "rules:") + x["labels"]["pod"]
                for body in rx.bodies()
                for x in body["alerts"]
            }
    assert got == {
        "daemon:vllm-llama3-a": "active",
        "rules:vllm-llama3-a": "suppressed",
        "rules:vllm-llama3-b": "active",
    }
    assert sent == {"daemon:vllm-llama3-a", "rules:vllm-llama3-b"}
