"""The Megatron training loop, driven by megatron-core's own pieces.

One optimizer step = Megatron's ``get_forward_backward_func()`` (no pipelining, 1F1B, or
interleaved 1F1B with virtual stages) over the global batch's micro-batches, then the Megatron
optimizer step and the LR scheduler step (counted in samples, as Megatron-LM does).
"""
from __future__ import annotations

import math
import os
import time
from functools import partial
from pathlib import Path

from primus.backends.megatron import checkpoint as ckpt
from primus.backends.megatron.arguments import MegatronArgs
from primus.backends.megatron.data import blend_summary, build_datasets, micro_batches, sample_positions
from primus.backends.megatron.model import (
    Derived,
    build_model,
    build_optimizer,
    build_scheduler,
    padded_vocab_size,
    parallel_sizes,
    transformer_config,
    use_transformer_engine,
    wrap_float16,
)
from primus.backends.megatron.fsdp import wrap_data_parallel
from primus.backends.megatron.plan import flops_per_step
from primus.backends.megatron.saving import CheckpointSaver
from primus.backends.megatron.tokenizers import build_tokenizer
from primus.backends.megatron.aux_losses import aux_loss_metrics
from primus.backends.megatron.admission import check_arguments
from primus.backends.megatron.validate_args import check_parallel_layout
from primus.config.errors import ConfigError
from primus.plan.target import Target, host_target
from primus.runtime.admission import Admission
from primus.runtime.metrics import EvalReport, StepReport
from primus.runtime.phases import timed_iterator

def _init_process_group(ctx) -> bool:
    """Join the process group the launcher described in env vars; True if we created it. One rank with
    no rendezvous address (a run in the caller's own process) gets a store of its own, in memory: a
    fixed port (and MASTER_* left in this process's environment for every later child) would clash with
    whatever else on the host uses it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    for key, value in (("RANK", ctx.rank), ("WORLD_SIZE", ctx.world_size), ("LOCAL_RANK", ctx.local_rank)):
        os.environ.setdefault(key, str(value))
    if ctx.device.startswith("cuda"):
        import torch

        torch.cuda.set_device(ctx.local_rank)
    if ctx.world_size == 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        dist.init_process_group(ctx.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(ctx.dist_backend)
    return True


def _loss_func(loss_mask, output_tensor):
    """Megatron-LM's GPT loss: token-summed loss + token count; the schedule divides per micro-batch."""
    import torch

    losses = output_tensor.float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * loss_mask)
    num_tokens = loss_mask.sum().to(torch.int)
    reporting = torch.cat([loss.detach().view(1), num_tokens.float().view(1)])
    return loss, num_tokens, {"lm loss": reporting}


def _forward_step(data_iterator, model):
    from megatron.core.utils import get_batch_on_this_cp_rank

    batch = get_batch_on_this_cp_rank(next(data_iterator))  # this rank's sequence chunks (context parallel)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"],
                   loss_mask=batch["loss_mask"])  # the MTP heads mask as the main loss does
    return output, partial(_loss_func, batch["loss_mask"])


def _global_loss(losses: list[dict], device: str) -> float:
    """Token-weighted mean loss over the global batch, known on every rank (all-reduce over DP,
    then from the last pipeline stage to the others)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    total = torch.zeros(2, device=device)  # NCCL reduces GPU tensors
    for item in losses:
        total += item["lm loss"].float()
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    else:
        total.zero_()
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return (total[0] / total[1].clamp(min=1)).item()


def set_random_seed(args: MegatronArgs) -> None:
    """Megatron-LM's ``_set_random_seed``: one seed per pipeline stage (and per DP rank with
    data_parallel_random_init), then megatron-core's tensor/expert-parallel RNG streams."""
    import random

    import numpy
    import torch
    from megatron.core import parallel_state, tensor_parallel

    seed = args.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    if args.data_parallel_random_init:
        seed += 10 * parallel_state.get_data_parallel_rank()
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


