"""The model table (rules/models.yaml): every row sizes to its published parameter counts,
KV bytes per token match hand arithmetic, and the quantization table holds vLLM's widths."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_triage.ceiling.model_table import (
    ModelRow,
    load_model_table,
    parse_model_table,
)
from vllm_triage.ceiling.models import build_index, find_model, model_facts
from vllm_triage.ceiling.sizing import model_size_from_config
from vllm_triage.errors import ConfigError
from vllm_triage.rules import read_bundled

ROWS = load_model_table().rows


def row(model_id: str) -> ModelRow:
    return next(r for r in ROWS if r.id == model_id)


def test_the_table_holds_the_most_served_models() -> None:
    ids = {r.id for r in ROWS}
    assert len(ids) == len(ROWS) >= 29
    for wanted in (
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-405B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen3-30B-A3B",
        "Qwen/Qwen3-235B-A22B",
        "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mixtral-8x22B-Instruct-v0.1",
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "google/gemma-2-27b-it",
        "google/gemma-3-12b-it",
        "microsoft/Phi-3.5-mini-instruct",
        "microsoft/phi-4",
        "openai/gpt-oss-120b",
    ):
        assert wanted in ids


@pytest.mark.parametrize("r", ROWS, ids=lambda r: r.id)
def test_row_cites_its_config_json(r: ModelRow) -> None:
    assert r.source == f"https://huggingface.co/{r.id}/blob/main/config.json"
    assert r.parameters_source.startswith("https://")


@pytest.mark.parametrize("r", ROWS, ids=lambda r: r.id)
def test_row_sizes_to_its_published_total(r: ModelRow) -> None:
    """The sized parameters are within 3 % of the published total (less the vision
    encoder of a multimodal row, which the sizing leaves out)."""
    size = model_size_from_config(r.sizing_config())
    published = r.total_parameters - (r.vision_parameters or 0.0)
    assert size.parameters == pytest.approx(published, rel=0.03)


MOE = [r for r in ROWS if r.active_parameters is not None]


@pytest.mark.parametrize("r", MOE, ids=lambda r: r.id)
def test_moe_row_sizes_to_its_published_active_count(r: ModelRow) -> None:
    """Publishers differ on the input embedding table (Qwen and Mistral count it, OpenAI
    does not): the active count matches within 3 % one way or the other."""
    facts = model_facts(r)
    assert facts.experts > facts.experts_per_token > 0
    with_table = facts.active_parameters + facts.hidden_size * int(
        r.sizing_config().get("vocab_size", 0)
    )
    assert r.active_parameters is not None
    near = [abs(a / r.active_parameters - 1) for a in (facts.active_parameters, with_table)]
    assert min(near) < 0.03, (facts.active_parameters, with_table)


def test_the_moe_rows_are_the_mixtures() -> None:
    dense = {r.id for r in ROWS if r.active_parameters is None}
    for r in ROWS:
        assert (model_facts(r).experts > 0) == (r.id not in dense), r.id


@pytest.mark.parametrize(
    ("model_id", "active", "total", "counts_input_table"),
    [
        ("Qwen/Qwen3-30B-A3B", 3.3e9, 30.5e9, True),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 12.9e9, 46.7e9, True),
        ("deepseek-ai/DeepSeek-V3", 37e9, 671e9, False),
        ("openai/gpt-oss-120b", 5.13e9, 116.8e9, False),
    ],
)
def test_headline_moe_counts(
    model_id: str, active: float, total: float, counts_input_table: bool
) -> None:
    """What one token multiplies through against what the model holds, counted as the
    publisher counts it (Qwen's 3.3B and Mistral's 12.9B include the input embedding
    table a token only looks a row up in)."""
    r = row(model_id)
    facts = model_facts(r)
    table = facts.hidden_size * r.sizing_config()["vocab_size"] if counts_input_table else 0
    assert facts.parameters == pytest.approx(total, rel=0.01)
    assert facts.active_parameters + table == pytest.approx(active, rel=0.02)
    assert facts.active_parameters < total / 3


@pytest.mark.parametrize(
    ("model_id", "kv"),
    [
        # 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes
        ("meta-llama/Llama-3.1-8B-Instruct", 2 * 32 * 8 * 128 * 2),
        # 2 x 80 x 8 x 128 x 2
        ("meta-llama/Llama-3.1-70B-Instruct", 2 * 80 * 8 * 128 * 2),
        # latent attention: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes
        ("deepseek-ai/DeepSeek-V3", (512 + 64) * 61 * 2),
        # 2 x 16 layers x 8 KV heads x head_dim 64 (given, not 2048 / 32) x 2
        ("meta-llama/Llama-3.2-1B-Instruct", 2 * 16 * 8 * 64 * 2),
        # 2 x 48 x 4 KV heads x head_dim 128 (given; 2048 / 32 would be 64) x 2
        ("Qwen/Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2),
        # 2 x 28 x 4 x (3584 / 28 = 128) x 2
        ("Qwen/Qwen2.5-7B-Instruct", 2 * 28 * 4 * 128 * 2),
        # multimodal: text_config's 48 layers x 8 KV heads x head_dim 256
        ("google/gemma-3-12b-it", 2 * 48 * 8 * 256 * 2),
    ],
)
def test_kv_bytes_per_token_by_hand(model_id: str, kv: int) -> None:
    assert model_facts(row(model_id)).kv_bytes_per_token == kv


def test_kv_facts_name_the_cache_shape() -> None:
    llama = model_facts(row("meta-llama/Llama-3.1-8B-Instruct"))
    assert (llama.layers, llama.kv_heads, llama.head_size, llama.hidden_size) == (32, 8, 128, 4096)
    assert not llama.latent_kv
    assert llama.kv_bytes_per_token == 2 * llama.layers * llama.kv_heads * llama.head_size * 2
    ds = model_facts(row("deepseek-ai/DeepSeek-V3"))
    assert ds.latent_kv and (ds.kv_heads, ds.head_size) == (1, 576)
    assert ds.kv_bytes_per_token == ds.layers * ds.head_size * 2


def test_fp8_kv_cache_halves_the_16_bit_figure() -> None:
    r = row("meta-llama/Llama-3.1-70B-Instruct")
    assert model_facts(r, kv_cache_dtype="fp8").kv_bytes_per_token == 327680 // 2
    assert model_facts(r, kv_cache_dtype="fp8_e5m2").kv_bytes_per_token == 327680 // 2
    assert model_facts(r, kv_cache_dtype="auto").kv_bytes_per_token == 327680


def test_tensor_parallel_splits_kv_heads_but_not_a_latent_cache() -> None:
    llama70 = model_facts(row("meta-llama/Llama-3.1-70B-Instruct"))
    assert llama70.kv_bytes_per_token_per_gpu(4) == 327680 / 4
    # 8 KV heads over 16 GPUs: one head each, replicated.
    assert llama70.kv_bytes_per_token_per_gpu(16) == 327680 / 8
    ds = model_facts(row("deepseek-ai/DeepSeek-V3"))
    assert ds.kv_bytes_per_token_per_gpu(8) == 70272
    with pytest.raises(ValueError):
        ds.kv_bytes_per_token_per_gpu(0)


@pytest.mark.parametrize(
    "model_id",
    ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B", "google/gemma-2-9b-it"],
)
def test_resident_weights_of_a_16_bit_model_are_two_bytes_a_parameter(model_id: str) -> None:
    """Resident bytes count the input embedding table that a step does not read."""
    facts = model_facts(row(model_id))
    assert facts.weight_bytes == pytest.approx(2 * facts.parameters)
    assert facts.weight_bytes_per_gpu(2) == pytest.approx(facts.parameters)
    assert facts.size.weight_bytes_per_token <= facts.weight_bytes


def test_resident_weights_of_a_moe_hold_every_expert() -> None:
    facts = model_facts(row("Qwen/Qwen3-30B-A3B"))
    assert facts.weight_bytes == pytest.approx(2 * facts.parameters)
    assert facts.size.weight_bytes_per_token < facts.weight_bytes / 5


def test_published_quantized_checkpoints_size_at_their_width() -> None:
    """DeepSeek-V3 ships FP8 and gpt-oss MXFP4: the rows' own quantization_config sets it."""
    ds = model_facts(row("deepseek-ai/DeepSeek-V3"))
    assert ds.size.dtype == "fp8"
    assert ds.weight_bytes == pytest.approx(ds.parameters, rel=0.02)  # ~1 byte each
    oss = model_facts(row("openai/gpt-oss-120b"))
    assert oss.size.dtype == "int4"
    assert oss.weight_bytes / 1e9 == pytest.approx(60, rel=0.1)


