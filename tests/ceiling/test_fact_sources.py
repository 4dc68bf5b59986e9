"""What the assembly knows of each roofline fact and where it came from: the card's
figures from the settings or rules/gpus.yaml, the model's from the settings, a
config.json or the bundled model table by the served name (the settings' keys win), in
the sidecar and in fleet mode (``docs/physics.md``, "Where each fact comes from")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage.assemble import build_evaluator, build_hardware_resolver, model_rulebooks
from vllm_triage.ceiling.resolve import build_roofline, card_facts, table_model
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.rulebook import Rulebook, Source

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs"


def settings(tmp_path: Path, **doc: Any) -> Settings:
    path = tmp_path / "triage.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_settings(path)


def served(s: Settings, name: str) -> Rulebook:
    base = build_evaluator(s).rulebook
    rulebook_for = model_rulebooks(s, base)
    assert rulebook_for is not None
    return rulebook_for(name)


class TestCard:
    def test_the_row_gives_bandwidth_compute_and_memory(self) -> None:
        card = card_facts("h100")
        assert (card.name, card.bandwidth_gb_s, card.memory_gb) == ("NVIDIA H100 SXM", 3350, 80)
        assert str(card.sources["bandwidth"]) == "gpu table (NVIDIA H100 SXM)"
        assert str(card.sources["compute"]) == "gpu table (NVIDIA H100 SXM, bf16 dense)"

    def test_the_settings_figures_win(self) -> None:
        card = card_facts("h100", 3000, 500)
        assert (card.bandwidth_gb_s, card.compute_tflops) == (3000, 500)
        assert card.sources["bandwidth"] == Source("settings", "hardware.memory_bandwidth_gb_s")
        assert card.memory_gb == 80  # the row's still: no setting holds it

    def test_no_card_no_roofline(self) -> None:
        assert build_roofline(card_facts(None), table_model(LLAMA)) is None


class TestServedModel:
    def test_a_card_alone_takes_the_model_from_the_table(self, tmp_path: Path) -> None:
        rules = served(settings(tmp_path, hardware={"gpu": "H100"}), LLAMA)
        hw = rules.roofline
        assert hw is not None and rules.ceiling is not None
        assert hw.weight_bytes == pytest.approx(15.0e9, rel=0.01)  # no input table read
        assert (hw.kv_bytes_per_token, hw.kv_split, hw.kv_in_model_dtype) == (131072, 8, True)
        assert hw.resident_weight_bytes == pytest.approx(16.06e9, rel=0.01)
        assert hw.memory_gb == 80
        assert hw.sources["weights"] == Source("model table", LLAMA)
        assert rules.provenance["model_source"] == f"rules/models.yaml: {LLAMA} (Hugging Face id)"

    def test_a_count_keeps_its_weights_and_takes_the_kv_layout(self, tmp_path: Path) -> None:
        s = settings(tmp_path, hardware={"gpu": "H100"}, model={"parameters_billion": 8.03})
        hw = served(s, LLAMA).roofline
        assert hw is not None
        assert hw.weight_bytes == pytest.approx(16.06e9)
        assert hw.sources["weights"].kind == "settings"
        assert hw.sources["kv_bytes_per_token"] == Source("model table", LLAMA)
        assert str(served(s, LLAMA).provenance["model_source"]).startswith("settings; its KV")

    def test_a_quantized_name_is_that_wide(self, tmp_path: Path) -> None:
        hw = served(settings(tmp_path, hardware={"gpu": "H100"}), "Qwen/Qwen3-8B-FP8").roofline
        assert hw is not None and hw.weight_bytes is not None
        assert hw.weight_bytes < 9e9  # 8.2B parameters, one byte each (embeddings at two)

    def test_an_unknown_name_is_said_never_guessed(self, tmp_path: Path) -> None:
        rules = served(settings(tmp_path, hardware={"gpu": "H100"}), "meta-llama/Llama-3.1-9B")
        assert rules.roofline is not None and rules.roofline.weight_bytes is None
        assert str(rules.provenance["model_source"]).startswith(
            "unknown: 'meta-llama/Llama-3.1-9B' is in no model table"
        )

    @pytest.mark.parametrize(
        "model",
        [
            {"parameters_billion": 8.03, "kv_bytes_per_token": 131072},
            {"config_json": str(CONFIGS / "llama-3.1-8b.json")},
        ],
        ids=["count-and-kv", "config-json"],
    )
    def test_settings_that_say_it_all_keep_the_table_out(
        self, tmp_path: Path, model: dict[str, Any]
    ) -> None:
        s = settings(tmp_path, hardware={"gpu": "H100"}, model=model)
        assert model_rulebooks(s, build_evaluator(s).rulebook) is None

    def test_config_json_is_its_own_source(self, tmp_path: Path) -> None:
        path = CONFIGS / "llama-3.1-8b.json"
        s = settings(tmp_path, hardware={"gpu": "H100"}, model={"config_json": str(path)})
        hw = build_evaluator(s).rulebook.roofline
        assert hw is not None
        assert hw.sources["kv_bytes_per_token"] == Source("config.json", path.name)
        assert hw.kv_in_model_dtype


class TestFleet:
    def resolver(self, tmp_path: Path, **prometheus: Any) -> Any:
        s = settings(
            tmp_path,
            source="prometheus",
            prometheus={"url": "http://127.0.0.1:9", **prometheus},
            hardware={"gpu": "H100"},
        )
        return build_hardware_resolver(s)

    def test_the_table_where_prometheus_models_has_no_entry(self, tmp_path: Path) -> None:
        r = self.resolver(tmp_path)
        rules = r.resolve({"pod": "a"}, LLAMA, None)
        assert rules.roofline is not None and rules.roofline.kv_bytes_per_token == 131072
        assert rules.provenance["model_source"] == f"rules/models.yaml: {LLAMA} (Hugging Face id)"

    def test_prometheus_models_wins(self, tmp_path: Path) -> None:
        r = self.resolver(tmp_path, models={LLAMA: {"parameters_billion": 8.03}})
        rules = r.resolve({"pod": "a"}, LLAMA, None)
        assert rules.provenance["model_source"] == "model table"
        assert rules.roofline is not None and rules.roofline.kv_bytes_per_token is None

    def test_an_unknown_name(self, tmp_path: Path) -> None:
        rules = self.resolver(tmp_path).resolve({"pod": "a"}, "acme/bot", None)
        assert str(rules.provenance["model_source"]).startswith("unknown: 'acme/bot'")
