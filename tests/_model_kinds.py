"""The matrix of model kinds that ``tests/test_model_kinds.py`` runs end to end, and the check
it runs on each (``python -m tests._model_kinds`` prints the table of docs/model_kinds.md).

A kind is a guide x an inducing kind x a handler that changes prediction; each runs with a
Gaussian or a probit likelihood, in float32 or float64. :data:`EXPECTED` says, for every kind,
whether it works or is refused with a clear error at its first run (``svi.init``/``fit``:
a model is a Python function, so that is the first moment its layers are known);
``docs/model_kinds.md`` shows the same table (a test compares them).
"""

from __future__ import annotations

import itertools

import numpy as np

#: the guides the library ships and NumPyro's Gaussian autoguides
GUIDES = (
    "AutoFactorizedDGP", "AutoJointDGP", "AutoChainDGP", "AutoAmortizedDGP",
    "AutoNormal", "AutoDiagonalNormal", "AutoMultivariateNormal", "AutoLowRankMultivariateNormal",
)
#: the inducing kinds of ``gp_layer``
INDUCING = ("global", "global, not whitened", "locations", "amortized")
#: the handlers that change what ``predict`` computes
HANDLERS = ("none", "sde_flow", "quadrature")
LIKELIHOODS = ("gaussian", "probit")
DTYPES = ("float64", "float32")

#: the problem: N training points in 1-D, M inducing points per layer, two layers
N, M = 10, 4
#: prediction sizes: one point, fewer points than inducing points, more than were trained on
ONE, FEW, MANY = 1, M - 1, N + 3
#: a window that does not divide MANY (the last window overlaps the one before)
BATCH = M - 1

_CORRELATING = {"AutoJointDGP", "AutoChainDGP", "AutoMultivariateNormal", "AutoLowRankMultivariateNormal"}
_LATENT_VECTOR = {"AutoDiagonalNormal", "AutoMultivariateNormal", "AutoLowRankMultivariateNormal"}

#: what each refusal's message says (a regular expression), by reason
REFUSALS = {
    "amortized layers need AutoAmortizedDGP": r"per-point inducing sets \(inducing='amortized'\).*AutoAmortizedDGP",
    "AutoAmortizedDGP needs amortized layers": r"no gp_layer with inducing='amortized'",
    "no flow over per-point inducing sets": r"sde_flow: layer 'h1' has per-point inducing sets",
    "no branches into inducing locations": r"inducing='locations' does not take branched inputs.*quadrature",
    "locations need per-layer conditionals": r"inducing='locations' needs each layer's Gaussian.*AutoJointDGP",
    "the flow needs an independent Gaussian per layer": r"sde_flow: layer 'h1' has a guide that correlates layers",
}


def refusal(guide: str, inducing: str, handler: str) -> str | None:
    """The reason (a key of :data:`REFUSALS`) the kind is refused, ``None`` if it works."""
    if inducing == "amortized" and handler == "sde_flow":
        return "no flow over per-point inducing sets"
    if inducing == "amortized" and guide != "AutoAmortizedDGP":
        return "amortized layers need AutoAmortizedDGP"
    if guide == "AutoAmortizedDGP" and inducing != "amortized":
        return "AutoAmortizedDGP needs amortized layers"
    if inducing == "locations" and handler == "quadrature":
        return "no branches into inducing locations"
    if inducing == "locations" and guide in _LATENT_VECTOR:
        return "locations need per-layer conditionals"
    if handler == "sde_flow" and guide in _CORRELATING and inducing != "locations":
        return "the flow needs an independent Gaussian per layer"
    return None


KINDS = list(itertools.product(GUIDES, INDUCING, HANDLERS))
#: ``{(guide, inducing, handler): "works" or "refused"}``, the table of docs/model_kinds.md
EXPECTED = {kind: "works" if refusal(*kind) is None else "refused" for kind in KINDS}


#: the library's own guides: the default suite runs each with every inducing kind it takes
LIBRARY_GUIDES = ("AutoFactorizedDGP", "AutoJointDGP", "AutoChainDGP", "AutoAmortizedDGP")
#: the guides of the default suite: all but AutoLowRankMultivariateNormal, whose Gaussian the
#: engine reads as it reads AutoMultivariateNormal's (one joint block); the slow suite runs it too
DEFAULT_GUIDES = tuple(g for g in GUIDES if g != "AutoLowRankMultivariateNormal")


