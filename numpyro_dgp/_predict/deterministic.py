"""Deterministic predictions: moment matching through the layers, and the FITC / VFE predictive.

Both return a :class:`~numpyro_dgp.Prediction` with one mixture component (a Gaussian per test
point for a Normal likelihood), so :func:`~numpyro_dgp.metrics` scores them like a sampled
prediction.

**References:**

* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
"""

from __future__ import annotations

from typing import Callable, cast

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from numpyro.handlers import seed, substitute, trace

from numpyro_dgp._engine.marginal import marginalize_inducing
from numpyro_dgp._engine.moments import moment_trace
from numpyro_dgp._engine.observation import shared_rule
from numpyro_dgp._predict.mixture import PREDICTION_NODES, Component, component_of, mixture_fields
from numpyro_dgp._predict.prediction import (
    Prediction,
    abstract,
    check_guide_is_set_up,
    checked_test_inputs,
    observation_of,
    warn_if_not_finite,
)
from numpyro_dgp.core import collapsed_posterior
from numpyro_dgp.objectives._collapsed import CollapsedData, collapse_sparse_layer


def _one_component(likelihood: str, component: Component, node_weights: ArrayLike) -> Prediction:
    """The prediction of a single (deterministic) component."""
    stacked = jax.tree_util.tree_map(lambda a: a[None], component)
    return Prediction(
        **mixture_fields(likelihood, stacked, None, node_weights), likelihood=likelihood
    )


def predict_moment_matched(
    model: Callable,
    guide: Callable,
    params: dict,
    X_new: ArrayLike,
    *args,
    obs_site: str | None = None,
    **kwargs,
) -> Prediction:
    """Deterministic predictive of a fitted DGP by exact moment matching through the layers.

    Each layer's output at each test point is replaced by the Gaussian with its exact mean and
    variance under the Gaussian input the layer before hands on and the guide's ``q(u_l)``
    (psi statistics, :func:`~numpyro_dgp.core.uncertain_input_moments`): mean
    ``x^T W + b + Psi1_n K^-1 m`` and variance ``noise + psi0_n - tr(K^-1 Psi2_n) +
    tr(K^-1 Psi2_n K^-1 (m m^T + S)) - (Psi1_n K^-1 m)^2`` (plus a linear mean function's
    share), the outputs of a layer treated as independent. The last layer's Gaussian is mapped
    through the likelihood as :func:`~numpyro_dgp.predict` does. No sampling: one mixture
    component per test point. For models and guides
    :class:`~numpyro_dgp.objectives.NestedCompressionElbo` accepts (any noise on the layers, which
    the prediction includes); inner layers need not have noise here.

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param guide: the fitted guide (an independent Gaussian per layer).
    :param params: the fitted parameters (``FitResult.params``).
    :param X_new: ``(N, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param kwargs: keyword arguments of the model.
    :return: :class:`~numpyro_dgp.Prediction` with one component.
    :raises ValueError: for invalid ``X_new`` or a guide that has not been set up.
    :raises NotImplementedError: for what moment propagation cannot do (see
        :class:`~numpyro_dgp.objectives.NestedCompressionElbo`).
    """
    caller = "predict_moment_matched"
    check_guide_is_set_up(guide, caller)
    X_new = checked_test_inputs(X_new, caller, params, model, guide)
    key = jax.random.PRNGKey(0)  # the guide's draws are not used: the moments are deterministic

    def run(params, X_new, num_nodes, kind="normal"):
        inputs = (X_new,) + tuple(args)
        return moment_trace(
            model, guide, params, key, inputs, kwargs, "predict", num_nodes, caller, kind=kind
        )

    def probe():
        out = run(params, X_new, 3)
        return observation_of(out.model_trace, obs_site, caller), list(out.layer_order)

    (name, likelihood), layers = abstract(probe)

    @jax.jit
    def run_once(params, X_new):
        out = run(params, X_new, PREDICTION_NODES[likelihood], likelihood)
        tr, moments, weights = out.model_trace, out.moments, out.node_weights
        return component_of(tr, moments, name, likelihood, weights, layers, key), weights

    component, node_weights = run_once(params, X_new)
    return warn_if_not_finite(_one_component(likelihood, component, node_weights), caller)


def predict_collapsed(
    model: Callable,
    params: dict,
    X: ArrayLike,
    y: ArrayLike,
    X_new: ArrayLike,
    *args,
    method: str = "vfe",
    obs_site: str | None = None,
    **kwargs,
) -> Prediction:
    """The FITC or VFE predictive of a one-layer model fitted with
    :class:`~numpyro_dgp.objectives.CollapsedSparseGP`.

    The inducing values' Gaussian is the one the method implies given the training data
    (:func:`~numpyro_dgp.core.collapsed_posterior`: ``N(K Sigma K_uf Lambda^-1 y, K Sigma K)``,
    ``Sigma = (K + K_uf Lambda^-1 K_fu)^-1``, with ``Lambda = diag(K_ff - Q_ff) + sigma^2 I`` for
    FITC and ``sigma^2 I`` for VFE, the latter Titsias' optimal ``q(u)``), and the layer's
    marginal at ``X_new`` under it is mapped through the likelihood: for a Normal, mean
    ``K_*u Sigma K_uf Lambda^-1 y`` and variance ``K_** - Q_** + K_*u Sigma K_u* + sigma^2``.

    :param model: the model; called as ``model(X, y, *args, **kwargs)`` on the training data
        and ``model(X_new, *args, **kwargs)`` to predict.
    :param params: the fitted parameters.
    :param X: ``(N, D)`` training inputs.
    :param y: the training targets, as the model takes them.
    :param X_new: ``(N_new, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param method: ``"vfe"`` or ``"fitc"``: the objective the model was fitted with.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param kwargs: keyword arguments of the model.
    :return: :class:`~numpyro_dgp.Prediction` with one component.
    :raises ValueError: for invalid inputs or an unknown ``method``.
    :raises NotImplementedError: for models the collapsed objective does not take.
    """
    caller = "predict_collapsed"
    X_new = checked_test_inputs(X_new, caller, params)
    key = jax.random.PRNGKey(0)  # nothing is sampled: the u site's draw is replaced
    fitted = substitute(seed(model, key), data=params)
    handler = collapse_sparse_layer(fitted, method, caller)
    trace(handler).get_trace(jnp.asarray(X), y, *args, **kwargs)
    # None only for a model without a gp_layer, which fails at the first attribute as before
    data = cast(CollapsedData, handler.data)
    layer = data.layer
    q = collapsed_posterior(
        layer.Kmm_chol,
        layer.kernel(layer.inducing_inputs, data.X),
        layer.kernel.diag(data.X),
        data.residual,
        data.noise_var,
        method=method,
        whiten=layer.whiten,
    )

    def run(num_nodes, kind):
        nodes, weights = shared_rule(layer.out_dim, kind, num_nodes, caller)
        m = marginalize_inducing(fitted, {layer.u_site: q}, layer.name, nodes, weights)
        return trace(m).get_trace(X_new, *args, **kwargs), m.moments, weights

    name, likelihood = abstract(lambda: observation_of(run(3, "normal")[0], obs_site, caller))
    tr, moments, weights = run(PREDICTION_NODES[likelihood], likelihood)
    component = component_of(tr, moments, name, likelihood, weights, [layer.name], key)
    return warn_if_not_finite(_one_component(likelihood, component, weights), caller)
