"""The inducing-marginalization and moment engine (private).

``marginal`` holds the two handlers that integrate each layer's inducing values out under a
guide's Gaussian: point by point with sampled inner layers (``marginalize_inducing``) and by
Gaussian moment propagation (``propagate_moments``); ``run`` runs a guide and then the model
under one of them and reads layers and guide Gaussians (NumPyro's own autoguides' too) off
their traces; ``observation`` reads the likelihood sites after the last layer.
Used by the objectives and by prediction; imports only the layers below it (core,
the message protocol, layers, handlers, guides' posteriors and the plug-ins
``numpyro_dgp.guides`` exports for it).
"""
