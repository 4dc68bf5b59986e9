"""Tests for daemon/vllm_triage/config/rulebook.py through the assembly
(daemon/vllm_triage/assemble.py: ``build_rulebook``, ``ceiling``, ``build_evaluator``): the
settings a user writes become the core's ``Rulebook``, its ceiling and roofline, and the
evaluator's window and incident counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator, build_rulebook, ceiling
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.errors import ConfigError

from support.paths import CONFIGS


class TestEvaluator:
    def test_settings_reach_the_core(self, tmp_path: Path) -> None:
        """Window and incident counts from the settings are the ones the core uses."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("window_seconds: 30\nincident:\n  open_after: 1\n")
        ev = build_evaluator(load_settings(cfg))
        assert isinstance(ev, Evaluator)
        assert ev.window.seconds == 30 and ev.incidents.open_after == 1


class TestRulebook:
    def write(self, tmp_path: Path, text: str) -> Path:
        cfg = tmp_path / "t.yaml"
        cfg.write_text(text)
        return cfg

    def test_no_hardware_no_ceiling(self) -> None:
        """Without hardware and model settings there is no ceiling, and no error."""
        assert build_rulebook(load_settings()).ceiling is None

    def test_tensor_parallel_scales_the_ceiling(self, tmp_path: Path) -> None:
        """Two GPUs each read half the weights: twice the ceiling."""
        one = ceiling(
            load_settings(
                self.write(tmp_path, "hardware: {gpu: h100}\nmodel: {parameters_billion: 8}\n")
            )
        )
        tp2 = "hardware: {gpu: h100, tensor_parallel_size: 2}\nmodel: {parameters_billion: 8}\n"
        two = ceiling(load_settings(self.write(tmp_path, tp2)))
        assert one is not None and two is not None
        assert one.tokens_per_second == pytest.approx(3350 / 16)
        assert two.tokens_per_second == pytest.approx(2 * one.tokens_per_second)
        assert two.gpu.startswith("2x ")

    def test_bandwidth_without_a_name(self, tmp_path: Path) -> None:
        """A bare bandwidth works where the GPU is not in the table."""
        text = (
            "hardware: {memory_bandwidth_gb_s: 1000}\nmodel: {parameters_billion: 10, dtype: fp8}\n"
        )
        c = ceiling(load_settings(self.write(tmp_path, text)))
        assert c is not None and c.tokens_per_second == pytest.approx(100.0)

    def test_config_json_beside_the_settings(self, tmp_path: Path) -> None:
        """model.config_json relative to the settings file is found and sized."""
        (tmp_path / "config.json").write_text((CONFIGS / "llama-3.1-8b.json").read_text())
        c = ceiling(
            load_settings(
                self.write(tmp_path, "hardware: {gpu: a10g}\nmodel: {config_json: config.json}\n")
            )
        )
        assert (
            c is not None and 35 < c.tokens_per_second < 45
        )  # 600 GB/s over ~15 GB read per token

    def test_roofline_from_a_config_json(self, tmp_path: Path) -> None:
        """A config.json gives the roofline every term: routed experts apart, active
        parameters, attention, KV bytes and heads; the card's compute from the table."""
        cfg = f"hardware: {{gpu: h100}}\nmodel: {{config_json: {CONFIGS / 'qwen3-30b-a3b.json'}}}\n"
        r = build_rulebook(load_settings(self.write(tmp_path, cfg))).roofline
        assert r is not None
        assert r.gpu == "NVIDIA H100 SXM" and r.compute_tflops == 989.4
        assert (r.num_experts, r.experts_per_token, r.kv_split) == (128, 8, 4)
        assert r.routed_expert_bytes == pytest.approx(48 * 128 * 3 * 2048 * 768 * 2)
        assert r.kv_bytes_per_token == 98304
        assert r.active_parameters is not None and 2.9e9 < r.active_parameters < 3.2e9
        assert r.draft_weight_bytes is None

    def test_roofline_hand_settings_replace_the_sized_ones(self, tmp_path: Path) -> None:
        text = (
            "hardware: {gpu: h100, compute_tflops: 500, tensor_parallel_size: 2}\n"
            "model: {parameters_billion: 8, dtype: bf16, kv_bytes_per_token: 65536,"
            " active_parameters_billion: 7, draft_parameters_billion: 1, draft_dtype: fp8,"
            " draft_kv_bytes_per_token: 32768}\n"
        )
        r = build_rulebook(load_settings(self.write(tmp_path, text))).roofline
        assert r is not None
        assert (r.compute_tflops, r.tensor_parallel_size, r.gpu) == (500, 2, "2x NVIDIA H100 SXM")
        assert r.weight_bytes == 16e9 and r.kv_bytes_per_token == 65536
        assert r.active_parameters == pytest.approx(7e9)
        assert r.draft_weight_bytes == pytest.approx(1e9) and r.draft_parameters == 1e9
        assert r.draft_kv_bytes_per_token == 32768
        assert r.kv_split is None  # a parameter count says nothing of the KV heads

    def test_parameter_count_alone_leaves_kv_unknown(self, tmp_path: Path) -> None:
        text = "hardware: {gpu: h100}\nmodel: {parameters_billion: 8}\n"
        r = build_rulebook(load_settings(self.write(tmp_path, text))).roofline
        assert r is not None and r.kv_bytes_per_token is None
        assert r.active_parameters == pytest.approx(8e9)

    def test_bad_draft_dtype_is_named(self, tmp_path: Path) -> None:
        text = (
            "hardware: {gpu: h100}\n"
            "model: {parameters_billion: 8, draft_parameters_billion: 1, draft_dtype: fp7}\n"
        )
        with pytest.raises(ConfigError, match=r"model\.draft_dtype: unknown dtype 'fp7'"):
            build_rulebook(load_settings(self.write(tmp_path, text)))

    def test_decode_remediation_by_term(self) -> None:
        texts = build_rulebook(load_settings()).decode_remediation
        assert set(texts) == {"weights", "kv", "draft", "compute", "serving_stack", "settings"}
        assert all(texts.values())

    def test_missing_config_json(self, tmp_path: Path) -> None:
        """A config.json that is not there is a ConfigError naming it."""
        with pytest.raises(ConfigError, match=r"nope\.json"):
            build_rulebook(
                load_settings(
                    self.write(tmp_path, "hardware: {gpu: a10g}\nmodel: {config_json: nope.json}\n")
                )
            )
