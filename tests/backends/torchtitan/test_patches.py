"""Each CPU patch: the upstream behaviour that needs it, and the patched behaviour.

The upstream behaviour is probed in a fresh interpreter (a test before this one may have applied a patch
for its whole process); the patched one in this process under a ``Patcher`` (undone after the check), unless
what is checked is an import (triton) or needs two ranks (gloo).
"""
import contextlib
import logging
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("torchtitan")

from primus.backends.torchtitan.patches import PATCHES  # noqa: E402


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


TRITON_STUB = "from primus.backends.torchtitan.patches import triton_import_stub as t; t()"


def _upstream(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with TorchTitan as it is upstream (only triton stubbed, to import it)."""
    return _python(f"{TRITON_STUB}; {code}")


def _skip_on_gpu(reason: str) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip(reason)


@contextlib.contextmanager
def _patched(*uses: str):
    """The run's patches for ``uses`` in this process, for the block only; the Patcher."""
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(uses)) as applied:
        yield applied


def test_patches_are_named_gated_and_explained():
    from primus.runtime.patches import Where

    names = [p.name for p in PATCHES]
    assert names == ["compile_on_first_call", "cpu_device_type", "triton_import_stub", "set_timeout_alias", "gloo_sum_reduction",
                     "sharded_init_on_cpu", "pipeline_presplit_microbatches", "peak_flops_from_primus_table",
                     "checkpoint_on_transient_group", "end_of_training_barrier", "no_download_count_ping",
                     "hf_backend_feed_forward_sharding",
                     "hf_backend_feed_forward_init", "hf_backend_rope_buffers", "hf_backend_chunked_attention_masks",
                     "hf_backend_sdpa_on_cpu", "float8_on_cpu", "llama4_moe_float8_add"]
    for patch in PATCHES:
        assert patch.why and "\n" not in patch.why and str(patch.versions)
        assert patch.verdict(Where.here(()))[0] in (True, False)
    # applied only when a model is converted to float8 / built on the transformers backend
    plain = {p.name for p in PATCHES if p.verdict(Where(gpu=False, uses=frozenset()))[0]}
    assert not plain & {"float8_on_cpu", "llama4_moe_float8_add"}
    assert not any(name.startswith("hf_backend") for name in plain)


@pytest.mark.e2e
def test_cpu_device_type():
    _skip_on_gpu("a CUDA host needs no device patch")
    bare = _upstream("import torchtitan.tools.utils as u; print(u.device_type)")
    assert bare.stdout.strip() == "cuda"  # upstream: 'cuda' on a CPU-only host -> set_device fails
    with _patched():
        import torchtitan.tools.utils as u

        assert [u.device_type, u.device_module.device_count()] == ["cpu", 1]


@pytest.mark.e2e
def test_triton_import_stub():
    bare = _python("import torchtitan.distributed.minimal_async_ep")
    if bare.returncode == 0:
        pytest.skip("triton is installed here: no stub needed")
    assert "No module named 'triton'" in bare.stderr
    fixed = _python("import sys; from primus.backends.torchtitan.patches import apply_patches; apply_patches(); "
                    "import torchtitan.trainer; print('triton' in sys.modules)")
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip() == "False"  # the stand-in is gone once torchtitan is imported


@pytest.mark.e2e
def test_set_timeout_alias():
    bare = _python("import torch.distributed as d; print(hasattr(d, 'set_timeout'))")
    if bare.stdout.strip() == "True":
        pytest.skip("this torch has torch.distributed.set_timeout")
    import torch.distributed as d
    from torch.distributed.distributed_c10d import _set_pg_timeout

    with _patched():
        assert d.set_timeout is _set_pg_timeout


