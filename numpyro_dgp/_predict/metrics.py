"""Scores and quantiles of a predictive mixture.

Regression (Normal and other continuous or count likelihoods): test log-likelihood, RMSE and
CRPS; classification (Bernoulli, categorical): log-likelihood, accuracy, error rate, Brier
score and expected calibration error. Quantiles of a regression prediction: bisection on the
distribution function of a continuous mixture, and the first count reaching each level for
counts.

**References:**

* Gneiting, Raftery (2007). Strictly proper scoring rules, prediction, and estimation. JASA.
* Naeini, Cooper, Hauskrecht (2015). Obtaining well calibrated probabilities using Bayesian
  binning. AAAI. (The expected calibration error.)
* Guo, Pleiss, Sun, Weinberger (2017). On calibration of modern neural networks. ICML.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp, ndtr
from jax.scipy.stats import norm
from jax.typing import ArrayLike

from numpyro_dgp._engine.observation import is_discrete
from numpyro_dgp._predict.mixture import rebuild
from numpyro_dgp._predict.prediction import Prediction
from numpyro_dgp._validation import concrete

#: equal-width confidence bins of the expected calibration error
ECE_BINS = 10
#: draws per point of the Monte Carlo CRPS of a ``"general"`` prediction
CRPS_DRAWS = 1000


def _target_shape(prediction: Prediction) -> tuple:
    """The shape ``y`` must have: the mean's, without a categorical prediction's classes."""
    shape = tuple(prediction.mean.shape)
    return shape[:-1] if prediction.likelihood == "categorical" else shape


def _check_targets(prediction: Prediction, y: ArrayLike, caller: str) -> jax.Array:
    """``y`` as an array, of the prediction's target shape and, for a classification prediction,
    holding class labels it has (0/1 for Bernoulli, ``0..C-1`` for categorical; traced values
    are not checked).

    :raises ValueError: for another shape or other labels.
    """
    y = jnp.asarray(y)
    if y.shape != _target_shape(prediction):
        raise ValueError(
            f"{caller}: y has shape {y.shape}, the prediction's targets have "
            f"{_target_shape(prediction)}"
        )
    if prediction.likelihood not in ("bernoulli", "categorical"):
        return y
    num_classes = 2 if prediction.likelihood == "bernoulli" else prediction.mean.shape[-1]
    values = concrete(y)
    if values is None:  # traced: not checked
        return y
    bad = ~np.isin(values, np.arange(num_classes))
    if bad.any():
        labels = "0/1 labels" if num_classes == 2 else f"labels in 0..{num_classes - 1}"
        raise ValueError(
            f"{caller}: y must hold only {labels} for a {prediction.likelihood} prediction; got "
            f"{int(bad.sum())} other value(s), e.g. {values[bad].ravel()[0].item()!r}"
        )
    return y


def _mix(lp: jax.Array, weights: jax.Array | None) -> jax.Array:
    """``log sum_s w_s exp(lp_s)`` over the leading component axis."""
    if weights is not None:
        return logsumexp(lp, axis=0, b=jnp.reshape(weights, (-1,) + (1,) * (lp.ndim - 1)))
    return logsumexp(lp, axis=0) - jnp.log(lp.shape[0])


def log_likelihood(prediction: Prediction, y: ArrayLike, per_column: bool = False) -> jax.Array:
    """Per-point log predictive density (or probability), shape ``(N,)``.

    Normal: ``log sum_s w_s N(y | m_s, v_s)``; Bernoulli: ``log sum_s w_s Bernoulli(y | p_s)``;
    categorical: ``log p(y)`` of the mixture's class probabilities; any other likelihood:
    ``log sum_s w_s sum_k w_k p(y | atom_sk)`` over its atoms (equal weights ``w_s = 1 / S``
    unless the prediction has ``weights``). A prediction with ``T`` target columns gives the
    joint density of each point's row (its columns share every component), or, with
    ``per_column``, each column's own marginal, ``(N, T)``.

    :param prediction: from :func:`predict` or :func:`predict_from_samples`.
    :param y: the test targets, shaped as ``prediction.mean`` (class labels ``(N,)`` for a
        categorical prediction).
    :param per_column: the marginal of every column instead of the joint of each row.
    :return: ``(N,)`` (``(N, T)`` with ``per_column``). Missing targets (NaN) are left out of a
        row's joint density (NaN in ``per_column``'s).
    :raises ValueError: targets of another shape, or labels the prediction does not have.
    """
    y = _check_targets(prediction, y, "log_likelihood")
    return _log_likelihood(prediction.likelihood, per_column, y, _arrays(prediction))


@partial(jax.jit, static_argnums=(0, 1))
def _log_likelihood(kind, per_column, y, p):
    # one program per shape: called outside jit, the operations would each compile on their own
    if kind == "categorical":
        probs = jnp.take_along_axis(p["mean"], y.astype(jnp.int32)[..., None], axis=-1)[..., 0]
        return jnp.log(jnp.maximum(probs, jnp.finfo(probs.dtype).tiny))
    present = ~jnp.isnan(y) if jnp.issubdtype(y.dtype, jnp.inexact) else jnp.ones(y.shape, bool)
    y = jnp.where(present, y, 0)
    if kind == "general":
        lp = jnp.where(present, p["atoms"].log_prob(y.astype(p["mean"].dtype)), 0.0)  # (S, K, N..)
        if not per_column:  # each node is a joint draw of the outputs: a row's joint density at it
            lp = jnp.sum(lp, axis=tuple(range(3, lp.ndim)))  # the column axes after (S, K, N)
        lp = logsumexp(lp, axis=1, b=jnp.reshape(p["atom_weights"], (-1,) + (1,) * (lp.ndim - 2)))
    else:
        if kind == "bernoulli":
            # probabilities clipped into [tiny, 1 - eps]: a component whose probability rounded
            # to 0 or 1 keeps a finite log-probability
            info = jnp.finfo(p["component_means"].dtype)
            probs = jnp.clip(p["component_means"], info.tiny, 1 - info.epsneg)
            lp = jnp.where(y == 1, jnp.log(probs), jnp.log1p(-probs))
        else:
            lp = norm.logpdf(y, p["component_means"], jnp.sqrt(p["component_variances"]))
        # a missing target adds nothing (a row's joint is over its present columns)
        lp = jnp.where(present, lp, 0.0)
        if not per_column:
            lp = jnp.sum(lp, axis=tuple(range(2, lp.ndim)))  # the column axes after (S, N)
    if per_column:
        return jnp.where(present, _mix(lp, p["weights"]), jnp.nan)
    return _mix(lp, p["weights"])


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

    :param y: ``(N,)`` observed values (or ``(N, T)``, each entry scored on its own).
    :param means: ``(S, N)`` component means (``(S, N, T)``).
    :param variances: ``(S, N)`` component variances (``(S, N, T)``).
    :param weights: ``(S,)`` component weights summing to 1 (default: ``1 / S`` each).
    :return: ``(N,)`` CRPS per point (``(N, T)``; lower is better).
    """
    y = jnp.asarray(y)
    S = means.shape[0]
    if weights is None:
        weights = jnp.full((S,), 1.0 / S, means.dtype)
    w = jnp.asarray(weights, means.dtype)
    # (S, N...) -> (N..., S)
    flat = lambda a: jnp.moveaxis(jnp.reshape(a, (S, -1)), 0, -1)  # noqa: E731

    def per_point(args):
        yi, mi, vi = args
        first = jnp.sum(w * _crps_A(yi - mi, vi))
        pair = _crps_A(mi[:, None] - mi[None, :], vi[:, None] + vi[None, :])
        return first - 0.5 * w @ pair @ w

    return jax.lax.map(per_point, (jnp.ravel(y), flat(means), flat(variances))).reshape(y.shape)


