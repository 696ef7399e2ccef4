"""Bare-engine drivers: the same model, data and native config as the Primus run, engine API only."""
