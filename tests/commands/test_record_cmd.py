"""``vllm-triage record`` as a user runs it (daemon/vllm_triage/commands/record.py): the installed
command against a server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from support.clirun import vllm_triage
from support.localserver import replies, serving


class TestRecord:
    def test_record_a_local_server(self, tmp_path: Path) -> None:
        """`record` saves scrapes of a server on 127.0.0.1 and stops after --duration: a
        file per scrape, at most one per tick of the 0.2 s interval (a busy machine skips
        ticks; the schedule itself is tested on a fake clock in test_record.py). The
        per-scrape timeout is set apart from the interval, not under test here."""
        body = b'vllm:num_requests_running{model_name="m"} 1.0\n'
        with serving(replies((200, body))) as srv:
            url = srv.url("/metrics")
            result = vllm_triage(
                "record", url, "--out", "rec", "--interval", "0.2", "--duration", "0.9",
                "--timeout", "30", cwd=tmp_path,
            )  # fmt: skip
        files = sorted((tmp_path / "rec").glob("*.prom"))
        assert result.returncode == 0, result.stderr
        assert 1 <= len(files) <= 5 and len(srv.requests) == len(files)
        assert all(f.read_bytes() == body for f in files)

    def test_record_dead_target_exits_1(self, tmp_path: Path) -> None:
        """Recording a target that never answers writes nothing, logs why, and exits 1."""
        with serving(replies((200, b""))) as srv:
            url = srv.url("/metrics")
        result = vllm_triage(
            "record",
            url,
            "--out",
            "rec",
            "--interval",
            "0.2",
            "--duration",
            "0.5",
            cwd=tmp_path,
        )
        assert result.returncode == 1
        assert "cannot connect, nothing recorded" in result.stderr

    def test_record_a_page_without_vllm_metrics_exits_1_with_a_hint(self, tmp_path: Path) -> None:
        """Pointed at a health check: the bodies are kept (the raw truth) but the command
        says none is vLLM's metrics, where they are, and exits 1."""
        with serving(replies((200, b"ok"))) as srv:
            url = srv.url("/metrics")
            healthz = url.replace("/metrics", "/healthz")
            result = vllm_triage(
                "record", healthz, "--out", "rec", "--interval", "0.2", "--duration", "0.5",
                "--timeout", "30", cwd=tmp_path,
            )  # fmt: skip
        assert result.returncode == 1
        assert "holds vLLM metrics" in result.stderr
        assert f"vLLM serves its metrics at /metrics: try {url}" in result.stderr
