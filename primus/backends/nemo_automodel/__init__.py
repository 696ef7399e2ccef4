"""NeMo AutoModel backend (Wan 2.2 text-to-video diffusion). Engine imports stay inside methods."""