def covering_set() -> list[tuple[str, str, str, str, str]]:
    """The default suite's cases: working kinds of :data:`DEFAULT_GUIDES` chosen so that each
    library guide runs with every inducing kind it takes, each NumPyro autoguide runs, and every
    inducing kind runs with every handler it works with; each case takes a likelihood and dtype
    in turn, so that every inducing kind and handler meets both likelihoods and both dtypes. The
    slow suite (``--runslow``) runs every working kind (every guide x inducing kind x handler)
    with all four."""
    works = [k for k in KINDS if EXPECTED[k] == "works" and k[0] in DEFAULT_GUIDES]

    def pairs(kind):
        g, i, h = kind
        return {("g", g, "i", i) if g in LIBRARY_GUIDES else ("g", g), ("i", i, "h", h)}

    uncovered = set().union(*map(pairs, works))
    chosen = []
    while uncovered:
        best = max(works, key=lambda k: (len(pairs(k) & uncovered), -works.index(k)))
        chosen.append(best)
        uncovered -= pairs(best)
    variants = list(itertools.product(LIKELIHOODS, DTYPES))
    return [kind + variants[n % len(variants)] for n, kind in enumerate(sorted(chosen, key=KINDS.index))]


def default_refusals() -> list[tuple[str, str, str]]:
    """The refused kinds of the default suite: one kind per reason for each library guide, and
    one per reason for NumPyro's autoguides together (their refusals are the same code for each
    autoguide); the slow suite runs every refused kind."""
    chosen, seen = [], set()
    for kind in KINDS:
        reason = refusal(*kind)
        family = kind[0] if kind[0] in LIBRARY_GUIDES else "NumPyro"
        if reason is not None and kind[0] in DEFAULT_GUIDES and (family, reason) not in seen:
            seen.add((family, reason))
            chosen.append(kind)
    return chosen


def case_id(case: tuple) -> str:
    return "-".join(part.replace(", ", "_").replace(" ", "_") for part in case)


# ---- building and checking one case (imports JAX: after the precision is set) ---------------------


def _observe(f, y, likelihood):
    import numpyro
    import numpyro.distributions as dist

    import numpyro_dgp as dgp

    fn = dist.Normal(f[..., 0], 0.3) if likelihood == "gaussian" else dgp.likelihoods.bernoulli_probit(f[..., 0])
    numpyro.sample("y", fn, obs=y)


def make_model(inducing: str, likelihood: str):
    """Two layers of width 1 (the flow layer maps R -> R); ``y`` after the last."""
    import numpyro

    import numpyro_dgp as dgp

    options = {"global": {}, "global, not whitened": {"whiten": False}, "locations": {"inducing": "locations"},
               "amortized": {"inducing": "amortized"}}[inducing]

    def model(X, y=None):
        if inducing == "amortized":  # per-point inducing sets: the layers run inside the data plate
            with numpyro.plate("data", X.shape[0]):
                h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=M, **options)
                f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=M, **options)
                _observe(f, y, likelihood)
            return
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=M, **options)
        f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=M, **options)
        if inducing == "locations":
            f = f[0]  # (output, inducing values) for a next layer
        with numpyro.plate("data", X.shape[0]):
            _observe(f, y, likelihood)

    return model


def with_handler(model, handler: str):
    from numpyro_dgp.handlers import quadrature, sde_flow

    if handler == "sde_flow":
        return sde_flow(model, "h1", T=0.5, num_steps=2)
    if handler == "quadrature":
        return quadrature(model, num_points=3)
    return model


def make_guide(name: str, model):
    from numpyro.infer import autoguide

    from numpyro_dgp import guides

    if name == "AutoAmortizedDGP":
        return guides.AutoAmortizedDGP(model, num_hidden=1, hidden_width=4)
    if name == "AutoLowRankMultivariateNormal":
        return autoguide.AutoLowRankMultivariateNormal(model, rank=2)
    return (getattr(guides, name) if hasattr(guides, name) else getattr(autoguide, name))(model)


def data(likelihood: str, dtype: str):
    """``(X (N, 1), y (N,), X_new (MANY, 1))`` in ``dtype``."""
    X = np.sort(np.random.RandomState(0).uniform(-1, 1, N))[:, None].astype(dtype)
    y = np.sin(3 * X[:, 0]) if likelihood == "gaussian" else (X[:, 0] > 0)
    X_new = np.linspace(-1.2, 1.2, MANY)[:, None].astype(dtype)
    return X, y.astype(dtype), X_new


def fitted(guide_name: str, inducing: str, handler: str, likelihood: str, dtype: str, num_steps: int = 2):
    """``(model, guide, FitResult, X_new)`` after ``num_steps`` of DGPElbo (a refused kind raises here)."""
    import jax
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    X, y, X_new = data(likelihood, dtype)
    model = with_handler(make_model(inducing, likelihood), handler)
    guide = make_guide(guide_name, model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=num_steps, progress_bar=False)
    return model, guide, result, X_new


