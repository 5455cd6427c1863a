"""Persistence helpers (private, NumPy only: the command line runs them before JAX loads): the
reading and checks of a saved model's directory and atomic file writes (``model_files``), and
the reading of data tables (``tables``).
"""
