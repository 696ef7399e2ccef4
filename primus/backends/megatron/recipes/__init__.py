"""Megatron's recipes, one per stage (the table: ``MegatronAdapter.recipes``)."""