def check_prediction(pred, num_points: int, likelihood: str, dtype: str, where: str) -> None:
    """Finite mean and variance of the right shape and dtype (probabilities in (0, 1))."""
    for field in ("mean", "variance"):
        value = np.asarray(getattr(pred, field))
        assert value.shape == (num_points,), f"{where}: {field} has shape {value.shape}, not ({num_points},)"
        assert value.dtype == np.dtype(dtype), f"{where}: {field} is {value.dtype}, not {dtype}"
        assert np.all(np.isfinite(value)), f"{where}: {field} is not finite: {value}"
    assert np.all(np.asarray(pred.variance) > 0), f"{where}: variance not positive"
    if likelihood == "probit":
        assert np.all((pred.mean > 0) & (pred.mean < 1)), f"{where}: probabilities outside (0, 1)"


def check_case(guide_name: str, inducing: str, handler: str, likelihood: str, dtype: str) -> None:
    """Fit, then predict at one point, at fewer points than inducing points, at more points than
    were trained on, and in windows that do not divide them; a refused kind must raise the
    error :data:`REFUSALS` names, at its first run. Raises ``AssertionError`` naming the case.
    A float32 case runs with JAX's 64-bit mode off, as users run float32 models."""

    import jax

    # float32 as users run it: JAX's default precision (the suite's process runs in float64)
    with jax.enable_x64(dtype == "float64"):
        _check_case(guide_name, inducing, handler, likelihood, dtype)


def _check_case(guide_name: str, inducing: str, handler: str, likelihood: str, dtype: str) -> None:
    where = case_id((guide_name, inducing, handler, likelihood, dtype))
    reason = refusal(guide_name, inducing, handler)
    if reason is not None:
        import re

        try:
            fitted(guide_name, inducing, handler, likelihood, dtype)
        except (ValueError, NotImplementedError) as err:
            assert re.search(REFUSALS[reason], str(err), re.S), f"{where}: refused with another message: {err}"
            return
        raise AssertionError(f"{where}: expected a refusal ({reason}), but it ran")
    import jax

    import numpyro_dgp as dgp

    model, guide, result, X_new = fitted(guide_name, inducing, handler, likelihood, dtype)
    assert np.all(np.isfinite(result.losses)), f"{where}: non-finite training loss {result.losses}"
    key = jax.random.PRNGKey(1)

    def predict(X, **kw):
        return dgp.predict(model, guide, result.params, key, X, num_samples=4, **kw)

    check_prediction(predict(X_new[:ONE]), ONE, likelihood, dtype, f"{where} at 1 point")
    few = predict(X_new[:FEW])
    check_prediction(few, FEW, likelihood, dtype, f"{where} at {FEW} points")
    check_prediction(predict(X_new), MANY, likelihood, dtype, f"{where} at {MANY} points")
    windows = predict(X_new, batch_size=BATCH)
    check_prediction(windows, MANY, likelihood, dtype, f"{where} in windows of {BATCH}")
    # each window is predicted as the window alone is (same key, same shape: the same numbers)
    last = predict(X_new[-BATCH:])
    for start, alone in ((0, few), (MANY - BATCH, last)):
        check_window(windows, alone, start, f"{where}: window at {start}")


def check_window(windows, alone, start: int, where: str) -> None:
    """Every field of a windowed prediction at ``start`` equals the prediction of the window alone:
    mean, variance, the mixture components, every layer's draws and moments (points on their
    second-to-last axis) and the branch weights."""
    size = np.shape(alone.mean)[0]
    for field in ("mean", "variance", "component_means", "component_variances"):
        np.testing.assert_array_equal(np.asarray(getattr(windows, field))[..., start:start + size],
                                      np.asarray(getattr(alone, field)), err_msg=f"{where}: {field}")
    for field in ("layers", "layer_means", "layer_variances"):
        for name, value in getattr(alone, field).items():
            np.testing.assert_array_equal(np.asarray(getattr(windows, field)[name])[..., start:start + size, :],
                                          np.asarray(value), err_msg=f"{where}: {field}[{name!r}]")
    if alone.weights is not None:
        np.testing.assert_array_equal(np.asarray(windows.weights), np.asarray(alone.weights),
                                      err_msg=f"{where}: weights")


# ---- MCMC on the same models: samples, then predict_from_samples ---------------------------------

