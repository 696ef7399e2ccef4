"""NeMo AutoModel's recipes, one per stage (the table: ``AutoModelAdapter.recipes``)."""
