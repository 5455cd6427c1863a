"""The sign-flip toy (paper 000, Fig. 2): exact posterior by enumeration, and three variational families."""

import itertools

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
from numpyro.contrib.funsor import config_enumerate, enum, log_density
from numpyro.infer import TraceEnum_ELBO
from papers.signflip import (
    SIGN_FAMILIES,
    exact_posterior,
    fit_sign_family,
    pattern_labels,
    plot_sign_posteriors,
    posterior_samples,
    sign_flip_model,
    summary_table,
)
from scipy.stats import binom

from tests._mc import FALSE_ALARM

matplotlib.use("Agg")

NOISE = 0.1
X = jnp.linspace(-1.0, 1.0, 20)
LOG2, LOG4 = np.log(2.0), np.log(4.0)


def brute_force_log_evidence(x, y, num_layers, noise):
    """log (2^-L sum_s prod_n N(y_n | c_s x_n, noise^2)), by NumPy."""
    x, y = np.asarray(x), np.asarray(y)
    terms = []
    for s in itertools.product((0, 1), repeat=num_layers):
        f = np.prod([1 - 2 * si for si in s]) * x
        terms.append(np.sum(-0.5 * np.log(2 * np.pi * noise**2) - 0.5 * (y - f) ** 2 / noise**2))
    return np.logaddexp.reduce(terms) - num_layers * np.log(2.0)


def log_odds_invalid(x, y, noise):
    """log p(y | f = -x) - log p(y | f = x): an invalid pattern's log posterior odds to a valid one."""
    x, y = np.asarray(x), np.asarray(y)
    return float(np.sum((y - x) ** 2 - (y + x) ** 2) / (2 * noise**2))


@pytest.fixture(scope="module")
def exact3():
    return exact_posterior(X, X, num_layers=3, noise=NOISE)


@pytest.fixture(scope="module")
def fits(exact3):
    return {fam: fit_sign_family(jax.random.PRNGKey(i), fam, X, X, noise=NOISE, exact=exact3, num_restarts=6)
            for i, fam in enumerate(SIGN_FAMILIES)}


@pytest.mark.parametrize("num_layers", [2, 3, 4])
@pytest.mark.parametrize("noise, scale", [(NOISE, 1.0), (1.0, 0.3)])
def test_exact_posterior_is_uniform_on_even_flips(num_layers, noise, scale):
    x = scale * X
    exact = exact_posterior(x, x, num_layers=num_layers, noise=noise)
    assert exact.patterns.shape == (2**num_layers, num_layers)
    valid = exact.patterns.sum(1) % 2 == 0
    np.testing.assert_array_equal(exact.valid, valid)
    # Equal mass on the 2^(L-1) even-flip patterns; each odd-flip pattern has posterior odds
    # exp(log_odds) against a valid one, so p(valid) = 1 / (n (1 + r)), p(invalid) = r / (n (1 + r)).
    n, log_r = 2 ** (num_layers - 1), log_odds_invalid(x, x, noise)
    log_norm = np.log(n) + np.logaddexp(0.0, log_r)
    np.testing.assert_allclose(exact.probabilities[valid], np.exp(-log_norm), rtol=0, atol=1e-10)
    np.testing.assert_allclose(exact.log_probabilities[~valid], log_r - log_norm, rtol=1e-10)
    assert exact.probabilities[~valid].sum() <= np.exp(log_r) + 1e-15
    if noise == NOISE:
        assert log_r < -1000  # invalid mass exp(-1474): zero in float64
        assert exact.probabilities[~valid].sum() == 0.0
    else:
        assert 0.1 < exact.probabilities[~valid].sum() < 0.3  # a non-trivial check of the odds
    np.testing.assert_allclose(exact.probabilities.sum(), 1.0, atol=1e-12)
    np.testing.assert_allclose(exact.log_evidence, brute_force_log_evidence(x, x, num_layers, noise), rtol=0, atol=1e-10)


@pytest.mark.parametrize("num_layers", [3, 4])
def test_log_evidence_matches_funsor_and_trace_enum_elbo(num_layers):
    y = X + 0.05 * jnp.sin(7.0 * X)  # not exactly x: a generic evidence
    exact = exact_posterior(X, y, num_layers=num_layers, noise=NOISE)
    np.testing.assert_allclose(exact.log_evidence, brute_force_log_evidence(X, y, num_layers, NOISE), atol=1e-10)
    kwargs = dict(num_layers=num_layers, noise=NOISE)
    enum_model = enum(config_enumerate(sign_flip_model), first_available_dim=-2)
    funsor_ll, _ = log_density(enum_model, (X, y), kwargs, {})
    np.testing.assert_allclose(float(funsor_ll), exact.log_evidence, rtol=0, atol=1e-10)
    # No continuous latents: with an empty guide TraceEnum_ELBO's loss is -log p(y).
    loss = TraceEnum_ELBO(max_plate_nesting=1).loss(jax.random.PRNGKey(0), {}, sign_flip_model, lambda *a, **k: None,
                                                    X, y, **kwargs)
    np.testing.assert_allclose(-float(loss), exact.log_evidence, rtol=0, atol=1e-10)


