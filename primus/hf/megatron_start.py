"""Megatron runs that start from a Hugging Face checkpoint and/or train on instruction data.

The keys are AMD Primus' (``hf_path``, ``sft_dataset_name``, ``sft_conversation_format``,
``enable_packed_sequences``) plus ``sft_valid_dataset_name`` / ``sft_valid_fraction``; none of
them is a Megatron-LM argument, so they are taken out of the module section before it is parsed
(``strip_post_training``) and handed to the trainer as one ``MegatronPostTraining``:

* ``hf_path``: the HF model folder. Without a ``model:`` preset or shape keys the network is read
  from its ``config.json``; the tokenizer defaults to it. The weights are copied, sharded for
  this rank's TP/PP/EP position, into megatron-core's parameters before DDP and the optimizer
  are built (``primus.hf.megatron``).
* ``stage: sft`` + ``sft_dataset_name``: instruction JSONL (``primus.data.sft``), loss on
  response tokens only, padded or packed, with a validation split evaluated every
  ``eval_interval``.

Any of the three (model, data, tokenizer) may be a Hugging Face Hub id, as AMD's examples write
them (``hf_path: NousResearch/Meta-Llama-3-8B``, ``sft_dataset_name: tatsu-lab/alpaca``): validate,
plan and dry-run check them no further; when the run starts local rank 0 of each node fetches
them once into the HF cache and the run reads the local copies (``primus.compat.runtime``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primus.config.errors import ConfigError
from primus.data.sft import Format, SFTDataSpec

# The Megatron-LM shape arguments; any of them (or a `model:` block) means the user described the network.
_SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")


class MegatronPostTrainingKeys(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hf_path: str | None = Field(None, description="Hugging Face model folder (or Hub id) to start from")
    sft_dataset_name: str | None = Field(None, description="instruction JSONL file or folder, or a Hub dataset id "
                                                           "(stage sft)")
    sft_valid_dataset_name: str | None = None
    sft_valid_fraction: float = Field(0.05, ge=0, lt=1)
    sft_conversation_format: Format = "auto"
    enable_packed_sequences: bool = False


KEYS = tuple(MegatronPostTrainingKeys.model_fields)


def is_post_training(params: dict[str, Any]) -> bool:
    """Does the section use any of these keys (a run that starts from HF weights or trains on instructions)?"""
    return any(params.get(key) is not None for key in KEYS)


@dataclass
class MegatronPostTraining:
    hf_path: Path | str | None  # a str: a Hub id (validate / plan / dry-run; a run reads the local copy)
    sft: SFTDataSpec | None
    tokenizer_dir: str | None

    def load_weights(self, chunks: list, ctx) -> None:
        """Fill the (unwrapped) GPTModel chunks from ``hf_path``; says which checkpoint it loaded."""
        if self.hf_path is None:
            return
        from primus.hf.checkpoint import HFCheckpoint
        from primus.hf.config import model_spec_from_hf
        from primus.hf.megatron import load_hf_into_megatron

        checkpoint = HFCheckpoint(self.hf_path)
        spec = model_spec_from_hf(checkpoint.config, f"{self.hf_path}/config.json")
        filled = load_hf_into_megatron(chunks, checkpoint, spec)
        ctx.logger.info("loaded Hugging Face checkpoint %s (%s, %d tensors, %s) into megatron-core: %d local "
                        "shards on rank %d", checkpoint.dir, spec.family, len(checkpoint.names()), checkpoint.dtype(),
                        filled, ctx.rank)

    def datasets(self, seq_length: int, seed: int, ctx):
        """(train, valid) Megatron datasets of the instruction data."""
        from primus.data.sft import build_splits, describe, load_tokenizer
        from primus.data.sft_megatron import MegatronSFTDataset

        tokenizer = load_tokenizer(self.tokenizer_dir)
        spec = self.sft.model_copy(update={"seed": seed})
        train, valid = build_splits(spec, tokenizer, seq_length)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ctx.logger.info(describe("train", train, spec.packing))
        if valid is not None:
            ctx.logger.info(describe("valid", valid, spec.packing))
        return MegatronSFTDataset(train, pad), (MegatronSFTDataset(valid, pad) if valid is not None else None)


def _keys(params: dict[str, Any], prefix: str, provenance=None) -> MegatronPostTrainingKeys:
    present = {k: params[k] for k in KEYS if k in params}
    try:
        return MegatronPostTrainingKeys(**present)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = f"{prefix}.{error['loc'][0]}"
        where = f"{provenance.describe(key)}: " if provenance is not None else ""
        raise ConfigError(f"{where}{key}={error.get('input')!r}: {error['msg']}") from None


def strip_post_training(params: dict[str, Any], derived: list | None = None, *, prefix: str = "modules.pre_trainer",
                        provenance=None, tiny_root: Path | None = None) -> dict[str, Any]:
    """``params`` without the post-training keys, with what ``hf_path`` implies filled in:
    the ``model:`` block from its config.json (when the network is not described otherwise) and the
    tokenizer; an SFT run reads no pretraining ``data_path``. An ``hf_path`` inside ``tiny_root``
    (``primus.tiny_assets``) that does not exist yet is built first: its config.json is the model."""
    keys = _keys(params, prefix, provenance)
    params = {k: v for k, v in params.items() if k not in KEYS}
    note = derived.append if derived is not None else (lambda item: None)
    if keys.hf_path:
        from primus.hf.config import model_spec_from_hf, read_config

        hf_dir = Path(keys.hf_path).expanduser()
        if network_from_hub(params, keys.hf_path):
            params.update(provisional_network(params))
            note(("model", "read when the run starts", f"from {keys.hf_path}'s config.json on the Hugging Face Hub "
                  "(validate, plan and --dry-run check the layout, not the network)"))
        elif params.get("model") is None and not any(params.get(k) for k in _SHAPE_KEYS):
            if not (hf_dir / "config.json").is_file() and tiny_root is not None \
                    and hf_dir.absolute().is_relative_to(tiny_root):
                from primus.hf.tiny import ensure_tiny_sft_assets

                ensure_tiny_sft_assets(tiny_root)
            if not (hf_dir / "config.json").is_file():
                where = f"{provenance.describe(prefix + '.hf_path')}: " if provenance is not None else ""
                raise ConfigError(f"{where}{prefix}.hf_path: {hf_dir} has no config.json (a Hugging Face model "
                                  "folder), and no model preset describes the network")
            spec = model_spec_from_hf(read_config(hf_dir), f"{prefix}.hf_path: {hf_dir}/config.json")
            params["model"] = spec.model_dump(exclude_none=True)
            note(("model", f"{spec.family} {spec.n_layers}x{spec.dim}", f"from {hf_dir}/config.json (hf_path)"))
        if not params.get("tokenizer_model"):
            params.update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(hf_dir))
            note(("tokenizer_model", str(hf_dir), "hf_path"))
    if keys.sft_dataset_name and not params.get("data_path"):
        params["mock_data"] = True  # nothing reads it: the SFT datasets replace build_datasets
        note(("pretraining data", "none", "stage sft reads sft_dataset_name"))
    return params


def network_from_hub(params: dict[str, Any], hf_path: str | None = None) -> bool:
    """True when the network is known only from a Hub model's config.json, fetched when the run starts
    (``hf_path`` a Hub id, no ``model:`` preset nor shape keys): nothing before the run can describe it."""
    from primus.compat.hub import is_hub_id

    hf_path = params.get("hf_path") if hf_path is None else hf_path
    return is_hub_id(hf_path) and params.get("model") is None and not any(params.get(k) for k in _SHAPE_KEYS)


def provisional_network(params: dict[str, Any]) -> dict[str, Any]:
    """Shape arguments that only let Megatron-LM's argument checks run before the network is known:
    every split the layout asks for divides them (heads and groups by TP, layers by PP and virtual
    stages), so what is checked is the layout itself. The plan shows no model for them (no estimate);
    the run re-plans with the real config.json, fetched first."""
    tp = int(params.get("tensor_model_parallel_size") or 1)
    pp = int(params.get("pipeline_model_parallel_size") or 1)
    vpp = int(params.get("num_virtual_stages_per_pipeline_rank") or params.get("virtual_pipeline_model_parallel_size")
              or 1)
    heads = 8 * tp
    return {"num_layers": pp * vpp, "hidden_size": 64 * heads, "num_attention_heads": heads,
            "num_query_groups": tp, "group_query_attention": True, "ffn_hidden_size": 256 * heads, "vocab_size": 32000}


def post_training(params: dict[str, Any], stage: str, *, prefix: str = "modules.pre_trainer",
                  provenance=None) -> MegatronPostTraining | None:
    """The post-training part of a module section (None for a plain pretraining run)."""
    keys = _keys(params, prefix, provenance)
    where = f"{provenance.describe(prefix + '.sft_dataset_name')}: " if provenance is not None else ""
    if stage == "sft" and not keys.sft_dataset_name:
        raise ConfigError(f"{where}{prefix}.sft_dataset_name: stage sft needs instruction data (a JSONL file or folder)")
    if stage != "sft" and keys.sft_dataset_name:
        raise ConfigError(f"{where}{prefix}.sft_dataset_name: instruction data is read by stage: sft (this module's "
                          f"stage is {stage})")
    if not keys.hf_path and stage != "sft":
        return None
    sft = None
    if stage == "sft":
        sft = SFTDataSpec(path=keys.sft_dataset_name, valid_path=keys.sft_valid_dataset_name,
                          valid_fraction=keys.sft_valid_fraction, conversation_format=keys.sft_conversation_format,
                          packing=keys.enable_packed_sequences)
    tokenizer = params.get("tokenizer_model") or keys.hf_path
    if sft is not None and not tokenizer:
        raise ConfigError(f"{prefix}.tokenizer_model: stage sft needs a Hugging Face tokenizer (or hf_path)")
    return MegatronPostTraining(_model_reference(keys.hf_path), sft, tokenizer)


def _model_reference(hf_path: str | None) -> Path | str | None:
    """A local folder as an absolute path; a Hub id kept as written (fetched when the run starts)."""
    from primus.compat.hub import is_hub_id

    if not hf_path:
        return None
    return hf_path if is_hub_id(hf_path) else Path(hf_path).expanduser().absolute()


def hf_checkpoint_spec(params: dict[str, Any], save: Path):
    """The plan's ``CheckpointSpec`` when the run starts from ``hf_path`` (None otherwise)."""
    if not params.get("hf_path"):
        return None
    from primus.runtime.adapter import CheckpointSpec

    return CheckpointSpec(save, load=str(Path(params["hf_path"]).expanduser().absolute()), format="hf")


