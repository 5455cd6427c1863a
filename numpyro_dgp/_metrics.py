"""Scores of a predictive mixture: test log-likelihood, RMSE, CRPS; error rate and Brier score.

**References:**

* Gneiting, Raftery (2007). Strictly proper scoring rules, prediction, and estimation. JASA.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp, ndtr
from jax.scipy.stats import norm
from jax.typing import ArrayLike

from numpyro_dgp._prediction import Prediction

__all__ = ["gaussian_mixture_crps", "log_likelihood", "metrics"]


def _check_binary_labels(y, caller):
    """Raise ``ValueError`` unless a concrete ``y`` holds only 0/1 (traced values are not checked)."""
    bad = ~((y == 0) | (y == 1))
    try:
        any_bad = bool(jnp.any(bad))
    except jax.errors.ConcretizationTypeError:
        return  # traced: cannot check here
    if any_bad:
        first = jnp.ravel(y)[jnp.argmax(jnp.ravel(bad))].item()
        raise ValueError(
            f"{caller}: y must hold only 0/1 labels for a Bernoulli prediction; got "
            f"{int(jnp.sum(bad))} other value(s), e.g. {first!r}"
        )


def _bernoulli_log_prob(y, probs):
    """``log Bernoulli(y | probs)`` with ``probs`` clipped into ``[tiny, 1 - eps]`` (a component
    whose probability rounded to 0 or 1 keeps a finite log-probability)."""
    info = jnp.finfo(probs.dtype)
    p = jnp.clip(probs, info.tiny, 1 - info.epsneg)
    return jnp.where(y == 1, jnp.log(p), jnp.log1p(-p))


def log_likelihood(prediction: Prediction, y: ArrayLike) -> jax.Array:
    """Per-point mixture log-probability, shape ``(N,)``.

    Normal: ``logsumexp_s log N(y | m_s, v_s) - log S``. Bernoulli:
    ``logsumexp_s log Bernoulli(y | p_s) - log S`` (``y`` in {0, 1}). With component
    ``weights``, ``logsumexp_s (log w_s + log p(y | component s))``.

    :param prediction: from :func:`predict` or :func:`predict_from_samples`.
    :param y: ``(N,)`` test targets.
    :return: ``(N,)`` log predictive density (Normal) or probability (Bernoulli) per point.
    """
    y = jnp.asarray(y)
    if prediction.likelihood == "bernoulli":
        _check_binary_labels(y, "log_likelihood")
    return _mixture_log_likelihood(prediction.likelihood == "bernoulli", y, prediction.component_means,
                                   prediction.component_variances, prediction.weights)


# One program per shape: called outside jit, the operations would each compile on their own.
@partial(jax.jit, static_argnums=0)
def _mixture_log_likelihood(bernoulli, y, component_means, component_variances, weights):
    if bernoulli:
        lp = _bernoulli_log_prob(y, component_means)
    else:
        lp = norm.logpdf(y, component_means, jnp.sqrt(component_variances))
    if weights is not None:
        return logsumexp(lp, axis=0, b=weights[:, None])
    return logsumexp(lp, axis=0) - jnp.log(lp.shape[0])


def _crps_A(mu, var):
    s = jnp.sqrt(var)
    z = mu / s
    return 2 * s * norm.pdf(z) + mu * (2 * ndtr(z) - 1)


def gaussian_mixture_crps(
    y: ArrayLike, means: jax.Array, variances: jax.Array, weights: ArrayLike | None = None
) -> jax.Array:
    """CRPS (Gneiting & Raftery, 2007) of an equally (or ``weights``-) weighted Gaussian
    mixture, per point.

    ``sum_s w_s A(y - mu_s, s_s^2) - 0.5 sum_ij w_i w_j A(mu_i - mu_j, s_i^2 + s_j^2)`` with
    ``A(mu, s2) = 2 s phi(mu / s) + mu (2 Phi(mu / s) - 1)``, where ``s = sqrt(s2)``.

    :param y: ``(N,)`` observed values.
    :param means: ``(S, N)`` component means.
    :param variances: ``(S, N)`` component variances.
    :param weights: ``(S,)`` component weights summing to 1 (default: ``1 / S`` each).
    :return: ``(N,)`` CRPS per point (lower is better).
    """
    S = means.shape[0]
    w = jnp.full((S,), 1.0 / S, means.dtype) if weights is None else jnp.asarray(weights, means.dtype)

    def per_point(args):
        yi, mi, vi = args
        first = jnp.sum(w * _crps_A(yi - mi, vi))
        pair = _crps_A(mi[:, None] - mi[None, :], vi[:, None] + vi[None, :])
        return first - 0.5 * w @ pair @ w

    return jax.lax.map(per_point, (jnp.asarray(y), means.T, variances.T))


def _classification_metrics(prediction: Prediction, y) -> dict:
    """Mean log-likelihood, error rate (threshold 0.5 on the mixture probability) and Brier score."""
    _check_binary_labels(y, "metrics")
    y = y.astype(prediction.mean.dtype)
    ll = log_likelihood(prediction, y).mean()
    error_rate = jnp.mean((prediction.mean > 0.5) != (y == 1))
    brier = jnp.mean((prediction.mean - y) ** 2)
    return {"log_likelihood": float(ll), "error_rate": float(error_rate), "brier": float(brier)}


def metrics(prediction: Prediction, y: ArrayLike, y_scale: float = 1.0) -> dict[str, float]:
    """Test metrics of a prediction.

    Normal: mean log-likelihood, RMSE and CRPS. Bernoulli (``y`` in {0, 1}): mean
    log-likelihood, error rate (predicted class ``1`` where the mixture probability exceeds
    0.5) and Brier score ``mean (p - y)^2``.

    :param prediction: from :func:`predict` or :func:`predict_from_samples`.
    :param y: ``(N,)`` test targets (the shape of ``prediction.mean``).
    :param y_scale: the targets' standard deviation if the model saw standardized targets:
        metrics are then reported in original units (LL - log y_scale, RMSE and CRPS times
        y_scale). Normal predictions only.
    :return: ``{"log_likelihood", "rmse", "crps"}`` (Normal) or ``{"log_likelihood",
        "error_rate", "brier"}`` (Bernoulli) as Python floats.
    """
    y = jnp.asarray(y)
    if y.shape != prediction.mean.shape:
        raise ValueError(f"metrics: y has shape {y.shape}, predictions have {prediction.mean.shape}")
    if prediction.likelihood == "bernoulli":
        if y_scale != 1.0:
            raise ValueError(
                f"metrics: y_scale applies to Normal predictions; a Bernoulli prediction takes "
                f"y_scale=1.0, got {y_scale!r}"
            )
        return _classification_metrics(prediction, y)
    ll = log_likelihood(prediction, y).mean() - jnp.log(y_scale)
    rmse = jnp.sqrt(jnp.mean((y - prediction.mean) ** 2)) * y_scale
    crps = gaussian_mixture_crps(
        y, prediction.component_means, prediction.component_variances, prediction.weights
    ).mean() * y_scale
    return {"log_likelihood": float(ll), "rmse": float(rmse), "crps": float(crps)}