GLOO_FSDP = """
import os, sys, torch, torch.distributed as dist
from primus.backends.torchtitan.patches import apply_patches
if sys.argv[1] == "patched":
    apply_patches()
else:
    from primus.backends.torchtitan.patches import triton_import_stub
    triton_import_stub()
import torchtitan.distributed.fsdp as fsdp
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
for layer in model:
    fully_shard(layer)
fully_shard(model)
fsdp.disable_fsdp_gradient_division(model)   # what torchtitan's FSDP setup calls
model(torch.randn(4, 8)).sum().backward()
print("ok", flush=True)
dist.destroy_process_group()
# torch 2.13 + gloo + bare fully_shard: ~1 run in 3 aborts in interpreter finalization after all the
# work is done ("terminate called without an active exception", SIGABRT) - not what this tests.
os._exit(0)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("mode, ok", [("bare", False), ("patched", True)])
def test_gloo_sum_reduction(tmp_path, mode, ok):
    _skip_on_gpu("NCCL supports PREMUL_SUM")
    script = tmp_path / "fsdp.py"
    script.write_text(GLOO_FSDP)
    result = subprocess.run(
        ["timeout", "-k", "5", "120", sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node=2", str(script), mode], capture_output=True, text=True)
    assert (result.returncode == 0) is ok, result.stderr[-2000:]
    if not ok:
        assert "PREMUL_SUM" in result.stderr  # the upstream failure this patch exists for


# one 1F1B step over two pre-split micro-batches, as TorchTitan 0.3.0 calls it; `same`: the losses it reports
PRESPLIT_BODY = """
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
stage = PipelineStage(model, stage_index=0, num_stages=1, device=torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).mean())
x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 1)
losses = []
schedule.step(arg_mbs=[(x[0],), (x[1],)], kwarg_mbs=[{}, {}], target_mbs=[y[0], y[1]], losses=losses)
expected = [float(((model(x[i]) - y[i]) ** 2).mean()) for i in range(2)]
same = [round(float(l), 6) for l in losses] == [round(e, 6) for e in expected]
"""
PRESPLIT_STEP = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
""" + PRESPLIT_BODY + """
print("losses", same, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.e2e
def test_pipeline_presplit_microbatches_fail_upstream(tmp_path):
    from primus.backends.torchtitan.patches import _torch_step_lacks_presplit

    if not _torch_step_lacks_presplit():
        pytest.skip("this torch's pipeline schedules take pre-split microbatches")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "pp.py"
    script.write_text(PRESPLIT_STEP)
    result = subprocess.run([sys.executable, str(script), str(port)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "arg_mbs" in result.stderr  # the upstream failure


def test_pipeline_presplit_microbatches():
    """PRESPLIT_BODY patched, in this process (the patch through a Swaps, undone after)."""
    from primus.backends.torchtitan.patches import _torch_step_lacks_presplit, pipeline_presplit_microbatches
    from primus.runtime.patches import Swaps

    if not _torch_step_lacks_presplit():
        pytest.skip("this torch's pipeline schedules take pre-split microbatches")
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    swaps = Swaps()
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    try:
        pipeline_presplit_microbatches(swaps)
        scope = {"torch": torch, "PipelineStage": PipelineStage, "Schedule1F1B": Schedule1F1B}
        exec(PRESPLIT_BODY, scope)
        assert scope["same"], (scope["losses"], scope["expected"])
    finally:
        swaps.restore()
        dist.destroy_process_group()


@pytest.mark.e2e
def test_peak_flops_from_primus_table(caplog, capfd):
    probe = ("import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.WARNING); {setup}; "
             "import torchtitan.tools.utils as u; print(u.get_peak_flops('cpu'), u.get_peak_flops('AMD Instinct MI300X'))")
    bare = _python(probe.format(setup=TRITON_STUB))
    assert "fallback to A100" in bare.stdout and bare.stdout.split()[-2] == "312000000000000.0"  # CPU "is" an A100
    capfd.readouterr()
    with _patched(), caplog.at_level(logging.DEBUG):
        import torchtitan.tools.utils as u

        peaks = [str(u.get_peak_flops("cpu")), str(u.get_peak_flops("AMD Instinct MI300X"))]
    said = caplog.text + "".join(capfd.readouterr())
    assert "fallback" not in said and "lspci" not in said
    assert peaks == ["inf", "1307400000000000.0"]  # Primus' table, the one MFU uses


FLOAT8_CONVERTER = """
from primus.backends.torchtitan.patches import apply_patches
apply_patches()
{patch}
from torchtitan.components.quantization.float8 import Float8LinearConverter
from torchao.float8 import Float8LinearConfig
try:
    converter = Float8LinearConverter.Config(recipe_name="rowwise").build()
except ValueError as error:
    print("refused:", error)
else:
    print("built", converter.torchao_config == Float8LinearConfig.from_recipe_name("rowwise"))
"""


@pytest.mark.e2e
def test_float8_on_cpu():
    pytest.importorskip("torchao")
    _skip_on_gpu("a GPU host asks its own capability")
    bare = _python(FLOAT8_CONVERTER.format(patch=""))
    assert "refused: Failed to swap to Float8Linear because float8 is only supported on NVIDIA SM89" in bare.stdout
    with _patched("float8") as applied:
        assert [name for name in applied.names() if name.startswith("float8")] == ["float8_on_cpu"]
        from torchao.float8 import Float8LinearConfig
        from torchtitan.components.quantization.float8 import Float8LinearConverter

        converter = Float8LinearConverter.Config(recipe_name="rowwise").build()  # no ValueError
        assert converter.torchao_config == Float8LinearConfig.from_recipe_name("rowwise")


def test_end_of_training_barrier_skips_the_rank_zero_sleep_and_undoes_cleanly(monkeypatch):
    import time

    from primus.backends.torchtitan.patches import _TimeWithoutSleep, end_of_training_barrier
    from primus.runtime.patches import Swaps
    from primus.runtime.registry import get_adapter

    trainer = get_adapter("torchtitan").import_module("torchtitan.trainer")
    # an earlier run in this process left the patch applied for good: start from TorchTitan's own
    while getattr(trainer.Trainer.train, "_primus_patched", False):
        monkeypatch.setattr(trainer.Trainer, "train", trainer.Trainer.train.__wrapped__)
    if isinstance(trainer.time, _TimeWithoutSleep):
        monkeypatch.setattr(trainer, "time", trainer.time._module)

    original_train, original_time = trainer.Trainer.train, trainer.time
    swaps = Swaps()
    end_of_training_barrier(swaps)
    try:
        start = time.perf_counter()
        trainer.time.sleep(2)  # Trainer.train's last call on rank 0 (upstream: 2 s, every run)
        assert time.perf_counter() - start < 2.0  # the upstream sleep takes 2 s; a no-op far less, however busy
        assert trainer.time.perf_counter is time.perf_counter  # its other uses of `time` unchanged
        assert trainer.Trainer.train is not original_train  # ends with a barrier where there are peers
    finally:
        swaps.restore()
    assert trainer.Trainer.train is original_train and trainer.time is original_time


BARRIER = """
import os, time, torch.distributed as dist
from contextlib import nullcontext
from types import SimpleNamespace
from primus.backends.torchtitan.patches import apply_patches
apply_patches()
import torchtitan.trainer as trainer
dist.init_process_group("gloo")

