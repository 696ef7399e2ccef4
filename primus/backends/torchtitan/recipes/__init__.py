"""TorchTitan's recipes, one per stage (the table: ``TorchTitanAdapter.recipes``)."""
