"""Same answers before and after a restructure: one training step's loss and gradients, from
identical parameters and keys, for every guide and objective.

Run it once on the old package to write the reference, then on the new one to compare::

    git worktree add /tmp/old <old commit>
    PYTHONPATH=/tmp/old python benchmarks/same_answers.py --write /tmp/answers.npz
    python benchmarks/same_answers.py --check /tmp/answers.npz

Each case (every working guide x inducing kind x handler of ``tests/_model_kinds.py`` under
``DGPElbo``, both likelihoods, and each objective on the guides it takes) is set up with
``svi.init`` (the initial parameters are compared too); its loss and gradient are computed in
float64 at the reference's evaluation point: the initial parameters moved by a fixed random
step in the optimizer's unconstrained space (at the initial ``q(u) = p(u)`` the gradients of
the kernel's inputs vanish, and only round-off would be compared). A refused case must be
refused with the same message. Differences are relative to the largest entry of each group
(initial parameters, loss, gradient) of a case; ``--check`` prints the largest per case and
exits 1 if any is over ``--rtol`` (1e-12).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.append(str(Path(__file__).resolve().parents[1]))  # for tests/, after any PYTHONPATH

import numpyro  # noqa: E402
from numpyro.infer import SVI  # noqa: E402

import numpyro_dgp as dgp  # noqa: E402
from tests import _model_kinds as kinds  # noqa: E402


def objectives() -> dict:
    return {
        "DGPElbo": dgp.DGPElbo(),
        "DGPElbo_particles": dgp.DGPElbo(num_particles=3),
        "DGPElbo_quadrature": dgp.DGPElbo(num_quadrature=3),
        "ImportanceWeightedElbo": dgp.ImportanceWeightedElbo(num_importance=4),
        "NestedCompressionElbo": dgp.NestedCompressionElbo(),
        "PredictiveObjective": dgp.PredictiveObjective(num_particles=4),
        "CollapsedSparseGP": dgp.CollapsedSparseGP(),
    }


#: the model each objective runs on ("kinds": the two-layer models of tests/_model_kinds.py)
MODEL_OF = {"NestedCompressionElbo": "noisy", "CollapsedSparseGP": "one layer",
            "ImportanceWeightedElbo": "latent input"}


def cases() -> list[tuple[str, str, str, str, str]]:
    """``(guide, inducing, handler, likelihood, objective)``."""
    found = []
    for guide, inducing, handler in kinds.KINDS:
        for likelihood in kinds.LIKELIHOODS:
            found.append((guide, inducing, handler, likelihood, "DGPElbo"))
    for objective in objectives():
        if objective == "DGPElbo":
            continue
        guides = ("AutoFactorizedDGP", "AutoJointDGP", "AutoChainDGP", "AutoNormal", "AutoMultivariateNormal")
        if objective == "CollapsedSparseGP":  # q(u) integrated out: a guide of nothing
            guides = ("no guide",)
        for guide in guides:
            found.append((guide, MODEL_OF.get(objective, "global"), "none", "gaussian", objective))
    return found


def special_model(kind: str):
    """The noisy two-layer chain (NestedCompressionElbo), one layer (CollapsedSparseGP), or a
    latent input before two layers (ImportanceWeightedElbo); Gaussian likelihood."""
    import numpyro.distributions as dist

    def model(X, y=None):
        if kind == "latent input":
            with numpyro.plate("data", X.shape[0]):
                X = dgp.latent_input("w", X)
        noise = {"noise": 0.1} if kind == "noisy" else {}
        f = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=kinds.M, **noise)
        if kind != "one layer":
            f = dgp.gp_layer("h2", f, dgp.kernels.RBF(), num_inducing=kinds.M)
        with numpyro.plate("data", X.shape[-2]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    return model


def moved(params):
    """The evaluation point: ``params`` plus a fixed random step of 0.3 per entry."""
    rs = np.random.RandomState(0)
    return {k: np.asarray(v) + 0.3 * rs.randn(*np.shape(v)) for k, v in sorted(params.items())}


def one_step(case, reference_params=None):
    """``(initial params, loss, gradient, evaluation point)`` of one case, at
    ``reference_params`` when given, else at :func:`moved` initial parameters."""
    guide_name, inducing, handler, likelihood, objective = case
    X, y, _ = kinds.data(likelihood, "float64")
    if inducing in MODEL_OF.values():
        model = special_model(inducing)
    else:
        model = kinds.with_handler(kinds.make_model(inducing, likelihood), handler)
    guide = (lambda X, y=None: None) if guide_name == "no guide" else kinds.make_guide(guide_name, model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), objectives()[objective])
    state = svi.init(jax.random.PRNGKey(0), X, y)
    params = svi.optim.get_params(state.optim_state)
    at = moved(params) if reference_params is None else {k: reference_params[k] for k in params}

    def loss(p):
        return svi.loss.loss(jax.random.PRNGKey(1), svi.constrain_fn(p), svi.model, svi.guide, X, y)

    value, grad = jax.value_and_grad(loss)(at)
    return params, value, grad, at


def run(case, reference=None):
    """``{key: array}`` of one case, ``refused: message`` for a refused one."""
    name = "|".join(case)
    ref_params = None
    if reference is not None and f"{name}|loss" in reference:
        prefix = f"{name}|param|"
        ref_params = {k[len(prefix):]: reference[k] for k in reference if k.startswith(prefix)}
    try:
        params, value, grad, at = one_step(case, ref_params)
    except (ValueError, NotImplementedError) as err:
        return {f"{name}|refused": np.array(f"{type(err).__name__}: {err}")}
    out = {f"{name}|loss": np.asarray(value)}
    out.update({f"{name}|init|{k}": np.asarray(v) for k, v in params.items()})
    out.update({f"{name}|param|{k}": np.asarray(v) for k, v in at.items()})
    out.update({f"{name}|grad|{k}": np.asarray(v) for k, v in grad.items()})
    return out


def compare(reference, result) -> tuple[float, str]:
    """The largest relative difference of one case over its groups (initial parameters, loss,
    gradient), each relative to the group's largest entry, and the group it was in."""
    if set(reference) != set(result):
        return np.inf, f"different keys: {sorted(set(reference) ^ set(result))[:4]}"
    worst, where = 0.0, ""
    groups: dict[str, list] = {}
    for key, value in result.items():
        kind = key.split("|")[5]
        if kind == "refused":
            if str(value) != str(reference[key]):
                return np.inf, f"refusal: {value}"
            continue
        groups.setdefault(kind, []).append((np.asarray(value, float), np.asarray(reference[key], float)))
    for kind, pairs in groups.items():
        scale = max(max(np.max(np.abs(b), initial=0.0) for _, b in pairs), 1e-300)
        diff = max(np.max(np.abs(a - b), initial=0.0) for a, b in pairs) / scale
        if diff > worst:
            worst, where = diff, kind
    return worst, where


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path)
    mode.add_argument("--check", type=Path)
    p.add_argument("--rtol", type=float, default=1e-12)
    args = p.parse_args()
    print(f"numpyro_dgp from {Path(dgp.__file__).parent}")
    if args.write:
        out = {}
        for case in cases():
            out.update(run(case))
        np.savez(args.write, **out)
        print(f"{len(cases())} cases written to {args.write}")
        return
    reference = dict(np.load(args.check))
    failures = 0
    for case in cases():
        name = "|".join(case)
        result = run(case, reference)
        ref = {k: v for k, v in reference.items() if k.startswith(name + "|")}
        worst, where = compare(ref, result)
        failures += worst > args.rtol
        print(f"{'FAIL' if worst > args.rtol else 'ok  '} {worst:9.2e} {name} {where}")
    print(f"{failures} of {len(cases())} cases over rtol {args.rtol:g}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
