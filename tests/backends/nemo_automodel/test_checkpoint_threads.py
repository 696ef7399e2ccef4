"""An AutoModel checkpoint leaves no OpenMP thread pools behind (``checkpoint_on_transient_group``).

Deterministic symptom of the slowdown root-caused in ``primus/backends/dcp_group.py``: upstream,
``Checkpointer``'s DCP save on the default gloo group leaves one more OpenMP worker thread per gloo
worker thread that copied the save plans, for the rest of the process.
"""
import subprocess
import sys

import pytest

pytest.importorskip("nemo_automodel")

SAVE_AND_LOAD = """
import contextlib, os, sys, time, types
import torch, torch.distributed as dist
from nemo_automodel.components.checkpoint.checkpointing import Checkpointer
from primus.backends.nemo_automodel.patches import checkpoint_on_transient_group

torch.set_num_threads(2)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.ones(1 << 20).add_(1)    # the main thread's own OpenMP pool exists before we count

def threads(settle=3.0, until=None):
    # OpenMP workers of a destroyed group exit asynchronously: wait for the count to settle, or to come back to
    # `until` (threads only end after a save or load returned: none starts later)
    deadline, count = time.monotonic() + settle, len(os.listdir("/proc/self/task"))
    while time.monotonic() < deadline and count != until:
        time.sleep(0.1)
        count = len(os.listdir("/proc/self/task"))
    return count

checkpointer = object.__new__(Checkpointer)    # the recipe's own save/load methods
checkpointer.config = types.SimpleNamespace(is_peft=False, is_async=False)
checkpointer.process_group, checkpointer._planner_cache_namespace = None, "test"
path = os.path.join(sys.argv[2], "model")
state = {f"blocks.{i}.weight": torch.randn(8) for i in range(2000)}   # plan: hundreds of KiB
scope = checkpoint_on_transient_group() if sys.argv[1] == "patched" else contextlib.nullcontext()
with scope:
    before = threads(settle=1.0)
    checkpointer._do_save(state, path)
    after_save = threads(until=before)
    loaded = checkpointer._do_load({key: torch.zeros(8) for key in state}, path)
    after_load = threads(until=before)
assert all(torch.equal(loaded[key], state[key]) for key in state), "checkpoint round trip differs"
print(before, after_save, after_load, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["upstream", "patched"])
def test_checkpoint_leaves_no_openmp_pools(tmp_path, mode):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the patch applies to CPU (gloo) hosts only")
    script = tmp_path / "save_load.py"
    script.write_text(SAVE_AND_LOAD)
    result = subprocess.run(["timeout", "-k", "5", "180", sys.executable, str(script), mode, str(tmp_path / "ckpt")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    before, after_save, after_load = map(int, result.stdout.split())
    if mode == "upstream":  # the behaviour the patch exists for
        assert after_save > before
    else:
        assert (after_save, after_load) == (before, before)
