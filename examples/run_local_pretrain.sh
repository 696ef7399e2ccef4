#!/usr/bin/env bash
# Thin wrapper kept for Primus users: train in a container image on this node (the blog's flow).
#   export DOCKER_IMAGE=rocm/primus:v25.9_gfx942   # or IMAGE=...
#   export HF_TOKEN=...                           # passed into the container by name, never by value
#   EXP=examples/megatron/llama3.1_8B-pretrain.yaml bash examples/run_local_pretrain.sh [overrides] [--dry-run]
# == primus train $EXP --container $DOCKER_IMAGE --container-python python3: the image's own Python and
#    ROCm torch run it (Primus is installed into the image with pip install --no-deps -e at start);
#    docker, podman or apptainer, whichever is found. NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT make this
#    node part of a multi-node job; ROCm/NCCL/RCCL/HSA tuning variables (USE_HIPBLASLT, NCCL_*, ...) are
#    forwarded (launcher.container.forward_env in .primus.yaml). CONTAINER_PYTHON= (empty) runs this
#    host's venv inside the image instead.
set -euo pipefail
: "${EXP:?set EXP to an experiment file}"
IMAGE="${DOCKER_IMAGE:-${IMAGE:-}}"
: "${IMAGE:?set DOCKER_IMAGE (or IMAGE) to a container image, e.g. DOCKER_IMAGE=rocm/primus:latest}"
PRIMUS="${PRIMUS:-$(dirname "$0")/../.venv/bin/primus}"
command -v "$PRIMUS" >/dev/null 2>&1 || PRIMUS=primus
CONTAINER_PYTHON="${CONTAINER_PYTHON-python3}"
exec "$PRIMUS" train "$EXP" --container "$IMAGE" ${CONTAINER_PYTHON:+--container-python "$CONTAINER_PYTHON"} "$@"
