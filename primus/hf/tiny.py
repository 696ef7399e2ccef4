"""Tiny Hugging Face models built locally from a ``transformers`` config (no hub).

``build_tiny_hf_model(out, family)`` writes what a released checkpoint has: ``config.json``,
``model.safetensors`` (random init, seeded) and a tokenizer with a chat template. Tests and the
tiny SFT examples start from these exactly as users start from a downloaded model.

A plan is pure, so it cannot build them: ``hf_config(folder, tiny_root)`` reads a folder's
``config.json``, or, for the tiny model ``primus.tiny_assets`` will build there, the config it will
hold (``tiny_hf_config``; a test checks it equals the built file).
"""
from __future__ import annotations

import fcntl
from pathlib import Path

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2  # the trainer adds the special tokens first, in this order
TURN_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB = 512
# (layers, hidden, heads, kv heads, ffn): ~0.7M parameters, trains in seconds on a CPU
SHAPE = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
FAMILIES = ("llama", "qwen2", "qwen3", "mixtral")


def build_chat_tokenizer(out_dir: Path, texts: list[str], vocab_size: int = VOCAB):
    """A byte-level BPE with the special tokens and chat template of ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD, *TURN_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=TURN_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_config(family: str, **shape):
    """A transformers config of ``family`` with the tiny shape (``shape`` overrides it)."""
    from transformers import AutoConfig

    kwargs = dict(SHAPE, vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
                  bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if family == "qwen3":
        kwargs["head_dim"] = 48  # Qwen3 sets head_dim apart from hidden / heads
    if family == "mixtral":
        kwargs.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=96)
    kwargs.update(shape)
    return AutoConfig.for_model(family, **kwargs)


def build_tiny_hf_model(out_dir: str | Path, family: str = "llama", *, seed: int = 0, texts: list[str] | None = None,
                        **shape) -> Path:
    """Write a tiny random ``family`` model + chat tokenizer to ``out_dir`` once (file-locked, reused)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir).expanduser().absolute()
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return out
        if texts is None:
            from primus.data.sft_tiny import sample_texts

            texts = sample_texts()
        tokenizer = build_chat_tokenizer(out, texts)
        config = tiny_config(family, **shape)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.config.architectures = [type(model).__name__]
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
        model.save_pretrained(str(out))
        done.write_text("ok\n")
    return out


def tiny_model_dir(root: str | Path, family: str = "llama") -> Path:
    """Where ``ensure_tiny_sft_assets(root)`` puts the tiny ``family`` model."""
    return Path(root).expanduser().absolute() / "hf" / f"{family}_tiny"


def tiny_hf_config(family: str = "llama") -> dict:
    """The ``config.json`` the tiny ``family`` model will have, without building it."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    return config.to_dict()


def hf_config(folder: str | Path, tiny_root: Path | None = None) -> dict:
    """A HF model folder's ``config.json``; for the tiny model ``primus.tiny_assets`` (``tiny_root``)
    will build there but has not yet, the config it will have."""
    from primus.hf.config import read_config

    folder = Path(folder).expanduser().absolute()
    if not (folder / "config.json").is_file() and tiny_root is not None:
        for family in FAMILIES:
            if folder == tiny_model_dir(tiny_root, family):
                return tiny_hf_config(family)
    return read_config(folder)


def ensure_tiny_sft_assets(root: str | Path, family: str = "llama") -> dict[str, Path]:
    """``root/hf/<family>_tiny`` (model + chat tokenizer) and ``root/sft/*.jsonl`` (instructions)."""
    from primus.data.sft_tiny import write_instruction_files

    root = Path(root).expanduser().absolute()
    model = build_tiny_hf_model(tiny_model_dir(root, family), family)
    files = write_instruction_files(root / "sft")
    return {"model": model, **files}