def test_config_defaults_fill_gaps_and_never_override() -> None:
    gemma3 = row("google/gemma-3-27b-it")
    assert "vocab_size" not in gemma3.config["text_config"]
    text = gemma3.sizing_config()["text_config"]
    assert text["vocab_size"] == 262208 and text["tie_word_embeddings"] is True
    entry = _entry(
        config={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        },
        config_defaults={"vocab_size": 999, "tie_word_embeddings": True},
    )
    [parsed] = parse_model_table(_table(entry)).rows
    assert parsed.sizing_config()["vocab_size"] == 100
    assert parsed.sizing_config()["tie_word_embeddings"] is True
    # The row's own mapping is read-only and a sizing copy does not leak back into it.
    parsed.sizing_config()["vocab_size"] = 5
    assert parsed.config["vocab_size"] == 100
    with pytest.raises(TypeError):
        parsed.config["vocab_size"] = 5  # type: ignore[index]


#: vLLM's MFU estimator's weight widths (vllm/v1/metrics/perf.py), and the extra names
#: this table gives for schemes its methods leave to a config (w8a8 int8, 8-bit bnb).
VLLM_WIDTHS = {
    "fp8": 1, "fbgemm_fp8": 1, "ptpc_fp8": 1, "modelopt": 1, "modelopt_mxfp8": 1,
    "experts_int8": 1, "mxfp4": 0.5, "awq": 0.5, "awq_marlin": 0.5, "gptq": 0.5,
    "gptq_marlin": 0.5, "modelopt_fp4": 0.5, "petit_nvfp4": 0.5, "compressed-tensors": 0.5,
    "torchao": 0.5, "quark": 0.5, "moe_wna16": 0.5, "inc": 0.5,
}  # fmt: skip


