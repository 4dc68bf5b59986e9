"""Make a tiny Llama-architecture model for vLLM, with no hub access.

Run with the vLLM environment's Python (it has torch, safetensors and tokenizers):

    .vllm-venv/bin/python tests/system/realvllm/make_model.py DIR

Writes DIR/config.json (4 layers, hidden 512, 8 attention heads, 2 KV heads: grouped-query
attention as in Llama 3; 4,096 KV bytes per token in float32), DIR/tokenizer.json trained
here with the `tokenizers` library on text that ships with Python itself, and
DIR/model.safetensors with random weights (seeded). The model talks nonsense, quickly:
what the tests need is vLLM's scheduler, KV cache and metrics doing real work, not
sensible text.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2048
# Big enough that a decode step's compute grows visibly with the batch on a 2-core CPU
# (about 11M parameters), small enough to start in seconds.
HIDDEN = 512
LAYERS = 4
HEADS = 8
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 1024
MAX_POSITIONS = 16384


def corpus() -> list[str]:
    """Local text to train the tokenizer on: the standard library's own sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [
        p.read_text(encoding="utf-8", errors="ignore") for p in sorted(stdlib.glob("*.py"))[:80]
    ]


def make_tokenizer(out: Path) -> None:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": MAX_POSITIONS,
            },
            indent=2,
        )
    )


def make_config(out: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def make_weights(out: Path) -> None:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN),
        "model.norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"))


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    make_config(out)
    make_tokenizer(out)
    make_weights(out)
    print(f"tiny model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