def _draws(arrays: dict, rng_key: jax.Array, num_draws: int) -> jax.Array:
    """``(R, N, ...)`` independent draws from a ``"general"`` prediction's mixture at every point:
    an atom is chosen by its weight ``w_s w_k``, then drawn from."""
    atoms = arrays["atoms"]
    S, K = atoms.batch_shape[:2]
    w_s = jnp.full((S,), 1.0 / S) if arrays["weights"] is None else arrays["weights"]
    cumulative = jnp.cumsum((w_s[:, None] * arrays["atom_weights"][None]).reshape(-1))
    pick_key, draw_key = jax.random.split(rng_key)
    rest = tuple(atoms.batch_shape[2:])
    # every point mixes its atoms with the same weights: invert their cumulative sum
    u = jax.random.uniform(pick_key, (num_draws,) + rest, cumulative.dtype) * cumulative[-1]
    index = jnp.minimum(jnp.searchsorted(cumulative, u), S * K - 1)  # (R, N, ...)
    chosen = rebuild(
        atoms, lambda a: jnp.take_along_axis(a.reshape((S * K,) + rest), index, axis=0)
    )
    return chosen.sample(draw_key)


def _sample_crps(y: jax.Array, draws: jax.Array) -> jax.Array:
    """The unbiased CRPS estimate from ``R`` draws per point: ``mean |X - y| - sum_ij |X_i -
    X_j| / (2 R (R - 1))``, the pair sum from the sorted draws."""
    R = draws.shape[0]
    first = jnp.mean(jnp.abs(draws - y), axis=0)
    ordered = jnp.sort(draws, axis=0)
    rank = jnp.arange(1, R + 1, dtype=draws.dtype).reshape((-1,) + (1,) * (draws.ndim - 1))
    pairs = 2 * jnp.sum((2 * rank - R - 1) * ordered, axis=0)  # sum_ij |X_i - X_j|
    return first - pairs / (2 * R * (R - 1))


