"""Hugging Face checkpoints in and out: config.json <-> ModelSpec, safetensors reading and writing,
and each backend's tensor-name and layout mapping (``megatron``, ``torchtitan``)."""
