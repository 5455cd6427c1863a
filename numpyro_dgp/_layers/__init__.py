"""The parts of the layer primitives (private): ``gp_layer``'s argument checks, hyperparameter,
mean-function and noise sites (``parts``) and the ``latent_input`` primitive (``latent``).
"""
