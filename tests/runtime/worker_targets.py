"""Targets for ``python -m primus.runtime.worker tests.runtime.worker_targets:NAME PAYLOAD.json``."""
import atexit
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

IDLE_EXECUTORS: list[ThreadPoolExecutor] = []  # never shut down: a run's leftovers


def unwaited_collectives(payload: dict) -> int:
    """Gloo all-gathers nobody waits on, their group never destroyed: what an engine can leave behind.
    With 50 of them the interpreter's exit aborts 9 times in 10 here (with 1 of them: 5 in 6)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()  # both ranks connected: otherwise one that returns at once can leave its peer's connect half done
    for _ in range(50):
        out = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.group.WORLD.allgather(out, torch.tensor([float(dist.get_rank())]))
    return 0


def leaves_work_for_the_exit(payload: dict) -> int:
    """Returns 3, leaving a non-daemon thread still writing, an idle executor's worker (which stops
    only when told to at exit) and an atexit callback to run."""
    folder = Path(payload["folder"])
    IDLE_EXECUTORS.append(ThreadPoolExecutor(1))
    IDLE_EXECUTORS[-1].submit(lambda: None).result()

    def late_write() -> None:
        time.sleep(0.5)
        (folder / "thread.txt").write_text("done")

    threading.Thread(target=late_write).start()
    atexit.register(lambda: (folder / "atexit.txt").write_text("done"))
    print("printed before the end", end="")  # no newline: still in the buffer when the run returns
    return 3