def _calibration_error(confidence: jax.Array, correct: jax.Array) -> jax.Array:
    """The expected calibration error over :data:`ECE_BINS` equal-width confidence bins:
    ``sum_b (n_b / N) |accuracy_b - confidence_b|``."""
    bins = jnp.clip(jnp.floor(confidence * ECE_BINS).astype(jnp.int32), 0, ECE_BINS - 1)
    surplus = correct.astype(confidence.dtype) - confidence
    gap = jnp.zeros(ECE_BINS, confidence.dtype).at[bins].add(surplus)
    return jnp.sum(jnp.abs(gap)) / confidence.shape[0]


#: the array fields of a prediction the scores read
_ARRAYS = ("mean", "component_means", "component_variances", "weights", "atoms", "atom_weights")


def _arrays(prediction: Prediction) -> dict:
    return {k: getattr(prediction, k) for k in _ARRAYS}


# The scores are one program per shape each: eagerly, every small operation would compile on its
# own.
@partial(jax.jit, static_argnums=0)
def _classification_scores(kind: str, y: jax.Array, p: dict) -> dict:
    """Mean log-likelihood, accuracy, error rate, Brier score and expected calibration error."""
    probs = p["mean"]
    if kind == "bernoulli":
        predicted, confidence = probs > 0.5, jnp.maximum(probs, 1 - probs)
        correct = predicted == (y == 1)
        brier = jnp.mean((probs - y) ** 2)
    else:
        predicted, confidence = jnp.argmax(probs, axis=-1), jnp.max(probs, axis=-1)
        correct = predicted == y
        brier = jnp.mean(
            jnp.sum((probs - jax.nn.one_hot(y, probs.shape[-1], dtype=probs.dtype)) ** 2, axis=-1)
        )
    accuracy = jnp.mean(correct)
    return {
        "log_likelihood": jnp.mean(_log_likelihood(kind, False, y, p)),
        "accuracy": accuracy,
        "error_rate": 1 - accuracy,
        "brier": brier,
        "ece": _calibration_error(jnp.ravel(confidence), jnp.ravel(correct)),
    }


