"""A rank's random number streams, as Megatron-LM's ``get_rng_state`` collects them: what every
checkpoint format (torch_dist, legacy, fsdp_dtensor) saves and restores."""
from __future__ import annotations

import random


def rng_streams() -> dict:
    """This rank's RNG streams, as Megatron-LM's ``get_rng_state`` collects them."""
    import numpy
    import torch
    from megatron.core import tensor_parallel

    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": numpy.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    return state
