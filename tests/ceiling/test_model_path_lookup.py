"""A served model path names its model by where it ends (daemon/vllm_triage/ceiling/models.py).

Before: a Hugging Face cache folder anywhere in a path picked that model's row over the
path's last component: a fine-tune kept under another model's cache folder was sized as
that other model (its weights, its KV bytes per token, its ceiling)."""

from __future__ import annotations

import pytest

from vllm_triage.ceiling.models import find_model

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"


@pytest.mark.parametrize(
    ("served", "row"),
    [
        # The cache's own layouts: the folder, or the folder and snapshots/<revision>.
        (f"/hub/models--{LLAMA.replace('/', '--')}", LLAMA),
        (
            f"/root/.cache/huggingface/hub/models--{LLAMA.replace('/', '--')}/snapshots/0e9e39f",
            LLAMA,
        ),
        # A cache folder higher up is a place, not the model.
        (f"/data/models--{LLAMA.replace('/', '--')}/finetunes/Qwen3-32B", QWEN),
        (f"/data/models--{QWEN.replace('/', '--')}/snapshots/abc/Llama-3.1-8B-Instruct", LLAMA),
        (f"/srv/models--{LLAMA.replace('/', '--')}/my-own-model", None),
    ],
)
def test_the_path_names_its_model_by_where_it_ends(served: str, row: str | None) -> None:
    found = find_model(served)
    assert (found[0].id if found else None) == row, found