@partial(jax.jit, static_argnums=(0, 1))
def _regression_scores(
    kind: str, columns: bool, y: jax.Array, y_scale: jax.Array, p: dict, rng_key: jax.Array
) -> dict:
    """Mean log-likelihood, RMSE and CRPS (of each column with ``columns``) over the present
    (not NaN) targets, in the units ``y_scale`` maps back to."""
    present = ~jnp.isnan(y)
    count = jnp.sum(present, axis=0) if columns else jnp.sum(present)

    def reduce(a):
        return jnp.sum(jnp.where(present, a, 0.0), axis=0 if columns else None) / count

    lp = _log_likelihood(kind, columns, y, p)
    if columns:
        ll = reduce(lp) - jnp.log(y_scale)
    else:  # each row's joint density over its present columns, over the rows with any
        rows = present.reshape(y.shape[0], -1)
        log_scale = jnp.sum(
            jnp.where(rows, jnp.log(jnp.broadcast_to(y_scale, rows.shape[1:])), 0.0), axis=1
        )
        ll = jnp.sum(jnp.where(rows.any(axis=1), lp - log_scale, 0.0)) / jnp.sum(rows.any(axis=1))
    filled = jnp.where(present, y, p["mean"])
    rmse = jnp.sqrt(reduce(((filled - p["mean"]) * y_scale) ** 2))  # each column in its own units
    if kind == "normal":
        crps = gaussian_mixture_crps(
            filled, p["component_means"], p["component_variances"], p["weights"]
        )
    else:
        crps = _sample_crps(filled, _draws(p, rng_key, CRPS_DRAWS))
    return {"log_likelihood": ll, "rmse": rmse, "crps": reduce(crps * y_scale)}


# A compiled program returns its dict with sorted keys; the scores are reported in this order.
_SCORES = ("log_likelihood", "accuracy", "error_rate", "brier", "ece", "rmse", "crps")


def metrics(
    prediction: Prediction,
    y: ArrayLike,
    y_scale: ArrayLike = 1.0,
    *,
    per_column: bool = False,
    rng_key: jax.Array | None = None,
) -> dict:
    """Test metrics of a prediction.

    * Regression (Normal, and any other likelihood of a number: Student-t, Poisson, negative
      binomial, heteroscedastic Gaussian, ...): ``"log_likelihood"`` (the mean over points of
      :func:`log_likelihood`; with ``T`` columns, of each row's joint density), ``"rmse"`` of
      the predictive mean, and ``"crps"`` (closed form for Gaussian mixtures; otherwise the
      unbiased estimate from 1,000 draws per point of the predictive, a Monte Carlo standard
      error well below a percent of it).
    * Classification (Bernoulli ``y`` in {0, 1}; categorical ``y`` in ``0..C-1``):
      ``"log_likelihood"``, ``"accuracy"`` and ``"error_rate"`` of the most probable class,
      ``"brier"`` (``mean sum_c (p_c - [y = c])^2``; Bernoulli: ``mean (p - y)^2``) and
      ``"ece"``, the expected calibration error of the most probable class over 10 equal-width
      confidence bins.

    :param prediction: from :func:`predict` or :func:`predict_from_samples`.
    :param y: the test targets, shaped as ``prediction.mean`` (class labels ``(N,)`` for a
        categorical prediction); regression targets that are NaN (missing) are left out.
    :param y_scale: the targets' standard deviation (per column: ``(T,)``) if the model saw
        standardized targets: regression metrics are then reported in original units (LL minus
        the log scales, RMSE and CRPS times the scale). Continuous likelihoods only.
    :param per_column: with ``T`` target columns, a list of ``T`` values per regression metric
        (each column's marginal log-likelihood, RMSE, CRPS) instead of one.
    :param rng_key: key of the CRPS draws (default ``PRNGKey(0)``: the same scores every call).
    :return: ``{name: float}`` (lists of floats with ``per_column``).
    :raises ValueError: targets of another shape, labels the prediction does not have, a
        ``y_scale`` that is not finite and positive or of another shape, or one other than 1
        for a classification or count prediction.
    """
    kind = prediction.likelihood
    scale = np.asarray(y_scale, dtype=np.float64)
    columns = _target_shape(prediction)[1:]
    # a number (also as a Standardization's (1,) for a (N, 1) target), or one per column
    fits = scale.size == 1 or scale.shape == columns
    if not fits or not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError(
            f"metrics: y_scale must be a finite positive number, or one per target column "
            f"(shape {columns}); got {y_scale!r}"
        )
    scaled = not np.all(scale == 1.0)
    if kind in ("bernoulli", "categorical") and scaled:
        raise ValueError(
            f"metrics: y_scale applies to regression predictions; a {kind} prediction takes "
            f"y_scale=1.0, got {y_scale!r}"
        )
    if scaled and kind == "general" and is_discrete(prediction.atoms):
        raise ValueError(
            f"metrics: y_scale applies to continuous targets; {type(prediction.atoms).__name__} "
            f"predictions are of counts, got y_scale={y_scale!r}"
        )
    y = _check_targets(prediction, y, "metrics")
    arrays = _arrays(prediction)
    if kind in ("bernoulli", "categorical"):
        scores = _classification_scores(kind, y, arrays)
    else:
        y = y.astype(prediction.mean.dtype)
        key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        by_column = per_column and y.ndim > 1
        scores = _regression_scores(kind, by_column, y, jnp.asarray(y_scale, y.dtype), arrays, key)
    # floats (lists of floats for per-column scores)
    return {k: np.asarray(scores[k]).tolist() for k in _SCORES if k in scores}


