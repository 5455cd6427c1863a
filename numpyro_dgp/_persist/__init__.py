"""Persistence helpers (private): the parameter sites a model and guide create and the checks
of given parameters against them (``params``), the result tables (``tables``) and the UCI
split files (``uci_files``). Below the training drivers, which check ``init_params`` with them.
"""