#: the samplers: SGHMC on the model, NUTS on ``latent_conditionals(model)``
SAMPLERS = ("SGHMC", "NUTS")

#: what each MCMC refusal's message says, by reason
MCMC_REFUSALS = {
    "no flow over per-point inducing sets": REFUSALS["no flow over per-point inducing sets"],
    "MCMC samples global inducing values": r"layer\(?s?\)? .*'h1'.* per-point inducing sets \(inducing='amortized'\)",
    "no branches into inducing locations": REFUSALS["no branches into inducing locations"],
    "latent_conditionals takes no flow layers": r"latent_conditionals: layer 'h1' is an sde_flow layer",
}


def mcmc_refusal(inducing: str, handler: str, sampler: str) -> str | None:
    """The reason (a key of :data:`MCMC_REFUSALS`) the kind is refused under ``sampler``."""
    if inducing == "amortized" and handler == "sde_flow":
        return "no flow over per-point inducing sets"
    if inducing == "amortized":
        return "MCMC samples global inducing values"
    if sampler == "NUTS" and handler == "sde_flow":
        return "latent_conditionals takes no flow layers"
    if inducing == "locations" and handler == "quadrature":
        return "no branches into inducing locations"
    return None


MCMC_KINDS = list(itertools.product(INDUCING, HANDLERS, SAMPLERS))


def _mcmc_samples(model, sampler: str, X, y):
    """``(samples, params)`` of a short MCMC run (params: the fixed values NUTS ran with)."""
    import jax
    import optax
    from numpyro import handlers
    from numpyro.infer import MCMC, NUTS

    from numpyro_dgp.handlers import latent_conditionals
    from numpyro_dgp.infer import SGHMC

    params = None
    if sampler == "SGHMC":
        kernel = SGHMC(model, step_size=0.01, param_optimizer=optax.adam(0.01))
    else:  # NUTS keeps numpyro.param sites at their initial values: predict with those
        kernel = NUTS(latent_conditionals(model))
        tr = handlers.trace(handlers.seed(model, 0)).get_trace(X, y)
        params = {n: s["value"] for n, s in tr.items() if s["type"] == "param"}
    mcmc = MCMC(kernel, num_warmup=3, num_samples=3, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    return mcmc.get_samples(), params


def check_mcmc(inducing: str, handler: str, sampler: str) -> None:
    """A short MCMC run, then ``predict_from_samples`` at one point, at fewer points than
    inducing points and at more points than were trained on; a refused kind must raise the
    error :data:`MCMC_REFUSALS` names (at the run or at the first prediction)."""
    import re

    import jax

    import numpyro_dgp as dgp

    where = case_id((inducing, handler, sampler))
    reason = mcmc_refusal(inducing, handler, sampler)
    X, y, X_new = data("gaussian", "float64")
    model = with_handler(make_model(inducing, "gaussian"), handler)
    try:
        samples, params = _mcmc_samples(model, sampler, X, y)
        for n in (ONE, FEW, MANY):
            pred = dgp.predict_from_samples(model, samples, jax.random.PRNGKey(1), X_new[:n], params=params)
            check_prediction(pred, n, "gaussian", "float64", f"{where} at {n} points")
    except (ValueError, NotImplementedError) as err:
        if reason is None:
            raise
        assert re.search(MCMC_REFUSALS[reason], str(err), re.S), f"{where}: refused with another message: {err}"
        return
    assert reason is None, f"{where}: expected a refusal ({reason}), but it ran"


def _render(columns: tuple[str, ...], reason_of) -> str:
    """A Markdown table with a row per inducing kind and handler and a column per entry of
    ``columns``: "works", or "refused (reason)" where ``reason_of(inducing, handler, column)``
    gives one."""
    lines = ["| inducing | handler | " + " | ".join(f"`{c}`" for c in columns) + " |",
             "| --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for inducing, handler in itertools.product(INDUCING, HANDLERS):
        reasons = [reason_of(inducing, handler, column) for column in columns]
        cells = ["works" if reason is None else f"refused ({reason})" for reason in reasons]
        lines.append(f"| {inducing} | {handler} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table() -> str:
    """The Markdown table of :data:`EXPECTED` (docs/model_kinds.md): a column per guide."""
    return _render(GUIDES, lambda inducing, handler, guide: refusal(guide, inducing, handler))


def mcmc_table() -> str:
    """The Markdown table of MCMC by kind (docs/model_kinds.md): a column per sampler."""
    return _render(SAMPLERS, mcmc_refusal)


if __name__ == "__main__":
    print(table(), mcmc_table(), sep="\n\n")
