"""The parts of the layer primitives (private): ``gp_layer``'s argument checks, hyperparameter,
mean-function and noise sites (``parts``), the inducing inputs, the factor of ``K(Z, Z)`` and the
prior of the inducing values (``inducing``) and the ``latent_input`` primitive (``latent``).
"""
