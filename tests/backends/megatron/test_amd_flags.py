"""Megatron-LM arguments AMD's files and Megatron-LM's own scripts use, wired here (no run): the cyclic
sampler's order, sample-based schedules, the precision-aware optimizer's config, Megatron-LM's rules."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from primus.backends.megatron.arguments import parse_args
from primus.backends.megatron.data import cyclic_indices
from primus.config.errors import ConfigError

TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "train_iters": 10,
        "lr": 1e-3, "mock_data": True, "vocab_size": 512, "micro_batch_size": 1}


def megatron_lm_random_sampler(total, consumed, mbs, rank, dp, data_sharding):
    """Megatron-LM d3528a2's MegatronPretrainingRandomSampler.__iter__ (megatron/training/datasets/
    data_samplers.py), the batches of one iteration over it; ``cyclic_iter`` starts it again each epoch."""
    per_step = mbs * dp
    active = total - total % per_step
    epoch, current = consumed // active, consumed % active
    if data_sharding:
        bucket_size = (total // per_step) * mbs
        g = torch.Generator()
        g.manual_seed(epoch)
        random_idx = torch.randperm(bucket_size, generator=g).tolist()
        idx_range = [rank * bucket_size + x for x in random_idx[current // dp:]]
    else:
        g = torch.Generator()
        g.manual_seed(epoch)
        idx_range = torch.randperm((total // mbs) * mbs, generator=g).tolist()[current:][rank::dp]
    batch = []
    for idx in idx_range:
        batch.append(idx)
        if len(batch) == mbs:
            yield batch
            batch = []


@pytest.mark.parametrize("total, mbs, dp, sharding", [(24, 2, 2, True), (24, 2, 2, False), (30, 3, 2, True),
                                                      (17, 1, 1, False), (40, 4, 1, True)])
def test_cyclic_order_is_megatron_lms_random_sampler_over_three_epochs(total, mbs, dp, sharding):
    for rank in range(dp):
        expected, consumed = [], 0
        while len(expected) < 3 * (total // (mbs * dp)):  # cyclic_iter: a new pass from where the last ended
            for batch in megatron_lm_random_sampler(total, consumed, mbs, rank, dp, sharding):
                expected.append(batch)
                consumed += mbs * dp
        ours = [cyclic_indices(i * mbs * dp, total=total, micro_batch_size=mbs, dp_rank=rank, dp_size=dp,
                               data_sharding=sharding) for i in range(len(expected))]
        assert ours == expected  # each a pure function of the samples consumed: a resumed run continues it


def test_cyclic_order_differs_from_the_single_sampler_and_covers_an_epoch():
    first_epoch = [i for step in range(12) for i in cyclic_indices(step * 2, total=24, micro_batch_size=2, dp_rank=0,
                                                                   dp_size=1)]
    assert sorted(first_epoch) == list(range(24)) and first_epoch != list(range(24))


def test_sample_based_training_runs_train_samples_over_global_batch_iterations():
    args = parse_args({**TINY, "train_iters": None, "train_samples": 100, "global_batch_size": 8,
                       "lr_warmup_samples": 16, "lr_decay_samples": 80})
    assert args.train_iters == 12  # 100 // 8, Megatron-LM's update_train_iters
    from primus.backends.megatron.model import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    optimizer.param_groups[0].update(max_lr=args.lr, min_lr=args.min_lr)
    scheduler = build_scheduler(args, optimizer, global_batch_size=8)
    assert (scheduler.lr_warmup_steps, scheduler.lr_decay_steps, scheduler.wd_incr_steps) == (16, 80, 100)


@pytest.mark.parametrize("overrides, key", [
    ({"train_samples": 100, "global_batch_size": 8}, "train_samples"),
    ({"rampup_batch_size": [16, 16, 5859375]}, "rampup_batch_size"),
    ({"lr_warmup_samples": 8}, "lr_warmup_samples"),
    ({"train_iters": None, "train_samples": 100, "global_batch_size": 8, "lr_decay_iters": 5}, "lr_decay_iters"),
    ({"train_iters": None, "train_samples": 100}, "global_batch_size"),
])
def test_megatron_lms_iteration_and_sample_rules_are_one_line(overrides, key):
    with pytest.raises(ConfigError) as exc:
        parse_args({**TINY, **overrides})
    assert str(exc.value).startswith(f"modules.pre_trainer.{key}: ") and "\n" not in str(exc.value)


def test_no_position_embedding_is_megatron_lms_rope_only_spelling():
    assert parse_args({**TINY, "position_embedding_type": "rope", "no_position_embedding": True})
    with pytest.raises(ConfigError, match="add_position_embedding: no_position_embedding is deprecated"):
        parse_args({**TINY, "no_position_embedding": True})


@pytest.mark.parametrize("overrides, message", [
    ({"use_precision_aware_optimizer": True}, "use_distributed_optimizer: use_precision_aware_optimizer needs"),
    ({"main_grads_dtype": "bf16"}, "main_grads_dtype: bf16 needs use_precision_aware_optimizer: true"),
])
def test_precision_aware_optimizer_rules_of_megatron_core_are_said_before_launch(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_args({**TINY, **overrides})


def test_the_precision_aware_optimizer_reaches_megatron_cores_config_in_torch_dtypes(monkeypatch):
    """On a GPU with Transformer Engine (its FusedAdam, faked here with the signature megatron-core checks)."""
    pytest.importorskip("megatron.core")
    from primus.backends.megatron.model import optimizer_config

    class FusedAdam:  # the parameters megatron-core's OptimizerConfig looks for
        def __init__(self, params, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                     use_decoupled_grad=False):
            pass

    modules = {"transformer_engine": types.ModuleType("transformer_engine"),
               "transformer_engine.pytorch": types.ModuleType("transformer_engine.pytorch"),
               "transformer_engine.pytorch.optimizers": types.ModuleType("transformer_engine.pytorch.optimizers")}
    modules["transformer_engine.pytorch.optimizers"].FusedAdam = FusedAdam
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    from megatron.core.optimizer import optimizer_config as config_module

    monkeypatch.setattr(config_module, "is_te_min_version", lambda version: True)  # its version, as installed
    args = parse_args({**TINY, "bf16": True, "use_precision_aware_optimizer": True, "use_distributed_optimizer": True,
                       "main_grads_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp8"})
    config = optimizer_config(args)
    assert config.use_precision_aware_optimizer is True
    assert (config.main_grads_dtype, config.main_params_dtype, config.exp_avg_dtype, config.exp_avg_sq_dtype) == \
        (torch.bfloat16, torch.float32, torch.bfloat16, torch.uint8)