def predictive_quantiles(prediction: Any, quantiles: ArrayLike) -> jax.Array:
    """Quantiles of a regression prediction's mixture (a :class:`~numpyro_dgp.Prediction` with a
    Normal or any other likelihood of a number), per point: by bisection on the mixture's
    distribution function, or, for counts, the smallest count whose probability of not being
    exceeded reaches the level (from the distribution function accumulated over the counts up
    to the largest mean plus 12 standard deviations, at most 10^6; NaN where that does not
    reach the level). The bisection takes 60 steps, which halve the starting bracket to below
    float64's resolution.

    :param prediction: the prediction.
    :param quantiles: ``(Q,)`` levels in ``(0, 1)``, e.g. ``[0.025, 0.975]``.
    :return: ``(Q, N)`` quantiles (``(Q, N, T)`` for ``T`` target columns).
    :raises ValueError: a classification prediction, or levels outside ``(0, 1)``.
    """
    if prediction.likelihood not in ("normal", "general"):
        raise ValueError(
            "predictive_quantiles: needs a regression prediction (Normal or another likelihood of "
            f"a number), got likelihood {prediction.likelihood!r}"
        )
    levels = np.atleast_1d(np.asarray(quantiles, np.float64))
    if not np.all((levels > 0) & (levels < 1)):
        raise ValueError(f"predictive_quantiles: quantiles must lie in (0, 1), got {quantiles!r}")
    q = jnp.asarray(levels, prediction.mean.dtype)
    arrays = _arrays(prediction)
    if prediction.atoms is not None and bool(prediction.atoms.support.is_discrete):
        mean = np.asarray(prediction.mean)
        spread = np.sqrt(np.maximum(np.asarray(prediction.variance), 0.0))
        largest = int(np.nanmax(np.where(np.isfinite(spread), mean + 12 * spread, 0.0))) + 10
        return _count_quantiles(q, arrays, min(largest, 1_000_000))
    return _bisect_quantiles(q, arrays)


def _component_weights(arrays: dict) -> jax.Array:
    """``(S, K)`` weights of every atom (``(S, 1)`` for Gaussian components)."""
    m, w = arrays["component_means"], arrays["weights"]
    if w is None:
        w = jnp.full((m.shape[0],), 1.0 / m.shape[0], m.dtype)
    atom_weights = jnp.ones((1,), m.dtype) if arrays["atoms"] is None else arrays["atom_weights"]
    return w[:, None] * atom_weights[None]


