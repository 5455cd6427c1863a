"""``benchmarks/svi_init_floor.py``: the summary and report from a synthetic record, and the plain
NumPyro stand-in's parameters and latent sites against the DGP model's (shapes only, no compile)."""

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dgp as dgp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules


@pytest.fixture(scope="module")
def floor():
    spec = importlib.util.spec_from_file_location("bench_svi_init_floor", REPO / "benchmarks" / "svi_init_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(config, rnd, first, compiles=40, second=0.2):
    return {"config": config, "round": rnd, "params_finite": True,
            "first": {"seconds": first, "compiles": compiles, "compile_seconds": first - 0.4},
            "second": {"seconds": second, "compiles": 0, "compile_seconds": 0.0}}


def test_summary_and_report(floor):
    record = {"command": "python benchmarks/svi_init_floor.py", "machine": "x86_64, 2 cores", "date": "2026-11-29",
              "rounds": 3, "configs": ["numpyro-minimal", "ours-svi-init", "ours-infer-init"],
              "runs": [_run("numpyro-minimal", r, s) for r, s in enumerate((2.4, 2.0, 2.2))]
              + [_run("ours-svi-init", r, s, compiles=52) for r, s in enumerate((4.0, 5.0, 4.5))]
              + [{"config": "ours-infer-init", "round": 0, "error": "exit 1: boom"}]}
    rows = floor.summary(record)
    assert rows["numpyro-minimal"]["first_seconds"] == pytest.approx(2.2)
    assert rows["numpyro-minimal"]["first_range"] == (2.0, 2.4)
    assert rows["ours-svi-init"]["compiles"] == 52
    assert rows["ours-infer-init"] is None
    text = floor.render(record)
    assert "| `numpyro-minimal` |" in text and "2.20 (2.00-2.40)" in text
    assert "failed: exit 1: boom" in text
    assert "measured 4.50 s" in text and "takes 2.20 s (2.00-2.40; 110% of the target)" in text


def _shapes(model, guide, X, y, **kwargs):
    """Unconstrained parameter shapes after ``svi.init`` and latent site shapes (traced, not compiled)."""
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    state = jax.eval_shape(lambda key: svi.init(key, X, y, **kwargs), jax.random.PRNGKey(0))
    params = {k: v.shape for k, v in svi.optim.get_params(state.optim_state).items()}
    trace = jax.eval_shape(lambda key: {k: s["value"] for k, s in handlers.trace(handlers.seed(model, key))
                                        .get_trace(X, y, **kwargs).items() if s["type"] == "sample"
                                        and not s["is_observed"]}, jax.random.PRNGKey(0))
    return params, {k: v.shape for k, v in trace.items()}


def test_stand_in_has_the_dgp_models_sites(floor):
    rng = np.random.default_rng(0)
    X, y = jnp.asarray(rng.random((1200, 8))), jnp.asarray(rng.standard_normal(1200))
    model = dgp.models.deep_gp_regression(2, num_inducing=floor.NUM_INDUCING, hidden_width=floor.WIDTH)
    ours = _shapes(model, dgp.guides.AutoFactorizedDGP(model), X, y, batch_size=floor.BATCH)
    plain = _shapes(*floor._plain_model("numpyro-dgp-sites", X.shape[0], X.shape[1]), X, y)
    assert plain == ours


def test_baseline_rows_and_paired_differences(floor):
    record = {"command": "python benchmarks/svi_init_floor.py --baseline ../old", "machine": "x86_64, 2 cores",
              "date": "2026-11-29", "rounds": 3, "configs": ["ours-infer-init", "ours-infer-init@baseline"],
              "baseline": {"path": "../old", "commit": "8dede58"},
              "runs": [_run("ours-infer-init", r, s) for r, s in enumerate((2.0, 2.2, 2.1))]
              + [_run("ours-infer-init@baseline", r, s) for r, s in enumerate((2.5, 2.4, 2.9))]}
    assert floor.paired_differences(record, "ours-infer-init") == pytest.approx([0.5, 0.2, 0.8])
    text = floor.render(record)
    assert "baseline package (8dede58)" in text
    assert "+0.50, +0.20, +0.80 s (median +0.50 s)" in text
    record["runs"] = record["runs"][:3] + [{"config": "ours-infer-init@baseline", "round": 1, "error": "exit 1"}]
    assert floor.paired_differences(record, "ours-infer-init") == []  # no pair without both runs


@pytest.mark.parametrize("argv, message", [
    (["--data-dir", "{missing}"], "--data-dir: no UCI data folder"),
    (["--configs", "ours-svi-init,nope"], "--configs: unknown ['nope']"),
    (["--baseline", "{tmp}"], "--baseline: no numpyro_dgp package"),
])
def test_bad_arguments_are_refused_before_any_run(floor, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(floor, "run_child", lambda *a: pytest.fail("a child ran"))
    argv = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in argv]
    data = [] if "--data-dir" in argv else ["--data-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        floor.main(argv + data)
    assert message in capsys.readouterr().err