def check_post_training_inputs(plan, *, provenance=None) -> None:
    """Before launch: the HF checkpoint's every tensor name and shape against the model the plan
    builds, and the instruction files exist. One line naming the tensor and both shapes on a mismatch."""
    module = plan.module
    prefix = f"modules.{module.name}"
    post = post_training(module.params, module.stage, prefix=prefix, provenance=provenance)
    if post is None:
        return
    from primus.compat.hub import is_hub_id

    if post.sft is not None:
        from primus.data.sft import jsonl_files, record_files

        for key, path in (("sft_dataset_name", post.sft.path), ("sft_valid_dataset_name", post.sft.valid_path)):
            if path is None or is_hub_id(path):  # a Hub dataset: fetched when the run starts
                continue
            where = f"{provenance.describe(f'{prefix}.{key}')}: " if provenance is not None else ""
            if not Path(path).expanduser().exists():
                raise ConfigError(f"{where}{prefix}.{key}: {path} does not exist (a .jsonl file or a folder of them)")
            try:
                jsonl_files(path) if key == "sft_dataset_name" else record_files(path)
            except ConfigError as exc:  # a folder without training records: say what it holds
                raise ConfigError(f"{where}{prefix}.{key}: {exc}") from None
    if post.hf_path is None or isinstance(post.hf_path, str):  # a Hub id: checked once fetched, before training
        return
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec

    where = f"{prefix}.hf_path"
    if provenance is not None:
        where = f"{provenance.describe(where)}: {where}"
    if not post.hf_path.is_dir():
        raise ConfigError(f"{where}: {post.hf_path} does not exist")
    checkpoint = HFCheckpoint(post.hf_path)
    spec = plan.model
    if spec is None or not spec.vocab_size:
        raise ConfigError(f"{where}: the model's vocabulary is unknown (set vocab_size)")
    args = plan.engine_config
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    hf_vocab = checkpoint.config.get("vocab_size")
    if hf_vocab and spec.vocab_size != hf_vocab and spec.vocab_size == -(-hf_vocab // multiple) * multiple:
        spec = spec.model_copy(update={"vocab_size": hf_vocab})  # Megatron pads the vocabulary; HF does not
    check_against_spec(checkpoint, spec, where)