def test_quantization_table_matches_vllms_widths() -> None:
    methods = load_model_table().quantization
    for method, width in VLLM_WIDTHS.items():
        assert methods[method].bytes_per_weight == width, method
    assert methods["nvfp4"].bytes_per_weight == 0.5
    assert methods["bitsandbytes"].bytes_per_weight == 0.5
    assert methods["w8a8_int8"].bytes_per_weight == 1


def test_quantized_row_sizes_at_the_methods_width() -> None:
    r, match = find_model("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8") or pytest.fail("not found")
    fp8 = model_facts(r, match)
    bf16 = model_facts(r)
    assert fp8.quantization is not None and fp8.quantization.method == "fp8"
    # Linear layers at 1 byte, the 1.05B-parameter embedding and LM head tables at 2.
    tables = 2 * 128256 * 8192
    assert fp8.weight_bytes == pytest.approx(bf16.weight_bytes / 2 + tables, rel=1e-4)
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token  # weights only


# --- the table's own checks -----------------------------------------------------------------


def _entry(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "org/Tiny-1B",
        "source": "https://huggingface.co/org/Tiny-1B/blob/main/config.json",
        "parameters_source": "https://example.org",
        "total_parameters_billion": 1.0,
        "config": row("meta-llama/Llama-3.2-1B-Instruct").sizing_config(),
    }
    return {**base, **over}


def _table(*models: dict[str, Any], **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "quantization": [{"method": "fp8", "bytes_per_weight": 1, "format": "fp8"}],
        "name_suffixes": [{"suffix": "FP8", "method": "fp8"}],
        "neutral_suffixes": ["Instruct"],
        "models": list(models),
    }
    return {**base, **over}


def test_the_bundled_table_parses_as_it_loads() -> None:
    assert len(parse_model_table(read_bundled("models.yaml")).rows) == len(ROWS)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (_table(_entry(total_parameters_billion="1")), r"models\[0\] \('org/Tiny-1B'\)"),
        (_table(_entry(id="no-organisation")), r"models\[0\].*id"),
        (_table(_entry(typo=1)), r"typo"),
        (_table(_entry(config={"hidden_size": 8})), r"'org/Tiny-1B'.*missing required key"),
        (
            _table(
                _entry(), quantization=[{"method": "x", "bytes_per_weight": 1, "format": "int4"}]
            ),
            r"quantization\[0\].*width",
        ),
        (
            _table(_entry(), name_suffixes=[{"suffix": "Q", "method": "nope"}]),
            r"name_suffixes\[0\].*unknown method 'nope'",
        ),
        (_table(_entry(), neutral_suffixes=["two-words"]), r"neutral_suffixes"),
        (_table(), r"models"),
    ],
    ids=["quoted-number", "bad-id", "unknown-key", "unsizable", "width", "method", "word", "empty"],
)
def test_bad_tables_are_refused_naming_the_entry(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^rules/models\.yaml: .*" + message):
        parse_model_table(table)


def test_a_name_two_rows_claim_is_refused() -> None:
    """Two rows whose names reduce to one stem (Tiny-1B and Tiny-1B-Instruct) are ambiguous."""
    table = parse_model_table(_table(_entry(), _entry(id="other/Tiny-1B-Instruct")))
    with pytest.raises(ConfigError, match="'tiny-1b' names both"):
        build_index(table)


def test_a_row_named_with_a_quantization_suffix_is_refused() -> None:
    table = parse_model_table(_table(_entry(id="org/Tiny-1B-FP8")))
    with pytest.raises(ConfigError, match="quantization suffix"):
        build_index(table)


def test_the_bundled_index_builds() -> None:
    index = build_index(load_model_table())
    assert len(index.ids) > len(ROWS)  # aliases too
