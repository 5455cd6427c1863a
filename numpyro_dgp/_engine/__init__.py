"""The inducing-marginalization and moment engine (private).

``marginal`` integrates each layer's inducing values out point by point under a guide's Gaussian
(the handler ``marginalize_inducing``); ``run`` runs a guide and then the model under it and
reads layers and guide Gaussians (NumPyro's own autoguides' too) off their traces; ``moments``
propagates Gaussian moments through the layers; ``observation`` reads the likelihood sites
after the last layer.
Used by the objectives and by prediction; imports only the layers below it (core,
the message protocol, layers, handlers, guides' posteriors and the plug-ins
``numpyro_dgp.guides`` exports for it).
"""
