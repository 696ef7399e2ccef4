"""Each framework's translation table (``megatron.py``, ``torchtitan.py``, ``nemo_automodel.py``), by name."""
from __future__ import annotations

from primus.compat import megatron, nemo_automodel, torchtitan
from primus.compat.rules import Rule

TABLES: dict[str, dict[str, Rule]] = {
    "megatron": megatron.RULES,
    "torchtitan": torchtitan.RULES,
    "nemo_automodel": nemo_automodel.RULES,
}