# One program per shape: eagerly, every operation of the loops would compile on its own.
@jax.jit
def _bisect_quantiles(q: jax.Array, arrays: dict) -> jax.Array:
    """Bisection on the mixture's distribution function, from a bracket around the components
    widened until it holds every level (heavy tails)."""
    m, v = arrays["component_means"], arrays["component_variances"]
    # (S, K, N...)
    weights = _component_weights(arrays).reshape((m.shape[0], -1) + (1,) * (m.ndim - 1))
    s = jnp.sqrt(jnp.maximum(v, jnp.finfo(v.dtype).tiny))

    def cdf(x):  # (Q, N...) -> (Q, N...)
        if arrays["atoms"] is None:
            at = norm.cdf((x[:, None, None] - m[None, :, None]) / s[None, :, None])
        else:
            at = arrays["atoms"].cdf(x[:, None, None])
        return jnp.sum(weights[None] * at, axis=(1, 2))

    q_full = q.reshape((-1,) + (1,) * (m.ndim - 1))
    spread = jnp.where(jnp.isfinite(s), s, 1.0)
    z = jnp.max(jnp.abs(norm.ppf(q))) + 1
    lo = jnp.broadcast_to(jnp.min(m - z * spread, axis=0), q.shape + m.shape[1:])
    hi = jnp.broadcast_to(jnp.max(m + z * spread, axis=0), lo.shape)

    def unbracketed(state):
        lo, hi, count = state
        return (count < 64) & (jnp.any(cdf(lo) >= q_full) | jnp.any(cdf(hi) < q_full))

    def widen(state):
        lo, hi, count = state
        width = hi - lo + 1.0
        return (
            jnp.where(cdf(lo) < q_full, lo, lo - width),
            jnp.where(cdf(hi) >= q_full, hi, hi + width),
            count + 1,
        )

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < q_full
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi, _ = jax.lax.while_loop(unbracketed, widen, (lo, hi, 0))
    lo, hi = jax.lax.fori_loop(0, 60, halve, (lo, hi))
    return 0.5 * (lo + hi)


#: entries of the probability table of one block of counts (counts x components x atoms)
_COUNT_TABLE_ENTRIES = 1 << 22


@partial(jax.jit, static_argnums=2)
def _count_quantiles(q: jax.Array, arrays: dict, largest: int) -> jax.Array:
    """Quantiles of a mixture of count distributions: its distribution function accumulated
    over blocks of the counts ``0 .. largest`` (a table of at most :data:`_COUNT_TABLE_ENTRIES`
    at a time), point by point, and the first count that reaches each level (NaN for a level
    the counts up to ``largest`` do not reach)."""
    atoms = arrays["atoms"]
    weights = _component_weights(arrays)  # (S, K)
    S, K = weights.shape
    points = arrays["component_means"].shape[1:]
    block = max(1, min(largest + 1, _COUNT_TABLE_ENTRIES // (S * K)))
    starts = jnp.arange(0, largest + 1, block)
    levels = q * (1 - 1e-12)

    def at_point(index):  # the atoms of one point (of one column): (S, K)
        point = rebuild(atoms, lambda a: a.reshape(S, K, -1)[:, :, index])

        def accumulate(carry, start):
            # the distribution function before this block; counts found (-1: not yet)
            below, found = carry
            counts = (start + jnp.arange(block)).astype(q.dtype)
            pmf = jnp.exp(point.log_prob(counts[:, None, None]))  # (block, S, K)
            cdf = below + jnp.cumsum(jnp.sum(pmf * weights[None], axis=(1, 2)))
            # the smallest count in the block with cdf >= q, or block
            first = jnp.searchsorted(cdf, levels)
            found = jnp.where((found < 0) & (first < block), start + first, found)
            return (cdf[-1], found), None

        (_, found), _ = jax.lax.scan(
            accumulate, (jnp.zeros((), q.dtype), jnp.full(q.shape, -1)), starts
        )
        return jnp.where(found < 0, jnp.nan, found.astype(q.dtype))

    per_point = jax.lax.map(at_point, jnp.arange(int(np.prod(points))))  # (N T, Q)
    return per_point.T.reshape(q.shape + points)
