"""Persistence helpers (private): the parameter sites a model and guide create and the checks
of given parameters against them (``params``), and the reading and checks of a saved model's
directory (``model_files``, NumPy only: the command line runs them before JAX loads). Below the
training drivers, which check ``init_params`` with them.
"""
