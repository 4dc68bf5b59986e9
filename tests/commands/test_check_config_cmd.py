"""``vllm-triage check-config`` (daemon/vllm_triage/commands/check_config.py): the merged settings
and the resolved ceiling, secrets masked."""

from __future__ import annotations

import json
from pathlib import Path

from support.clirun import vllm_triage
from support.paths import ROOT


class TestCheckConfig:
    def test_prints_effective_settings(self, tmp_path: Path) -> None:
        """check-config prints the merged settings and the resolved ceiling."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("hardware:\n  gpu: h100\nmodel:\n  parameters_billion: 8\n")
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["hardware"]["gpu"] == "h100"
        assert "209.4 tok/s per stream on NVIDIA H100 SXM" in result.stderr

    def test_the_example_daemon_config_is_valid(self, tmp_path: Path) -> None:
        """deploy/triage.example.yaml loads, and each target gets its own ceiling."""
        example = ROOT / "deploy" / "triage.example.yaml"
        result = vllm_triage("check-config", "--config", str(example), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        settings = json.loads(result.stdout)
        assert [t["name"] for t in settings["targets"]] == ["llama-8b", "qwen-32b"]
        assert settings["receivers"][0]["type"] == "alertmanager_webhook"
        assert "target qwen-32b: 62.2 tok/s per stream on 2x NVIDIA A100 80GB SXM" in result.stderr

    def test_secrets_print_masked(self, tmp_path: Path) -> None:
        cfg = tmp_path / "t.yaml"
        cfg.write_text(
            "targets: [{name: a, url: 'http://127.0.0.1:1/metrics', bearer_token: tok-123}]\n"
            "receivers: [{type: slack, url: 'https://hooks.example/T/B/sekrit',"
            " hmac_secret: hm-456}]\n"
        )
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        for secret in ("tok-123", "sekrit", "hm-456"):
            assert secret not in result.stdout + result.stderr
        assert "**********" in result.stdout

    def test_unknown_gpu(self, tmp_path: Path) -> None:
        """An unknown GPU name is a configuration error naming the nearest known ones."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("hardware:\n  gpu: H100-80G\nmodel:\n  parameters_billion: 8\n")
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 2
        assert "did you mean NVIDIA H100 SXM" in result.stderr
        assert len(result.stderr) < 400 and "MI300X" not in result.stderr

    def test_a_card_only_config_says_where_the_model_comes_from(self, tmp_path: Path) -> None:
        """The README's card-only config: the model's facts come from the table once vLLM
        reports its name, and check-config says so instead of "set hardware and model"."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("hardware: {gpu: H100}\n")
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        [line] = [x for x in result.stderr.splitlines() if x.startswith("decode ceiling")]
        assert "set hardware and model" not in line
        assert "on NVIDIA H100 SXM, from the bundled model table" in line
        assert "once vLLM reports its model_name" in line

    def test_without_a_card_it_asks_for_one(self, tmp_path: Path) -> None:
        result = vllm_triage("check-config", cwd=tmp_path)
        assert "decode ceiling, default: unknown (set hardware: the GPU" in result.stderr
