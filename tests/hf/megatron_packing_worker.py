"""Per-token losses of the same conversations packed and padded, through megatron-core's GPT model.

    torchrun --nproc-per-node 1 megatron_packing_worker.py HF_DIR OUT.json

The model is built and filled from the HF checkpoint as the trainer does (``megatron_logits_worker``);
the batches are the Megatron SFT dataset's items (tokens, labels, loss_mask, position_ids and the
block-diagonal attention_mask), fed to the model's own loss (``labels=``) in fp32.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from megatron_logits_worker import finish, model_from_hf, start
from packing_conversations import CONVERSATIONS


def response_losses(model, rows, pad_id: int, causal_only: bool = False):
    """The losses of the loss-carrying tokens of ``rows``, in order (``causal_only``: without the document mask)."""
    import torch

    from primus.backends.megatron.sft_data import MegatronSFTDataset
    from primus.data.sft import SFTSequences

    out = []
    for row in rows:
        item = MegatronSFTDataset(SFTSequences([row], seed=0), pad_id)[0]
        mask = item["attention_mask"]
        if causal_only:
            n = mask.shape[-1]
            mask = ~torch.tril(torch.ones(n, n, dtype=torch.bool)).unsqueeze(0)
        with torch.no_grad():
            losses = model(item["tokens"][None], item["position_ids"][None], mask[None], labels=item["labels"][None])
        out.append(losses[0][item["loss_mask"].bool()])
    return torch.cat(out)


def main() -> int:
    hf_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch, dist = start(1)
    from primus.data.sft import build_sequences, load_tokenizer, tokenize

    _, _, chunks = model_from_hf(hf_dir, 1)
    model = chunks[0].eval()
    tokenizer = load_tokenizer(hf_dir)
    examples = [tokenize(record, tokenizer) for record in CONVERSATIONS]
    seq_len = sum(len(e.tokens) - 1 for e in examples) + 5  # one packed row, a padding document at its end
    pad = tokenizer.pad_token_id
    packed, _ = build_sequences(examples, seq_len, pad, packing=True)
    padded, _ = build_sequences(examples, seq_len, pad, packing=False)
    packed_losses = response_losses(model, packed, pad)
    padded_losses = response_losses(model, padded, pad)
    leaked = response_losses(model, packed, pad, causal_only=True)
    out.write_text(json.dumps({
        "rows": [len(packed), len(padded)], "tokens": [packed_losses.numel(), padded_losses.numel()],
        "max_abs_diff": (packed_losses - padded_losses).abs().max().item(),
        "mean_loss": padded_losses.mean().item(),
        "causal_only_diff": (leaked - padded_losses).abs().max().item()}))
    return finish(dist)


if __name__ == "__main__":
    from primus.runtime.worker import end_process  # a rank's end, without the gloo abort at exit

    end_process(main())