class Finished(trainer.Trainer):  # a trainer whose loop is over: train() runs only its ending
    def __init__(self):
        self.step, self.dataloader = 0, []
        self.config = SimpleNamespace(checkpoint=SimpleNamespace(load_step=-1), dump_folder=".",
                                      profiler=SimpleNamespace(build=lambda **kwargs: nullcontext()))
        self.checkpointer = SimpleNamespace(load=lambda step: None)

    def should_continue_training(self):
        return False

if dist.get_rank() == 1:
    time.sleep(3)  # the slower rank finishes training 3 s later: longer than TorchTitan's own 2 s sleep
start = time.perf_counter()
Finished().train()
print("rank", dist.get_rank(), "waited", round(time.perf_counter() - start, 2), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.e2e
def test_end_of_training_barrier_holds_rank_zero_until_the_last_rank_finished(tmp_path):
    """Two gloo ranks: rank 1 leaves its training loop 3 s later; rank 0 waits for it at the barrier (upstream
    it sleeps a fixed 2 s and leaves first), so both leave ``train`` together."""
    _skip_on_gpu("applied on hosts without a GPU")
    script = tmp_path / "barrier.py"
    script.write_text(BARRIER)
    result = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", "--tee=3", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    waits = {words[1]: float(words[3]) for words in (line.split("]:")[-1].split() for line in result.stdout.splitlines())
             if len(words) == 4 and words[2] == "waited"}
    assert waits["0"] >= 2.5, result.stdout  # held by the barrier until rank 1 arrived (upstream: 2.0)
    assert waits["1"] < 2.0, result.stdout  # the last rank passes at once (a hang guard's margin, not a speed check)


def test_no_download_count_ping_turns_the_s3_head_request_off_unless_the_user_set_it(monkeypatch):
    pytest.importorskip("datasets")
    import datasets.config
    import datasets.load

    from primus.backends.torchtitan.patches import PATCHES
    from primus.runtime.patches import Patcher, Where

    pings = []
    monkeypatch.setattr(datasets.load, "get_session", lambda: type("S", (), {"head": lambda *a, **k: pings.append(a)})())
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    monkeypatch.delenv("HF_UPDATE_DOWNLOAD_COUNTS", raising=False)
    datasets.load.increase_load_count("json")
    assert len(pings) == 1  # upstream: a HEAD request to S3 for a local file's builder
    record = [p for p in PATCHES if p.name == "no_download_count_ping"]
    with Patcher(record, Where(gpu=False, uses=frozenset())) as patcher:
        assert patcher.names() == ["no_download_count_ping"]
        datasets.load.increase_load_count("json")
    assert len(pings) == 1 and datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True  # none made; undone after
    monkeypatch.setenv("HF_UPDATE_DOWNLOAD_COUNTS", "1")
    with Patcher(record, Where(gpu=False, uses=frozenset())) as patcher:
        assert patcher.names() == []  # the user's own setting is kept


COMPILE_PROBE = """
import sys, torch
from primus.runtime.registry import get_adapter
get_adapter("torchtitan").import_engine()
from torchtitan.models.common.attention import FlexAttention, _compiled_create_block_mask
print("inductor imported:", "torch._inductor.compile_fx" in sys.modules, "compile restored:", torch.compile.__module__)
"""


@pytest.mark.e2e
def test_compile_on_first_call_keeps_inductor_out_of_torchtitans_import():
    _skip_on_gpu("applied on hosts without a GPU")
    bare = _upstream("import sys, torchtitan.models.common.attention; print('torch._inductor.compile_fx' in sys.modules)")
    assert bare.stdout.strip() == "True"  # upstream: the class body's torch.compile imports Inductor
    fixed = _python(COMPILE_PROBE)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "inductor imported: False compile restored: torch" in fixed.stdout
