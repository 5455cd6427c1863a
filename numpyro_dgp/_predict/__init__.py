"""Prediction (private): ``predict`` and ``sample_layers`` (``prediction``), the other
predictives (``variants``: over posterior samples, moment matched, collapsed), the predictive
mixtures' components (``mixture``), and the test metrics and quantiles (``metrics``). Sits above
the engine and the training drivers.
"""
