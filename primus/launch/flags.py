"""The launcher flags ``primus train`` and ``primus preflight`` share (they override the ``launcher:``
sections of ``~/.primus.yaml`` and ``./.primus.yaml``; ``executors.launcher_from_args`` reads them).
Only argparse here: ``primus --help`` stays fast."""
from __future__ import annotations

import argparse

from primus.config.values import count_flag, non_empty_flag


def node_count(text: str) -> int | tuple[int, int]:
    """``-N 4`` or, elastic as torchrun's ``--nnodes``, ``-N 2:4``."""
    low, sep, high = text.partition(":")
    if not sep:
        return count_flag(1)(text)
    counts = (count_flag(1)(low), count_flag(1)(high))
    if counts[0] > counts[1]:
        raise argparse.ArgumentTypeError(f"MIN:MAX needs MIN <= MAX (got {text!r})")
    return counts


def add_launcher_flags(parser: argparse.ArgumentParser, *, train: bool) -> None:
    """Executor flags shared by ``train`` and ``preflight`` (they override the ``launcher:`` files)."""
    group = parser.add_argument_group("launcher", "override the launcher: section of ~/.primus.yaml and "
                                                  "./.primus.yaml (or --launcher-config)")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--executor", choices=["local", "multi-node", "slurm", "srun", "container"],
                        help="how to run (default: container if an image is set, multi-node if NNODES > 1, else local)")
    choice.add_argument("--slurm", dest="executor", action="store_const", const="slurm",
                        help="submit a Slurm batch job (one task per node); extra sbatch flags after --")
    choice.add_argument("--srun", dest="executor", action="store_const", const="srun",
                        help="run as a job step inside an existing Slurm allocation")
    group.add_argument("--launcher-config", metavar="FILE", help="project launcher file (default ./.primus.yaml)")
    group.add_argument("--nproc-per-node", type=count_flag(1),
                       help="processes on this node (env GPUS_PER_NODE, default 1)")
    group.add_argument("-N", "--nnodes", "--nodes", dest="nnodes", type=node_count, metavar="N|MIN:MAX",
                       help="nodes in the job (env NNODES); MIN:MAX with --max-restarts: after a node is lost, "
                            "continue on the survivors (at least MIN) from the latest checkpoint")
    group.add_argument("--node-rank", type=count_flag(0), help="this node's rank (env NODE_RANK, default 0)")
    group.add_argument("--master-addr", type=non_empty_flag, help="rendezvous host = node 0 (env MASTER_ADDR)")
    group.add_argument("--master-port", type=count_flag(1, 65535), help="rendezvous port (env MASTER_PORT)")
    group.add_argument("--rdzv-id", help="rendezvous / attempt id shared by all nodes (env PRIMUS_JOB_ID)")
    group.add_argument("--rdzv-timeout", type=count_flag(1), help="seconds for every node to join (default 300)")
    group.add_argument("--rdzv-last-call", type=count_flag(1),
                       help="elastic (-N MIN:MAX): seconds a restart waits for more nodes once MIN have joined "
                            "(default 30)")
    group.add_argument("--local-addr", help="this node's address for worker traffic (default: its hostname)")
    group.add_argument("--partition", help="Slurm partition")
    group.add_argument("--time", help="Slurm time limit")
    group.add_argument("--account", help="Slurm account")
    group.add_argument("--gpus-per-node", type=count_flag(1), help="Slurm GPUs per node (also processes per node)")
    group.add_argument("--container", metavar="IMAGE", help="run inside this image (docker, podman or apptainer)")
    group.add_argument("--container-engine", choices=["auto", "docker", "podman", "apptainer"])
    group.add_argument("--container-python", metavar="PY",
                       help="the image's own interpreter (e.g. python3): Primus is installed into it with "
                            "pip install --no-deps -e at start, keeping the image's torch")
    group.add_argument("--container-env-secrets", action="store_const", const=True,
                       help="also pass *_TOKEN/*_KEY/*_SECRET/*PASSWORD* variables into the container")
    if train:
        group.add_argument("--max-restarts", type=count_flag(0),
                           help="restart failed workers up to K times (torchelastic); they resume from the latest "
                                "checkpoint")
        group.add_argument("--no-shared-fs", dest="shared_fs", action="store_const", const=False,
                           help="nodes > 0 write their own copy of the run dir instead of waiting for node 0's")
        group.add_argument("--run-dir-timeout", type=count_flag(1),
                           help="seconds a node > 0 waits for node 0's run dir")
