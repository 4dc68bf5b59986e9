"""``check`` exits 3 on anything it cannot judge (daemon/vllm_triage/commands/check.py).

Before: a body whose data made the core raise (a 400-digit ``cache_config_info`` label)
ended ``check`` with a traceback and exit 1, which a monitoring plugin reads as
"incident"."""

from __future__ import annotations

import pytest

from vllm_triage.cli import build_parser
from vllm_triage.commands import check as check_command
from vllm_triage.commands.check import check
from vllm_triage.core.evaluate import Evaluator

from support.clock import FakeClock
from support.daemonproc import GOOD, body
from support.localserver import serving


def test_a_body_the_core_raises_on_is_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    def raises(self: Evaluator, snapshot: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(Evaluator, "step", raises)
    clock = FakeClock()
    with serving(body(GOOD)) as server:
        result = check(
            server.url("/metrics"),
            window=1.0,
            scrapes=3,
            timeout=5.0,
            config=None,
            sleep=clock.sleep,
            clock=clock,
        )
    assert result["verdict"] == "cannot_tell" and result["scrapes_ok"] == 0
    (error,) = result["errors"]
    assert "judging it failed: OverflowError" in error["error"]
    # The first scrape could not be judged: waiting out the window would not help.
    assert result["stopped_early"] and result["scrapes_tried"] == 1


def test_anything_else_it_cannot_judge_exits_3_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object, **__: object) -> dict[str, object]:
        raise ValueError("Out of range float values are not JSON compliant")

    monkeypatch.setattr(check_command, "check", broken)
    args = build_parser().parse_args(["check", "http://127.0.0.1:1/metrics"])
    code = args.func(args)
    err = capsys.readouterr().err
    assert code == 3 and "cannot tell" in err and "ValueError" in err
    assert "Traceback" not in err
