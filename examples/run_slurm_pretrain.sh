#!/usr/bin/env bash
# Thin wrapper kept for Primus users: submit a Slurm job, one task per node.
#   EXP=examples/torchtitan/llama3_70B-pretrain.yaml NNODES=4 bash examples/run_slurm_pretrain.sh [overrides] [-- sbatch flags]
# == primus train $EXP --slurm -N $NNODES (add IMAGE=... to run every node in a container)
set -euo pipefail
: "${EXP:?set EXP to an experiment file}"
PRIMUS="${PRIMUS:-$(dirname "$0")/../.venv/bin/primus}"
command -v "$PRIMUS" >/dev/null 2>&1 || PRIMUS=primus
exec "$PRIMUS" train "$EXP" --slurm -N "${NNODES:-1}" ${IMAGE:+--container "$IMAGE"} "$@"
