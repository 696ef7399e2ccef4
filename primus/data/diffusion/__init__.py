"""Wan 2.2 video data for the NeMo AutoModel backend: caption reading, latent-cache
preprocessing, and a tiny random pipeline for demos and tests (built locally, no hub)."""