class MegatronTrainer:
    def __init__(self, args: MegatronArgs, ctx, module: str = "pre_trainer", post=None, lora=None):
        self.args, self.ctx, self.module = args, ctx, module
        self.post = post  # primus.backends.megatron.post_training.MegatronPostTraining: HF weights, instruction data
        self.lora = lora  # primus.backends.megatron.lora.LoRAConfig (enabled) or None
        self.owns_process_group = False
        self.started = time.time()  # exit_duration_in_mins counts from here (Megatron-LM: from pretrain())

    def _say_notes(self) -> None:
        """What Megatron-LM's rules and the support table decided, once, before anything is built;
        a refused argument stops here (ConfigError), before the process group exists."""
        from primus.compat.differs import engine_lines, notes_without_differences

        for text in engine_lines(None, self.args):  # a value the experiment set that does not run as written
            self.ctx.logger.warning("%s", text)
        for key, value, reason, _level in notes_without_differences(self.args):
            self.ctx.log_derived(key, value, reason)
        # the launcher admitted the run on this host's device: the same check, on the device this rank uses
        refused, notes = check_arguments(self.args, self.target)
        if refused:
            raise ConfigError(Admission(self.target, self.module, refused).error())
        for key, value, reason in notes:
            self.ctx.log_derived(key, value, reason)

    def setup(self) -> None:
        import torch
        from megatron.core import parallel_state
        from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator

        args, ctx = self.args, self.ctx
        on_gpu = ctx.device.startswith("cuda")
        self.target = host_target() if on_gpu else Target("cpu")
        self._say_notes()  # the recipe's run applied the compatibility patches (``patches.py``)
        # Megatron-LM's default: a NaN/Inf loss stops the run (RunContext.report_step); off on request.
        ctx.stop_on_non_finite_loss = args.check_for_nan_in_loss_and_grad
        self.owns_process_group = _init_process_group(ctx)
        self.device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"  # set by the process group init
        world = torch.distributed.get_world_size()
        self.dp = check_parallel_layout(args, world)
        derived = Derived()
        self.gbs = args.global_batch_size or derived.set(
            "global_batch_size", args.micro_batch_size * self.dp, "not set: micro_batch_size x data-parallel size")
        self.num_microbatches = derived.set(
            "gradient_accumulation_steps", self.gbs // (args.micro_batch_size * self.dp),
            "global_batch_size / (micro_batch_size x data-parallel size)")
        derived.set("data_parallel_size", self.dp, "world size / (tensor x pipeline x context parallel)")

        parallel_state.initialize_model_parallel(**parallel_sizes(args))
        # Schedules read the micro-batch count from this global calculator.
        init_num_microbatches_calculator(ctx.rank, None, self.gbs, args.micro_batch_size, self.dp)
        # Megatron-LM's rerun machine re-runs steps from its own loop; here it only validates (disabled mode)
        from megatron.core.rerun_state_machine import RerunMode, destroy_rerun_state_machine, \
            initialize_rerun_state_machine

        destroy_rerun_state_machine()
        initialize_rerun_state_machine(mode=RerunMode.DISABLED)
        from megatron.core.config import set_experimental_flag

        set_experimental_flag(bool(args.enable_experimental))  # Megatron-LM's global_vars does the same
        set_random_seed(args)

        self.tokenizer = build_tokenizer(args)
        vocab = args.vocab_size or self.tokenizer.vocab_size
        if vocab < self.tokenizer.vocab_size:
            raise ConfigError(f"vocab_size ({vocab}) is smaller than the tokenizer's vocabulary ({self.tokenizer.vocab_size})")
        self.vocab = padded_vocab_size(vocab, args)
        if self.vocab != vocab:
            derived.set("padded_vocab_size", self.vocab,
                        f"{vocab} rounded up to a multiple of make_vocab_size_divisible_by x TP")
        use_te = use_transformer_engine(args, self.target, derived)
        if use_te and self.lora is not None:  # (with FP8 / context parallel: refused by the adapter's plan)
            use_te = False
            derived.set("transformer_impl", "local", "LoRA wraps megatron-core's Column/RowParallelLinear "
                        "(Transformer Engine fuses the layer norm into linear_qkv / linear_fc1)")
        derived.set("attention_backend", "TEDotProductAttention" if use_te else "local DotProductAttention",
                    "follows transformer_impl")
        self.config = transformer_config(args, on_gpu=on_gpu, derived=derived, use_te=use_te)
        derived.log(ctx)

        chunks = build_model(args, self.config, self.vocab, use_te=use_te)
        if on_gpu:
            for chunk in chunks:
                chunk.cuda(torch.cuda.current_device())
        if self.post is not None:  # before Float16Module/DDP/optimizer copy the parameters
            self.post.load_weights(chunks, ctx)
        if self.lora is not None:  # after the base weights are loaded, before Float16Module/DDP/optimizer
            self._apply_lora(chunks)
        self.model = wrap_data_parallel(args, self.config, wrap_float16(args, self.config, chunks))
        self.optimizer = build_optimizer(args, self.model)
        self._hook_schedule()
        self.scheduler = build_scheduler(args, self.optimizer, self.gbs)
        self.flops_per_step = flops_per_step(args, self.gbs, padded_vocab_size=self.vocab)  # the one convention
        n_params = sum(p.numel() for c in chunks for p in c.parameters())
        ctx.logger.info("megatron model on rank %d: %d parameters in %d chunk(s)", ctx.rank, n_params, len(chunks))

        self.iteration, self.consumed = 0, 0
        self.save_dir = Path(args.save) if args.save else ctx.checkpoint_dir
        self.saver = CheckpointSaver(self.save_dir, args, self.model, self.optimizer, self.scheduler, ctx,
                                     fail_on_error=ctx.checkpoint_fail_on_error)
        self._load()

        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        if self.post is not None and self.post.sft is not None:  # instruction data (primus.data.sft)
            self.train_ds, self.valid_ds = self.post.datasets(args.seq_length, args.seed, ctx)
        else:
            self.train_ds, self.valid_ds, _ = build_datasets(args, self.tokenizer, self.gbs, self.dp)
            trained = blend_summary(self.train_ds, "train", samples=args.train_iters * self.gbs)
            for line in filter(None, (trained, blend_summary(self.valid_ds, "valid"))):
                ctx.logger.info(line)

    def _load(self) -> None:
        """Resume from ``load`` (or this run's own checkpoints); with none there, start from
        ``pretrained_checkpoint`` as Megatron-LM's ``load_checkpoint`` does: finetune from it (its weights
        at iteration 0, no optimizer or RNG state)."""
        args, ctx = self.args, self.ctx
        load_dir = Path(args.load) if args.load else (self.save_dir if ctx.resume else None)
        if (load_dir is None or ckpt.latest_iteration(load_dir) is None) and args.pretrained_checkpoint:
            ctx.log_derived("pretrained_checkpoint", args.pretrained_checkpoint,
                            f"no checkpoint under {load_dir or 'load'}: finetuning from it (Megatron-LM)")
            load_dir = Path(args.pretrained_checkpoint)
            args.finetune = True  # as Megatron-LM's load_checkpoint sets it
            if ckpt.latest_iteration(load_dir) is None:
                raise ConfigError(f"pretrained_checkpoint: no checkpoint ({ckpt.TRACKER}) under {load_dir}")
        if load_dir is None:
            return
        if ckpt.latest_iteration(load_dir) is None:
            if args.load or args.exit_on_missing_checkpoint:
                raise ConfigError(f"load: no checkpoint ({ckpt.TRACKER}) under {load_dir}")
            ctx.logger.info("resume: no checkpoint under %s yet, starting from scratch", load_dir)
            return
        self.iteration, self.consumed = ckpt.load_checkpoint(load_dir, self.model, self.optimizer, self.scheduler,
                                                             args, ctx.log_derived)
        ctx.logger.info("loaded checkpoint %s at iteration %d", load_dir, self.iteration)

    def _apply_lora(self, chunks: list) -> None:
        from primus.backends.megatron.lora import apply_lora, parameter_counts, summary

        counts = apply_lora(chunks, self.lora, self.config, seed=self.args.seed)
        skipped = counts.pop("skipped_experts")
        if skipped:
            self.ctx.log_derived("lora.target_modules", ",".join(self.lora.target_modules),
                                 f"{skipped} linears of MoE routed experts on rank {self.ctx.rank} stay frozen "
                                 "without adapters (expert-parallel LoRA is not supported)")
        missing = [name for name, n in counts.items() if n == 0]
        if missing:
            self.ctx.log_derived("lora.target_modules", ",".join(missing), "no such linear outside MoE routed experts in this model chunk")
        trainable, total = parameter_counts(chunks)
        self.ctx.logger.info(summary(self.lora, trainable, total))

    def _hook_schedule(self) -> None:
        """Tell the schedules how to finish a step, as Megatron-LM's ``train()`` does: without
        ``finalize_model_grads_func`` DDP grads are never all-reduced over DP (nor tied embedding
        grads across pipeline stages), and without ``grad_scale_func`` fp16 loss scaling is skipped."""
        from megatron.core.distributed import finalize_model_grads

        config = self.config
        config.grad_scale_func = self.optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        if self.args.overlap_grad_reduce:
            sync = [chunk.no_sync for chunk in self.model]
            config.no_sync_func = sync[0] if len(sync) == 1 else sync
        if self.args.overlap_param_gather:
            sync = [chunk.start_param_sync for chunk in self.model]
            config.param_sync_func = sync[0] if len(sync) == 1 else sync

    def _batches(self, dataset, consumed: int):
        layout = dict(consumed_samples=consumed, global_batch_size=self.gbs, micro_batch_size=self.args.micro_batch_size,
                      dp_rank=self.dp_rank, dp_size=self.dp)
        batches = micro_batches(dataset, device=self.device, cyclic=self.args.dataloader_type == "cyclic",
                                data_sharding=self.args.data_sharding, **layout)
        if self.ctx.samples is not None and dataset is self.train_ds:  # primus.sample_hashes
            for positions, batch in zip(sample_positions(**layout), batches):
                self.ctx.samples.add(batch["tokens"], keys=positions)
        return timed_iterator(batches, self.ctx.phase("data"))

    def _data_iterator(self, dataset, consumed: int):
        # Interleaved schedules take one iterator per model chunk; each chunk sees the same batches.
        if len(self.model) == 1:
            return self._batches(dataset, consumed)
        return [self._batches(dataset, consumed) for _ in self.model]

    def _forward_backward(self, dataset, consumed: int, forward_only: bool) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        return get_forward_backward_func()(
            forward_step_func=_forward_step,
            data_iterator=self._data_iterator(dataset, consumed),
            model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=self.num_microbatches,
            seq_length=self.args.seq_length,
            micro_batch_size=self.args.micro_batch_size,
            forward_only=forward_only,
        )

    def train_step(self) -> tuple[float, float | None, float, dict[str, float]]:
        """(loss, grad norm, the learning rate this step's update used, extra scalars).

        The LR is read before the scheduler advances: Megatron-LM logs the one after (the next
        step's), TorchTitan the one applied; Primus reports the applied one for every backend.
        Extras: the MoE router's and MTP's auxiliary losses, as Megatron-LM logs them.

        ``check_for_nan_in_loss_and_grad`` reads the step's own values: a non-finite global loss
        skips the update (``RunContext.report_step`` then stops the run), a non-finite grad norm
        stops it after the update and before any checkpoint of that state.
        """
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = self.optimizer.param_groups[0]["lr"]
        with self.ctx.phase("compute"):
            losses = self._forward_backward(self.train_ds, self.consumed, forward_only=False)
        self._say_sanitized()
        loss = _global_loss(losses, self.device)
        if self.ctx.stop_on_non_finite_loss and not math.isfinite(loss):
            return loss, None, lr, {}
        with self.ctx.phase("optimizer"):
            update_ok, grad_norm, _ = self.optimizer.step()
            if update_ok:
                self.scheduler.step(increment=self.gbs)
        extra = aux_loss_metrics(self.config, self.num_microbatches)
        return loss, (float(grad_norm) if grad_norm is not None else None), lr, extra

    def _say_sanitized(self) -> None:
        """``primus.sanitize_nan_grads`` changed this step's update: one warning on each rank where it did."""
        from primus.backends.megatron.option_patches import take_sanitized

        if count := take_sanitized():
            self.ctx.logger.warning("step %d: %d NaN/Inf gradient elements on rank %d set to 0 before the gradient "
                                    "reduction (primus.sanitize_nan_grads)", self.iteration + 1, count, self.ctx.rank)

    def evaluate(self) -> float:
        with self.ctx.phase("eval"):
            return self._evaluate()

    def _evaluate(self) -> float:
        import torch

        for chunk in self.model:
            chunk.eval()
        with torch.no_grad():
            losses = []
            for i in range(self.args.eval_iters):
                losses += self._forward_backward(self.valid_ds, i * self.gbs, forward_only=True)
        for chunk in self.model:
            chunk.train()
        return _global_loss(losses, self.device)

    def save(self) -> None:
        with self.ctx.phase("checkpoint"):  # an async_save's share: scheduling it, and waiting for the one before
            self.saver.save(self.iteration, self.consumed)

    def train(self) -> None:
        args, ctx = self.args, self.ctx
        last_saved = self.iteration
        while self.iteration < args.train_iters:
            self.saver.poll()  # a background save every rank has finished: move the tracker to it
            start = time.perf_counter()
            loss, grad_norm, lr, extra = self.train_step()
            elapsed = time.perf_counter() - start
            self.iteration += 1
            self.consumed += self.gbs
            ctx.report_step(StepReport(
                step=self.iteration, loss=loss, step_time_s=elapsed, samples=self.gbs,
                tokens=self.gbs * args.seq_length, flops=self.flops_per_step,
                lr=lr, grad_norm=grad_norm, extra=extra,
            ))
            if args.eval_interval and args.eval_iters and self.iteration % args.eval_interval == 0 and self.valid_ds:
                ctx.report_eval(EvalReport(step=self.iteration, loss=self.evaluate()))
            if args.save_interval and self.iteration % args.save_interval == 0:
                self.save()
                last_saved = self.iteration
            if self.iteration < args.train_iters and (ctx.should_stop() or self._out_of_time()):
                # SIGTERM (preemption) or exit_duration_in_mins: checkpoint this step whatever the interval,
                # then stop; the same command resumes (exit 75)
                from primus.runtime.preemption import Preempted

                if last_saved != self.iteration:
                    self.save()
                self.saver.wait()
                raise Preempted(self.iteration, True)
        if last_saved != self.iteration and ctx.save_last_checkpoint:  # AMD Primus: disable_last_saving
            self.save()
        self.saver.wait()

    def _out_of_time(self) -> bool:
        """Megatron-LM's ``exit_duration_in_mins``: minutes since the trainer started, the largest over the
        ranks, past the limit (every rank agrees, as Megatron-LM's all-reduce MAX makes them)."""
        if not self.args.exit_duration_in_mins:
            return False
        import torch
        import torch.distributed as dist

        minutes = (time.time() - self.started) / 60.0
        done = torch.tensor([int(minutes > self.args.exit_duration_in_mins)], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            self.ctx.log_derived("exit_duration_in_mins", self.args.exit_duration_in_mins,
                                 f"{minutes:.1f} minutes: checkpoint and stop; the same command resumes")
        return bool(done.item())

    def close(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator

        if getattr(self, "saver", None) is not None:
            self.saver.close()
        parallel_state.destroy_model_parallel()  # safe when never initialized
        destroy_num_microbatches_calculator()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


def train(args: MegatronArgs, ctx, module: str = "pre_trainer", post=None, lora=None) -> None:
    """Build Megatron's model, optimizer and data for this rank, train, checkpoint, tear down."""
    trainer = MegatronTrainer(args, ctx, module, post, lora)
    try:
        trainer.setup()
        trainer.train()
    finally:
        trainer.close()
