"""The ready-made recipes (the demo)."""

import warnings

import jax


def test_demo_runs_and_the_dgp_beats_the_svgp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from numpyro_dgp.recipes import run_demo

        runs = run_demo(jax.random.PRNGKey(0), num_steps=400, num_inducing=15, num_test_samples=20, output=tmp_path / "demo.png")
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert runs["dgp"].metrics["log_likelihood"] > runs["svgp"].metrics["log_likelihood"]
