#!/usr/bin/env bash
# Thin wrapper kept for Primus users: EXP=path/to/exp.yaml bash examples/run_pretrain.sh [overrides]
set -euo pipefail
: "${EXP:?set EXP to an experiment file, e.g. EXP=examples/torchtitan/llama3_tiny-pretrain.yaml}"
PRIMUS="${PRIMUS:-$(dirname "$0")/../.venv/bin/primus}"
command -v "$PRIMUS" >/dev/null 2>&1 || PRIMUS=primus
exec "$PRIMUS" train "$EXP" "$@"
