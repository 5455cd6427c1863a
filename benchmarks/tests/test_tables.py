"""The committed benchmark tables are rendered from their JSON records: check the rendering."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling _harness module


def _load(script):
    spec = importlib.util.spec_from_file_location(f"bench_{script}", REPO / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(split, ll, rmse):
    return {"split": split, "log_likelihood": ll, "rmse": rmse, "crps": 1.0, "final_elbo": -500.0,
            "seconds_per_step": 0.04, "compile_seconds": 6.0, "total_seconds": 90.0, "num_skipped": 0}


def test_sde_flow_table_gives_mean_and_standard_error_and_marks_single_runs(tmp_path):
    sde_flow = _load("sde_flow")
    lls, rmses = [-3.0, -3.2, -3.1], [5.0, 5.6, 5.3]
    record = {"command": "python benchmarks/sde_flow.py ...", "machine": "test", "float64": False,
              "settings": "test settings", "date": "today",
              "results": {"concrete": {"T=5": [_run(s, ll, r) for s, (ll, r) in enumerate(zip(lls, rmses))],
                                       "T=1": [_run(0, -3.25, 5.9)]}}}
    path = tmp_path / "table.md"
    sde_flow.write_markdown(path, record)
    summary = path.read_text().split("Per run:")[0]
    rows = {line.split(" | ")[1]: line for line in summary.splitlines() if line.startswith("| concrete | T=")}
    se = np.std(lls, ddof=1) / np.sqrt(3)
    assert f"| 3 | {np.mean(lls):.3f} ({se:.3f}) |" in rows["T=5"]
    assert "LL >= -2.98, RMSE <= 4.8: NOT met" in rows["T=5"]  # mean -3.1, 5.3
    assert "| 1 | -3.250 (one run) | 5.9 (one run) |" in rows["T=1"]
    assert "nan" not in path.read_text()


def _render_committed(script, tmp_path, name=None):
    """Render ``results/<name>.json`` (default: the script's name) with the script's
    ``write_markdown``, check that it is exactly the committed ``results/<name>.md``;
    ``(module, record, rendered path)``."""
    module = _load(script)
    results = REPO / "benchmarks" / "results"
    name = name or script
    record = json.loads((results / f"{name}.json").read_text())
    path = tmp_path / "table.md"
    module.write_markdown(path, record)
    assert path.read_text() == (results / f"{name}.md").read_text()
    return module, record, path


def _grid_row(M, ms, gpflux_ms, floor_gflop, peak=100.0):
    return {"precision": "float64", "D": 90, "M": M, "width": 8, "ms_per_step": ms, "compile_seconds": 5.0,
            "first_step_seconds": 7.0, "floor_gflop": floor_gflop, "matmul_gflops": peak,
            "gpflux_ms_per_step": gpflux_ms, "gpflux_compile_seconds": 4.0, "gpflux_version": "gpflux 0.4.5"}


def test_scale_grid_says_which_target_each_point_meets():
    scale = _load("scale")
    rows = [_grid_row(100, 10.0, 25.0, 0.5),   # 2.5x GPflux
            _grid_row(500, 100.0, 150.0, 7.0),  # 1.5x; 2x GPflux (75 ms) is above the 70 ms floor: 2x applies
            _grid_row(1000, 100.0, 150.0, 8.0),  # floor 80 ms > 75 ms; 80% of the matmul speed
            _grid_row(2000, 200.0, 150.0, 8.0)]  # floor 80 ms > 75 ms but only 40%
    table = [line for line in scale._grid_lines(rows) if line.startswith("| float64")]
    assert [line.rstrip(" |").rsplit("| ", 1)[1] for line in table] == ["2x", "-", "65%", "-"]
    assert "| 100 | 70.0 | 70.0 | 70 |" in table[1]  # peak GFLOP/s, floor ms, achieved GFLOP/s, roofline %


def test_scale_grid_shows_gpytorch_where_it_ran():
    scale = _load("scale")
    rows = [{**_grid_row(100, 10.0, 25.0, 0.5), "gpytorch_ms_per_step": 40.0, "gpytorch_version": "gpytorch 1.15.2"},
            _grid_row(200, 20.0, 50.0, 1.0)]
    lines = scale._grid_lines(rows)
    assert "GPyTorch: gpytorch 1.15.2" in lines[0]
    table = [line for line in lines if line.startswith("| float64")]
    assert table[0].endswith("| 2x | 40.0 | 4.00 |") and table[1].endswith("| 2x | - | - |")


def test_scale_grid_repeats_give_medians_and_ratios_paired_by_run():
    scale = _load("scale")
    runs = [{**_grid_row(500, ms, gpflux_ms, 7.0), "all_finite": True}
            for ms, gpflux_ms in ((100.0, 100.0), (300.0, 900.0), (200.0, 700.0))]
    point = scale.combine_runs(runs)
    assert point["ms_per_step"] == 200.0 and point["gpflux_ms_per_step"] == 700.0 and point["repeats"] == 3
    assert point["ms_per_step_runs"] == [100.0, 300.0, 200.0] and point["all_finite"]
    # the ratios paired by run are 1, 3 and 3.5: their median is 3, the medians' ratio 3.5
    assert scale.peer_ratio(point, "gpflux") == 3.0
    table = [line for line in scale._grid_lines([point]) if line.startswith("| float64")]
    assert table[0].endswith("| 3.00 | 1.00-3.50 (3) | 2x |")
    assert scale.combine_runs(runs[:1]) == runs[0]  # one run: the record as it was
    assert not scale.combine_runs([*runs[:2], {**runs[2], "all_finite": False}])["all_finite"]


def test_scale_step_flops_grow_as_the_math_says():
    scale = _load("scale")
    # the variance term P M^2 B dominates at large M: doubling M nearly quadruples the count
    assert 3.5 < scale.step_flops(1000, 8, 90) / scale.step_flops(500, 8, 90) < 4.5
    assert scale.step_flops(500, 32, 90) > 3 * scale.step_flops(500, 8, 90)


def test_time_to_target_is_the_first_time_the_trailing_mean_reaches_it():
    natural = _load("natural_gradients")
    losses = np.array([10.0, 8.0, 6.0, 4.0, 2.0, 1.0])
    seconds = np.full(6, 0.5)
    # trailing 2-step means: 9, 7, 5, 3, 1.5 (ending at steps 1..5); 5 <= 5 first at step 3
    assert natural.time_to(losses, seconds, 5.0, 2) == 2.0
    assert np.isnan(natural.time_to(losses, seconds, 0.5, 2))


def _render(script, tag, tmp_path):
    """``results/<script>_<tag>.json`` rendered by the script's ``write`` is the committed ``.md``."""
    module = _load(script)
    results = REPO / "benchmarks" / "results"
    record = json.loads((results / f"{script}_{tag}.json").read_text())
    path = tmp_path / "table.md"
    module.write(record, path)
    assert path.read_text() == (results / f"{script}_{tag}.md").read_text()
    return record, path.read_text()


def test_digits_table_is_rendered_from_its_record(tmp_path):
    record, text = _render("digits", "softmax", tmp_path)
    ours = [r["accuracy"] for r in record["runs"] if r["library"] == "numpyro-dgp"]
    assert len(ours) >= 5 and f"| numpyro-dgp | {len(ours)} | {np.mean(ours):.4f}" in text


def test_natural_gradients_table_is_rendered_from_its_record(tmp_path):
    record, text = _render("natural_gradients", "uci", tmp_path)
    for r in record["runs"]:
        ratio = r["natural"]["seconds_to_target"] / r["adam"]["seconds_to_target"]
        assert f"| {ratio:.2f} |" in text


def test_latent_variable_table_is_rendered_from_its_record(tmp_path):
    record, text = _render("latent_variable", "concrete", tmp_path)
    assert record["dataset"] == "concrete" and len(record["runs"]) >= 3
    assert "| latent-variable DGP (IW bound) |" in text


def test_guide_costs_counts_the_factorizations_solves_and_product_flops_of_a_compiled_program():
    import jax
    import jax.numpy as jnp

    guide_costs = _load("guide_costs")

    def program(a, b, c, x, y, k):
        factor = jnp.linalg.cholesky(k)
        solved = jax.scipy.linalg.solve_triangular(factor, c[:20].T, lower=True)
        return a @ b, a.T @ c, jnp.einsum("pij,pjk->pik", x, y), jnp.tanh(solved).sum()

    shapes = ((30, 40), (40, 50), (30, 20), (3, 5, 6), (3, 6, 7))
    args = (*(np.ones(shape, np.float32) for shape in shapes), 2 * np.eye(20, dtype=np.float32))
    # "big": the products of at least 2 * 30 * 50 * 40 FLOPs (a @ b alone)
    counts = guide_costs.operation_counts(jax.jit(program).lower(*args).compile().as_text(), big=2 * 30 * 50 * 40)
    assert dict(counts["counts"]) == {"dot_general": 3, "cholesky": 1, "triangular_solve": 1, "big_products": 1}
    # 2 * prod(output) * prod(contracted) for each product, the batched one included
    assert sum(counts["flops"].values()) == 2 * 30 * 50 * 40 + 2 * 40 * 20 * 30 + 2 * 3 * 5 * 7 * 6


def test_guide_costs_table_gives_each_configuration_against_dsvi():
    guide_costs = _load("guide_costs")
    row = {"config": "dsvi", "M": 500, "width": 8, "precision": "float64", "init_seconds": 3.0, "compile_seconds": 12.0,
           "ms_per_step": 200.0, "cholesky_calls": 16, "triangular_solves": 4, "products": 250, "product_gflop": 12.4,
           "xla_gflop": 12.6, "big_products": 0}
    record = {"command": "python benchmarks/guide_costs.py", "machine": "test", "date": "today", "repeats": 5,
              "rows": [row, {**row, "config": "chain", "ms_per_step": 300.0, "cholesky_calls": 20}]}
    # a record written before the init was timed apart has no init_seconds
    old = {k: v for k, v in row.items() if k not in ("init_seconds", "big_products")}
    record["rows"].append({**old, "config": "nested"})
    lines = guide_costs.markdown(record).splitlines()
    dsvi = next(line for line in lines if line.startswith("| AutoFactorizedDGP + DGPElbo"))
    chain = next(line for line in lines if line.startswith("| AutoChainDGP"))
    nested = next(line for line in lines if line.startswith("| AutoFactorizedDGP + NestedCompressionElbo"))
    assert "| 16 | 4 | 250 | 0 | 12.40 | 12.60 | 200.0 | 1.00 | 3.0 | 12.0 |" in dsvi
    assert "| 20 | 4 | 250 | 0 | 12.40 | 12.60 | 300.0 | 1.50 | 3.0 | 12.0 |" in chain
    # a record written before the per-point (MP)^2 products were counted has no big_products
    assert "| 16 | 4 | 250 | - | 12.40 | 12.60 | 200.0 | 1.00 | - | 12.0 |" in nested


@pytest.mark.parametrize("script, stem", [
    ("vecchia_ground_truth", "vecchia_ground_truth_kin8nm"), ("vecchia_ground_truth", "vecchia_ground_truth_power"),
    ("ground_truth_uci", "ground_truth_kin8nm"), ("ground_truth_uci", "ground_truth_power"),
    ("ground_truth_uci", "ground_truth_kin8nm_long"), ("ground_truth_uci", "ground_truth_power_long"),
    ("ground_truth_uci", "ground_truth_kin8nm_methods")])
def test_ground_truth_reports_are_the_rendering_of_their_committed_records(script, stem):
    import argparse

    module = _load(script)
    results = REPO / "benchmarks" / "results"
    record = json.loads((results / f"{stem}.json").read_text())
    args = argparse.Namespace(**record["settings"])
    assert module.report(record, args) == (results / f"{stem}.md").read_text()


def test_ground_truth_refuses_a_kept_reference_made_with_other_settings(tmp_path):
    import pickle

    module = _load("ground_truth_uci")
    args = module.parse(["--data-dir", str(tmp_path), "--sizes", "200", "--reference-cache", str(tmp_path / "ref")])
    settings = {k: getattr(args, k) for k in module.REFERENCE_SETTINGS}
    cache = module.cache_path(args, 200)
    cache.write_bytes(pickle.dumps({"settings": settings}))
    module.check_caches(args)  # the same settings: read back
    cache.write_bytes(pickle.dumps({"settings": {**settings, "draws": 10}}))
    with pytest.raises(SystemExit, match="made with other settings"):
        module.check_caches(args)
    assert cache.exists()  # refused, not removed
