"""A TorchTitan checkpoint leaves no OpenMP thread pools behind (patch ``checkpoint_on_transient_group``).

The symptom is deterministic: upstream, a save whose plan is above ATen's 32 KiB grain size leaves
one more OpenMP worker thread per gloo worker thread that copied it, for the rest of the process
(and every OpenMP worker then sleeps between parallel regions: ~2x slower steps on 2 cores, which
``benchmarks/checkpoint_steady.py`` measures; root cause in ``primus/backends/dcp_group.py``).
"""
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan")

SAVE_AND_LOAD = """
import os, sys, time
import torch, torch.distributed as dist
from primus.backends.torchtitan import patches
from primus.runtime.patches import Where, apply_for_process
# every patch this host needs, with or without the one under test
apply_for_process([p for p in patches.PATCHES if sys.argv[1] == "patched" or p.name != "checkpoint_on_transient_group"],
                  Where.here(()))
import torchtitan.components.checkpointer.dcp as checkpointer

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

before = threads(settle=1.0)
state = {f"layers.{i}.weight": torch.randn(8) for i in range(2000)}   # plan: hundreds of KiB
manager = object.__new__(checkpointer.CheckpointManager)   # the trainer's own save/load methods
manager.sd_adapter, manager.states = None, {}
manager.dcp_save(state, checkpoint_id=sys.argv[2], async_mode=checkpointer.AsyncMode.DISABLED)
after_save = threads(until=before)
loaded = {key: torch.zeros(8) for key in state}
manager.dcp_load(loaded, checkpoint_id=sys.argv[2], from_hf=False, from_quantized=False)
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
    if mode == "upstream":  # the behaviour the patch exists for: pools left in the default group's threads
        assert after_save > before
    else:
        assert (after_save, after_load) == (before, before)