@pytest.mark.parametrize("noise, scale", [(NOISE, 1.0), (1.0, 0.3)])
@pytest.mark.stochastic
def test_infer_discrete_frequencies_match_exact(noise, scale):
    x, num = scale * X, 3000
    exact = exact_posterior(x, x, noise=noise)
    draws = posterior_samples(jax.random.PRNGKey(3), x, x, num, noise=noise)
    assert draws.shape == (num, 3) and set(np.unique(draws)) <= {0, 1}
    index = draws @ (2 ** np.arange(2, -1, -1))  # row-major pattern index, s1 most significant
    freq = np.bincount(index, minlength=8) / num
    # exact two-sided binomial tails per pattern (small probabilities are far from normal), the
    # false-alarm rate 1e-4 split over the 8 patterns
    counts, p = np.bincount(index, minlength=8), np.clip(exact.probabilities, 0.0, 1.0)
    alpha = FALSE_ALARM / 8 / 2
    assert np.all(binom.cdf(counts, num, p) > alpha) and np.all(binom.sf(counts - 1, num, p) > alpha), \
        (freq, exact.probabilities)
    if noise == NOISE:
        assert np.all(freq[~exact.valid] == 0)


def test_factorized_family_collapses_to_one_pattern(fits, exact3):
    fit = fits["factorized"]
    assert abs(fit.kl - LOG4) < 1e-3
    np.testing.assert_allclose(fit.kl, exact3.log_evidence - fit.elbo, atol=1e-12)
    assert fit.invalid_mass < 1e-6
    assert fit.num_valid_patterns == 1
    assert fit.probabilities[exact3.valid].max() > 0.999
    np.testing.assert_allclose(fit.restart_kls, LOG4, atol=1e-3)  # every restart: the collapse is the optimum


def test_first_order_chain_reaches_two_patterns(fits, exact3):
    fit = fits["chain"]
    assert abs(fit.kl - LOG2) < 1e-3
    assert fit.invalid_mass < 1e-6
    assert fit.num_valid_patterns == 2
    np.testing.assert_allclose(np.sort(fit.probabilities[exact3.valid])[-2:], 0.5, atol=1e-2)
    assert np.all(fit.restart_kls > LOG2 - 1e-6)  # log 2 is a lower bound for this family


def test_composition_family_is_exact(fits, exact3):
    fit = fits["composition"]
    assert 0 <= fit.kl < 1e-3
    assert fit.invalid_mass < 1e-6
    assert fit.num_valid_patterns == 4
    np.testing.assert_allclose(fit.probabilities, exact3.probabilities, atol=2e-3)


def test_composition_family_exact_for_four_layers():
    exact = exact_posterior(X, X, num_layers=4, noise=NOISE)
    fit = fit_sign_family(jax.random.PRNGKey(5), "composition", X, X, num_layers=4, noise=NOISE, exact=exact,
                          num_restarts=3)
    assert fit.kl < 1e-3 and fit.num_valid_patterns == 8
    fact = fit_sign_family(jax.random.PRNGKey(6), "factorized", X, X, num_layers=4, noise=NOISE, exact=exact,
                           num_restarts=3)
    assert abs(fact.kl - 3 * LOG2) < 1e-3 and fact.num_valid_patterns == 1


def test_unknown_family_raises(exact3):
    with pytest.raises(ValueError, match="unknown family"):
        fit_sign_family(jax.random.PRNGKey(0), "joint", X, X, exact=exact3, num_steps=1, num_restarts=1)


def test_summary_table_and_plot(fits, exact3):
    rows = summary_table(list(fits.values()), exact3)
    assert [r["family"] for r in rows] == ["exact", *SIGN_FAMILIES]
    assert rows[0]["+--"] == pytest.approx(0.25) and rows[0]["++-"] == 0.0
    table = summary_table(list(fits.values()), exact3, markdown=True)
    assert table.count("\n") == 1 + len(rows) and "composition" in table
    assert pattern_labels(exact3.patterns) == ["+++", "++-", "+-+", "+--", "-++", "-+-", "--+", "---"]
    fig = plot_sign_posteriors(exact3, list(fits.values()))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == pattern_labels(exact3.patterns)
    assert len(ax.patches) == 8 * (1 + len(fits))
    matplotlib.pyplot.close(fig)
