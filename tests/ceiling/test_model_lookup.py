"""find_model: served names (vLLM's model_name label) to rows of rules/models.yaml, with
the suffixes that do not change the architecture and the ones that name a quantization;
anything else is unknown, never a near guess."""

from __future__ import annotations

import pytest

from vllm_triage.ceiling.models import find_model, model_facts


def found(name: str) -> str | None:
    hit = find_model(name)
    return hit[0].id if hit else None


@pytest.mark.parametrize(
    ("served", "model_id"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("META-LLAMA/llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("  Llama-3.1-8B-Instruct \n", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ("some-lab/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
        ("Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
        ("gemma-2-9b-it", "google/gemma-2-9b-it"),
        ("google/gemma-3-27b-pt", "google/gemma-3-27b-it"),
        ("gpt-oss-120b", "openai/gpt-oss-120b"),
        ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
        ("Phi-3.5-mini-instruct", "microsoft/Phi-3.5-mini-instruct"),
    ],
)
def test_ids_and_names(served: str, model_id: str) -> None:
    assert found(served) == model_id


@pytest.mark.parametrize(
    ("served", "model_id", "removed"),
    [
        ("Llama-3.1-8B-Chat", "meta-llama/Llama-3.1-8B-Instruct", ("chat",)),
        ("Llama-3.1-8B-hf", "meta-llama/Llama-3.1-8B-Instruct", ("hf",)),
        ("Llama-3.1-8B-Base", "meta-llama/Llama-3.1-8B-Instruct", ("base",)),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B", ("2507", "instruct")),
        ("Qwen3-235B-A22B-Thinking-2507", "Qwen/Qwen3-235B-A22B", ("2507", "thinking")),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1", ("0528",)),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3", ("0324",)),
        ("Mistral-7B-Chat-v0.3", "mistralai/Mistral-7B-Instruct-v0.3", ("chat",)),
    ],
    ids=lambda value: "+".join(value) if isinstance(value, tuple) else None,
)
def test_suffixes_that_keep_the_architecture(
    served: str, model_id: str, removed: tuple[str, ...]
) -> None:
    hit = find_model(served)
    assert hit is not None
    row, match = hit
    assert row.id == model_id
    assert match.removed == removed
    assert match.quantization is None
    assert "removed" in match.how


L8 = "meta-llama/Llama-3.1-8B-Instruct"
L70 = "meta-llama/Llama-3.1-70B-Instruct"
L33 = "meta-llama/Llama-3.3-70B-Instruct"
L3B = "meta-llama/Llama-3.2-3B-Instruct"
Q72 = "Qwen/Qwen2.5-72B-Instruct"
CT = "compressed-tensors"


@pytest.mark.parametrize(
    ("served", "model_id", "method", "width"),
    [
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8", L8, "fp8", 1),
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", L8, "fp8", 1),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-Dynamic", L33, "fp8", 1),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", "meta-llama/Llama-3.1-405B-Instruct", "fp8", 1),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "Qwen/Qwen3-30B-A3B", "fp8", 1),
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen2.5-7B-Instruct", "awq", 0.5),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", Q72, "gptq", 0.5),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8", Q72, "gptq", 1),
        ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", L70, "awq", 0.5),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", L8, CT, 0.5),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", L8, "w8a8_int8", 1),
        ("Llama-3.1-8B-Instruct-w4a16", L8, CT, 0.5),
        ("nvidia/Llama-3.3-70B-Instruct-NVFP4", L33, "nvfp4", 0.5),
        ("nvidia/DeepSeek-R1-FP4", "deepseek-ai/DeepSeek-R1", "nvfp4", 0.5),
        ("gpt-oss-20b-MXFP4", "openai/gpt-oss-20b", "mxfp4", 0.5),
        ("unsloth/Llama-3.2-3B-Instruct-bnb-4bit", L3B, "bitsandbytes", 0.5),
        ("unsloth/Llama-3.2-3B-Instruct-unsloth-bnb-4bit", L3B, "bitsandbytes", 0.5),
        ("Llama-3.1-8B-Instruct_FP8", L8, "fp8", 1),
    ],
)
def test_quantization_suffixes_set_the_weight_width(
    served: str, model_id: str, method: str, width: float
) -> None:
    hit = find_model(served)
    assert hit is not None
    row, match = hit
    assert row.id == model_id
    assert match.quantization is not None
    assert (match.quantization.method, match.quantization.bytes_per_weight) == (method, width)
    assert method in match.how


def test_the_quantization_reaches_the_sizing() -> None:
    """-AWQ makes Qwen2.5-72B's linear layers half a byte; its 16-bit tables stay 2 bytes."""
    row, match = find_model("Qwen/Qwen2.5-72B-Instruct-AWQ") or pytest.fail("not found")
    awq = model_facts(row, match)
    bf16 = model_facts(row)
    assert awq.size.dtype == "int4"
    assert 0.25 < awq.weight_bytes / bf16.weight_bytes < 0.32
    assert awq.size.weight_bytes_per_token < bf16.size.weight_bytes_per_token / 3
    assert awq.kv_bytes_per_token == bf16.kv_bytes_per_token


@pytest.mark.parametrize(
    ("served", "model_id"),
    [
        ("/models/llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        ("/models/Meta-Llama-3.1-70B-Instruct/", "meta-llama/Llama-3.1-70B-Instruct"),
        ("./weights/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen2.5-7B-Instruct"),
        ("~/checkpoints/gemma-2-27b-it", "google/gemma-2-27b-it"),
        ("/mnt/models/Qwen/Qwen3-32B", "Qwen/Qwen3-32B"),
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd",
            "Qwen/Qwen3-8B",
        ),
    ],
)
def test_local_paths_by_their_last_component(served: str, model_id: str) -> None:
    hit = find_model(served)
    assert hit is not None
    assert hit[0].id == model_id
    assert "local" in hit[1].how


@pytest.mark.parametrize(
    "served",
    [
        "Llama-3.1-9B",  # a size the table lacks: not the 8B
        "Llama-3.1-8B-Instruct-Turbo",  # an unknown word
        "meta-llama/Llama-3.1-70",  # truncated
        "Llama-3.2-11B-Vision-Instruct",  # another architecture of the family
        "Mistral-7B-Instruct-v0.2",  # another version (vocabulary 32,000, not 32,768)
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",  # a Llama under DeepSeek's name
        "Qwen3-8B-FP8-AWQ",  # two quantizations: refused rather than guessed
        "Qwen2.5-7B-Instruct-1M",  # a long-context variant
        "Qwen3-30B",  # the MoE without its A3B
        "gpt-oss",
        "llama",
        "FP8",
        "Instruct",
        "",
        "   ",
        "/",
        "/models/",
    ],
)
def test_unknown_names_are_none(served: str) -> None:
    assert find_model(served) is None


def test_how_says_what_was_matched() -> None:
    _, match = find_model("Llama-3.1-8B-Instruct") or pytest.fail()
    assert match.how == "name without an organisation"
    _, match = find_model("RedHatAI/Llama-3.1-8B-Instruct") or pytest.fail()
    assert match.how == "name, organisation 'RedHatAI' ignored"
    _, match = find_model("mistralai/Mistral-7B-v0.3") or pytest.fail()
    assert "alias" in match.how
    _, match = find_model("RedHatAI/Llama-3.1-8B-Instruct-FP8") or pytest.fail()
    assert match.how == "name with -fp8, -instruct removed (fp8: 1 byte per weight)"
