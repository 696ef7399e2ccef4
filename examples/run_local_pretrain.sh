#!/usr/bin/env bash
# Thin wrapper kept for Primus users: train in a container on this node.
#   EXP=examples/torchtitan/llama3_tiny-pretrain.yaml IMAGE=rocm/primus:latest bash examples/run_local_pretrain.sh [overrides]
# == primus train $EXP --container $IMAGE (engine: docker, podman or apptainer, whichever is found;
#    NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT make this node part of a multi-node job)
set -euo pipefail
: "${EXP:?set EXP to an experiment file}"
: "${IMAGE:?set IMAGE to a container image, e.g. IMAGE=rocm/primus:latest}"
PRIMUS="${PRIMUS:-$(dirname "$0")/../.venv/bin/primus}"
command -v "$PRIMUS" >/dev/null 2>&1 || PRIMUS=primus
exec "$PRIMUS" train "$EXP" --container "$IMAGE" "$@"
