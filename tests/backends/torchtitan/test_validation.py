"""TorchTitan settings that cannot run are refused before any run directory exists: exit 2, one line
naming the key (ranges, booleans for integers, non-finite numbers, EP without experts, PP batches)."""
import pytest

pytest.importorskip("torchtitan")

from primus.config.errors import ConfigError  # noqa: E402
from tests.conftest import TINY_EXAMPLE  # noqa: E402


def build(*overrides: str):
    """``build_trainer_config`` on the tiny example with command-line overrides, as validation runs it."""
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from primus.backends.torchtitan.config import build_trainer_config
    from primus.compat import AMD_PRIMUS
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults

    resolved = resolve_experiment(TINY_EXAMPLE, list(overrides), backend_defaults, dialect=AMD_PRIMUS)
    params = resolved.modules["pre_trainer"].params
    return build_trainer_config(params, run_dir=TINY_EXAMPLE.parent, device="cpu", provenance=resolved.provenance)


BAD = [
    ("training.steps=0", "training.steps: 0 is out of range; expected >= 1"),
    ("training.steps=-5", "training.steps: -5 is out of range"),
    ("training.steps=true", "training.steps: true is a boolean; expected int"),
    ("training.local_batch_size=0", "training.local_batch_size: 0 is out of range"),
    ("training.local_batch_size=-2", "training.local_batch_size: -2 is out of range"),
    ("training.global_batch_size=0", "expected -1 (local_batch_size x data-parallel degree) or >= 1"),
    ("training.seq_len=0", "training.seq_len: 0 is out of range"),
    ("parallelism.tensor_parallel_degree=0", "parallelism.tensor_parallel_degree: 0 is out of range"),
    ("parallelism.pipeline_parallel_degree=-1", "parallelism.pipeline_parallel_degree: -1 is out of range"),
    ("parallelism.expert_parallel_degree=0", "parallelism.expert_parallel_degree: 0 is out of range"),
    ("parallelism.data_parallel_shard_degree=0", "expected -1 (fill the world) or >= 1"),
    ("parallelism.data_parallel_shard_degree=-2", "expected -1 (fill the world) or >= 1"),
    ("parallelism.data_parallel_replicate_degree=false", "is a boolean"),
    ("optimizer.lr=.nan", "optimizer.lr: is not a finite number"),
    ("optimizer.lr=.inf", "optimizer.lr: is not a finite number"),
    ("optimizer.lr=-0.1", "optimizer.lr"),
    ("lr_scheduler.decay_ratio=1.5", "lr_scheduler.decay_ratio: 1.5 is out of range; expected >= 0 and <= 1"),
    ("checkpoint.interval=0", "checkpoint.interval: 0 is out of range"),
    ("training.max_norm=.inf", "training.max_norm: is not a finite number"),
    ("parallelism.expert_parallel_degree=2", "the model (llama3) has no experts"),
    ("parallelism.pipeline_parallel_degree=2 training.local_batch_size=1",
     "training.local_batch_size: 1 pipeline microbatch(es) of 1 for 2 stages: every stage needs one; "
     "raise training.local_batch_size to 2 or more"),
    ("parallelism.pipeline_parallel_degree=2 parallelism.pipeline_parallel_microbatch_size=4",
     "set parallelism.pipeline_parallel_microbatch_size to 2 or less"),
    ("parallelism.pipeline_parallel_degree=2 parallelism.pipeline_parallel_microbatch_size=3",
     "3 does not divide training.local_batch_size (4)"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[o for o, _ in BAD])
def test_a_setting_that_cannot_run_is_one_error_naming_its_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        build(*overrides.split())
    text = str(error.value)
    assert message in text and "\n" not in text
    assert text.startswith("command line '")  # the provenance of the offending value


@pytest.mark.parametrize("overrides", ["parallelism.data_parallel_shard_degree=-1", "training.global_batch_size=-1",
                                       "checkpoint.load_step=-1", "parallelism.pipeline_parallel_degree=2"])
def test_documented_special_values_and_working_layouts_pass(overrides):
    build(overrides)


def test_pipeline_microbatches_are_said(capsys):
    _, _, derived = build("parallelism.pipeline_parallel_degree=2")
    assert ("pipeline microbatches", 4, "training.local_batch_size 4 / parallelism.pipeline_parallel_microbatch_size 1, "
            "for 2 stages") in derived


@pytest.mark.e2e
def test_train_refuses_before_writing_anything(run_primus, workspace):
    result = run_primus("train", TINY_EXAMPLE, "exp_name=bad", "training.steps=0")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "training.steps: 0 is out of range" in result.stderr
    assert not (workspace / "amd" / "root" / "bad").exists()


def test_expert_parallelism_must_fit_inside_the_data_shards():
    """TorchTitan builds the EP ranks inside data_parallel_shard x context x tensor; on 1 rank EP=2 would die
    in the device mesh ("product of mesh_sizes ... is 0")."""
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from primus.compat import AMD_PRIMUS
    from primus.config.resolve import resolve_experiment
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.registry import backend_defaults, get_adapter

    example = TINY_EXAMPLE.with_name("deepseek_v3_tiny-moe-pretrain.yaml")
    resolved = resolve_experiment(example, [], backend_defaults, dialect=AMD_PRIMUS)
    module = ModuleConfig.of(resolved.modules["pre_trainer"])
    adapter = get_adapter("torchtitan")
    assert adapter.plan(module, 2, resolved.provenance).layout.ep == 2
    with pytest.raises(ConfigError, match=r"parallelism.expert_parallel_degree: 2 does not divide data_parallel_shard "
                                          r"x context x tensor = 1 x 1 x 1 = 1 ranks \(world size 1\)"):
        adapter.plan(module, 1, resolved.provenance)


def test_every_numeric_setting_of_the_engine_has_a_range():
    """Walks the installed TorchTitan's Trainer.Config: a new numeric field must be given a range here."""
    import dataclasses
    import typing

    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    from primus.backends.torchtitan.ranges import RANGES, UNBOUNDED

    def numeric(hint) -> bool:
        if hint in (int, float):
            return True
        return typing.get_origin(hint) is not None and any(numeric(arg) for arg in typing.get_args(hint))

    def fields(obj, prefix=""):
        hints = typing.get_type_hints(type(obj))
        for field in dataclasses.fields(obj):
            value, key = getattr(obj, field.name), f"{prefix}{field.name}"
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                yield from fields(value, f"{key}.")
            elif not field.name.startswith("_") and numeric(hints.get(field.name)):
                yield key

    found = set(fields(Trainer.Config(dataloader=HuggingFaceTextDataLoader.Config())))
    assert len(found) > 30 and found - set(RANGES) - set(UNBOUNDED) == set()
