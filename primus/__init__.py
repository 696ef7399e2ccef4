"""Primus: one experiment file, one command, real engines behind one adapter contract."""
__version__ = "0.1.0"
