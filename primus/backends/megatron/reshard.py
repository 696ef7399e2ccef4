"""Resuming a Megatron checkpoint at another parallel layout: what may change, and what may not.

megatron-core's ``dist_checkpointing`` (``ckpt_format: torch_dist``) stores every tensor under its
global name and shape, so a checkpoint loads at any tensor, pipeline, expert or data-parallel size
(TP2·DP1 → TP1·DP2, PP2 → PP1, EP2 → EP1), the optimizer's moments with it. What does not
reshard, Megatron-LM's ``load_checkpoint`` refuses or skips, and so does Primus, before any rank
starts (``resume_problem``, one line):

- Megatron-LM's legacy files (``ckpt_format: torch``) hold each model-parallel rank's slices: the
  run's TP, PP and EP must be the checkpoint's;
- the distributed optimizer's state (Megatron-LM's default ``dp_reshardable`` form, the one saved
  here) is laid out per (TP, PP, EP) rank: only the data-parallel size may change (``no_load_optim``
  loads the weights alone); nor does a distributed optimizer's state load into the plain optimizer
  or back. The plain optimizer's moments are sharded tensors like the weights: they reshard;
- the RNG streams are one per (PP, TP) rank: at another TP or PP they are not restored (Megatron-LM:
  "RNG state will be ignored"), which changes nothing for a model without dropout.

Each ``torch_dist`` checkpoint Primus writes records the layout that wrote it (``parallel_layout`` in
its ``common.pt``) and, as Megatron-LM does, the optimizer's sharding type (``content_metadata``).
For a checkpoint without the record, TP and PP are read from its RNG objects' names
(``rng_state/shard_<pp>.<tp>_<PP>.<TP>``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError

LAYOUT_KEY = "parallel_layout"
SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")
SHORT = {"tensor_model_parallel_size": "TP", "pipeline_model_parallel_size": "PP",
         "expert_model_parallel_size": "EP", "data_parallel_size": "DP"}
_RNG_KEY = re.compile(r"^rng_state/shard_\d+\.\d+_(\d+)\.(\d+)$")
_LEGACY_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


def run_layout(args, world_size: int | None) -> dict[str, Any]:
    """The layout a run with ``args`` has on ``world_size`` ranks, in Megatron-LM's argument names."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    layout = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
              "expert_model_parallel_size": args.expert_model_parallel_size,
              "use_distributed_optimizer": bool(args.use_distributed_optimizer)}
    if world_size:
        layout.update(world_size=world_size, data_parallel_size=world_size // (tp * pp))
    return layout


def describe(layout: dict[str, Any]) -> str:
    """``TP2·PP1·EP1·DP1``: the sizes a layout has (those it records)."""
    return "·".join(f"{SHORT[key]}{layout[key]}" for key in (*SIZES, "data_parallel_size") if key in layout)


def legacy_grid(layout: dict[str, Any]) -> list[int]:
    """The ``mp_rank_TT[_PPP][_EEE]`` directory grid a layout writes (Megatron-LM's ``get_checkpoint_name``:
    ``_PPP`` only with pipeline parallelism, ``_EEE`` only with expert parallelism)."""
    tp, pp, ep = (layout.get(key, 1) for key in SIZES)
    return [tp] + ([pp] if pp > 1 else []) + ([ep] if ep > 1 else [])


def _legacy_layout(source: Path) -> dict[str, Any] | None:
    grid = [tuple(int(g) for g in match.groups() if g is not None)
            for match in map(_LEGACY_DIR.match, (p.name for p in source.iterdir())) if match]
    if not grid:
        return None
    sizes = [max(r[i] for r in grid) + 1 for i in range(len(grid[0]))]
    return {"ckpt_format": "torch", "rank_grid": sizes, "tensor_model_parallel_size": sizes[0],
            "use_distributed_optimizer": any(source.glob("mp_rank_*/distrib_optim.pt"))}


def _torch_dist_layout(source: Path) -> dict[str, Any] | None:
    import torch

    common = source / "common.pt"
    recorded: dict[str, Any] = {}
    if common.is_file():
        try:
            state = torch.load(common, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a foreign common.pt (Megatron-LM's pickled args): no record
            state = {}
        recorded = dict(state.get(LAYOUT_KEY) or {})
        sharding = (state.get("content_metadata") or {}).get("distrib_optim_sharding_type")
        if sharding and recorded:
            recorded["distrib_optim_sharding_type"] = sharding
    if recorded:
        return {"ckpt_format": "torch_dist", **recorded}
    try:
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(str(source)).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001 - verified before resuming; nothing to say here
        return None
    for key in keys:
        match = _RNG_KEY.match(key)
        if match:
            return {"ckpt_format": "torch_dist", "pipeline_model_parallel_size": int(match.group(1)),
                    "tensor_model_parallel_size": int(match.group(2))}
    return None


def saved_layout(source: Path) -> dict[str, Any] | None:
    """The layout that wrote the checkpoint directory ``source`` (``iter_NNNNNNN``), as far as it says."""
    from primus.backends.megatron import fsdp, legacy_checkpoint

    source = Path(source)
    if not source.is_dir() or fsdp.is_fsdp_dtensor(source):  # Megatron-FSDP's DCP checkpoint reshards itself
        return None
    if legacy_checkpoint.is_legacy(source):
        return _legacy_layout(source)
    return _torch_dist_layout(source)


def changed(saved: dict[str, Any], run: dict[str, Any], keys=SIZES) -> list[str]:
    """``TP 2 -> 1``-style phrases for the sizes that differ (those both layouts know)."""
    return [f"{SHORT[k]} {saved[k]} -> {run[k]}" for k in keys if k in saved and k in run and saved[k] != run[k]]


def resume_problem(source: Path, run: dict[str, Any], *, load_optimizer: bool) -> str | None:
    """Why the checkpoint at ``source`` cannot be resumed at the ``run`` layout (None: it can)."""
    saved = saved_layout(source)
    if saved is None:
        return None
    moved = changed(saved, run)
    was = f"{source} was written at {describe(saved)}, this run is {describe(run)}"
    if saved["ckpt_format"] == "torch" and saved["rank_grid"] != legacy_grid(run):
        grid = lambda sizes: " x ".join(map(str, sizes))  # noqa: E731
        return (f"{source} holds a {grid(saved['rank_grid'])} grid of mp_rank_* directories, this run's layout "
                f"({describe(run)}) reads a {grid(legacy_grid(run))} grid: Megatron-LM's legacy checkpoints "
                "(ckpt_format: torch) hold each rank's slices and are not resharded; resume at the checkpoint's "
                "tensor / pipeline / expert sizes, or resume it there once with ckpt_format: torch_dist, which reshards")
    if not load_optimizer or "use_distributed_optimizer" not in saved:
        return None
    if saved["use_distributed_optimizer"] != run["use_distributed_optimizer"]:
        kinds = {True: "the distributed optimizer", False: "the plain optimizer"}
        return (f"{source} holds the state of {kinds[saved['use_distributed_optimizer']]}, this run uses "
                f"{kinds[run['use_distributed_optimizer']]} (use_distributed_optimizer: "
                f"{str(saved['use_distributed_optimizer']).lower()} to resume it; no_load_optim: true loads the "
                "weights only)")
    sharding = saved.get("distrib_optim_sharding_type", "dp_reshardable")
    if saved["use_distributed_optimizer"] and moved:
        return (f"{was}: its distributed-optimizer state ({sharding}) reshards over data parallelism only "
                f"({', '.join(moved)}); resume at {describe({k: saved[k] for k in SIZES if k in saved})}, or set "
                "no_load_optim: true to load the weights only (the plain optimizer's state reshards)")
    return None


def rng_restorable(source: Path, run: dict[str, Any]) -> bool:
    """Megatron-LM restores the RNG streams only at the checkpoint's (TP, PP)."""
    saved = saved_layout(source)
    return saved is None or not changed(saved, run, SIZES[:2])


def problem_for_run(args, world_size: int | None, root: Path | None) -> str | None:
    """``resume_problem`` for the checkpoint a run with ``args`` would load from ``root`` (its tracker's
    iteration, or the newest whole one before it); None where there is none, or nothing to refuse."""
    from primus.backends.megatron.checkpoint import iteration_dir, latest_iteration
    from primus.runtime.checkpoints import newest_usable

    iteration = latest_iteration(root)
    if not iteration:
        return None  # nothing saved yet, or a converted model (release: weights only, whatever wrote it)
    iteration = newest_usable(root, "megatron", at_most=iteration, warn=lambda _message: None)
    if iteration is None:
        return None
    load_optimizer = not (args.finetune or args.no_load_optim)
    return resume_problem(iteration_dir(root, iteration), run_layout(args, world_size), load_optimizer=load_optimizer)


def load_regrouped_optimizer(optimizer, loaded: dict, log) -> bool:
    """Load a plain optimizer's state saved with another number of chained optimizers; False when the
    counts match (the caller loads it as usual).

    Why: megatron-core 0.16 gives expert parameters their own optimizer only when experts are split
    (``expert_model_parallel_size`` > 1 marks them ``allreduce=False``), and ``ChainedOptimizer`` nests
    its state by optimizer index, so EP 2 -> 1 (or 1 -> 2) meets a checkpoint nested the other way and
    its ``load_state_dict`` fails (a KeyError on the parameter groups). The moments themselves are sharded
    tensors named after their parameters: they were loaded whatever the nesting. What the nesting holds is
    Adam's step (one ``common_step`` per optimizer) and the parameter groups, whose hyper-parameters come
    from the run's config and scheduler: so each of the run's optimizers takes its moments, the saved step
    and its own groups.
    """
    inners = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    nested = sorted(key for key in loaded if isinstance(key, int))
    if len(inners) == 1 and nested:
        parts, saved = [loaded], [loaded[key] for key in nested]
    elif len(inners) > 1 and "param_groups" in loaded:
        parts, saved = [loaded[i] for i in range(len(inners))], [loaded]
    else:
        return False
    steps = {str(part["state"]["common_step"]) for part in saved if "common_step" in part.get("state", {})}
    step = next((part["state"]["common_step"] for part in saved if "common_step" in part.get("state", {})), None)
    if len(steps) > 1 or any({key for key in part if not isinstance(key, int)} - {"state", "param_groups"}
                             for part in parts):
        raise ConfigError("load: the optimizer state was saved with another number of chained optimizers (expert "
                          "parallelism changed) in a form Primus cannot regroup (mixed-precision optimizer or "
                          "unequal steps); set no_load_optim: true to load the weights only")
    for inner, part in zip(inners, parts):
        state = {key: value for key, value in part["state"].items() if key != "common_step"}
        if step is not None:
            state["common_step"] = step
        inner.load_state_dict({"state": state, "param_groups": inner.state_dict()["param_groups"]})
    getattr(optimizer, "_synchronize_steps", lambda: None)()
    log("optimizer", f"{len(saved)} -> {len(inners)} chained", "the checkpoint's optimizer state regrouped: megatron-core "
        "chains a separate optimizer for experts only at expert_model_parallel_size > 1")
    return True
