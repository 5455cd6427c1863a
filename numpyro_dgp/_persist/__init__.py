"""Persistence helpers (private): the parameter sites a model and guide create and the checks
of given parameters against them (``params``), the result tables (``tables``), the UCI
split files (``uci_files``), the standardization and argument encoding a saved model records
(``standardization``, ``encoding``) and the reading and checks of a saved model's directory
(``model_files``). Below the training drivers, which check ``init_params`` with them.
"""
