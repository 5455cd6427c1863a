"""Tolerances for Monte Carlo comparisons in the tests.

A stochastic test compares an estimate with its target (or two estimates with each other) to
within ``z`` standard errors, where the standard error comes from the draws themselves and ``z`` is
chosen so that a correct implementation fails with probability below ``FALSE_ALARM`` over all the
comparisons the test makes (Bonferroni, two-sided).
"""

import numpy as np
from scipy.stats import norm

FALSE_ALARM = 1e-4


def z_threshold(num_comparisons: int = 1, false_alarm: float = FALSE_ALARM) -> float:
    """Two-sided normal quantile keeping the family-wise false-alarm rate below ``false_alarm``
    over ``num_comparisons`` comparisons (at least 4, as a margin on the normal approximation)."""
    return max(4.0, float(norm.isf(false_alarm / (2 * num_comparisons))))


def mcmc_mean_and_se(draws):
    """Mean over chains and draws, and its standard error from the effective sample size.

    ``draws`` has shape (chains, draws, ...). MCMC draws are autocorrelated: the raw count
    overstates the information, ``numpyro.diagnostics.effective_sample_size`` does not.
    """
    from numpyro.diagnostics import effective_sample_size

    draws = np.asarray(draws)
    ess = np.asarray(effective_sample_size(draws))
    return draws.mean((0, 1)), draws.std((0, 1), ddof=1) / np.sqrt(ess)


def mcmc_var_and_se(draws):
    """Variance over chains and draws, and its standard error: the variance is the mean of the
    squared deviations, whose own spread and effective sample size (they mix more slowly than the
    draws themselves, and their spread depends on the tails) set the error."""
    draws = np.asarray(draws)
    sq = (draws - draws.mean((0, 1))) ** 2
    return mcmc_mean_and_se(sq)


def paired_difference_and_se(a, b):
    """Mean of ``a - b`` over paired draws (e.g. two estimators evaluated at the same keys) and its
    standard error. Pairs are independent across draws, so the spread of the differences accounts
    for any correlation within a pair (shared keys make it positive or negative)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return d.mean(0), d.std(0, ddof=1) / np.sqrt(d.shape[0])
