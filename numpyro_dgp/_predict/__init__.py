"""Prediction (private): ``predict`` and its engines (``prediction``, ``deterministic``,
``samples``), the predictive mixtures (``mixture``), their quantiles (``quantiles``) and the
test metrics (``metrics``). Sits above the engine and the training drivers.
"""
