"""The diagnostics' figures for inputs of any dimension: the horizontal axis of plot_layers (an
input coordinate, a given projection, or the first principal component), lines only where the
horizontal value determines the point, and the refusals of a bad axis."""

import warnings

import matplotlib
import numpy as np
import pytest

from numpyro_dgp import diagnostics

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

G, S = 30, 6


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _grid_2d():
    rng = np.random.default_rng(0)
    # a cloud stretched along (1, 2) / sqrt(5): its first principal component is clear
    return (
        rng.normal(size=(G, 2))
        @ np.array([[3.0, 0.0], [0.0, 0.4]])
        @ np.array([[1.0, 2.0], [-2.0, 1.0]])
        / np.sqrt(5)
    )


def _layers(grid, P1=1, noise=0.0):
    """Two layers whose samples are the same functions of the grid (plus ``noise``), so the
    figure's points can be checked against them: h1 = sin(sum x) per output, h2 = h1[0]^2."""
    rng = np.random.default_rng(1)
    h1 = (
        np.sin(grid.sum(axis=1))[None, :, None]
        + np.arange(P1)
        + noise * rng.normal(size=(S, G, P1))
    )
    h1 = np.broadcast_to(h1, (S, G, P1))
    return {"h1": h1, "h2": h1[..., :1] ** 2}


def _offsets(ax, k=0):
    return np.asarray(ax.collections[k].get_offsets())


def _first_pc(grid):
    centred = grid - grid.mean(axis=0)
    w, v = np.linalg.eigh(np.cov(centred.T))
    pc = v[:, np.argmax(w)]
    return centred @ (pc if pc[np.argmax(np.abs(pc))] >= 0 else -pc)  # largest loading > 0


def test_plot_layers_defaults_to_the_first_principal_component_for_2d_inputs():
    grid = _grid_2d()
    layers = _layers(grid)
    fig = diagnostics.plot_layers({"vi": diagnostics.from_layer_samples(layers, grid)})
    first, hidden, composition = fig.axes
    pc = _first_pc(grid)
    order = np.argsort(pc)
    # markers, not lines: x is 2-D, the component does not determine the point
    assert not first.lines and len(first.collections) == S
    np.testing.assert_allclose(_offsets(first)[:, 0], pc[order], atol=1e-10)
    assert np.all(np.diff(_offsets(first)[:, 0]) >= 0)
    np.testing.assert_allclose(_offsets(first)[:, 1], layers["h1"][0, order, 0])
    np.testing.assert_allclose(_offsets(composition)[:, 0], pc[order], atol=1e-10)
    np.testing.assert_allclose(_offsets(composition)[:, 1], layers["h2"][0, order, 0])
    assert "principal component" in first.get_xlabel() and "D = 2" in first.get_xlabel()
    assert first.get_xlabel() == composition.get_xlabel()
    # the hidden layer against its one-dimensional input: a function of it, so lines, sorted
    assert not hidden.collections and len(hidden.lines) == S
    xs = hidden.lines[0].get_xdata()
    np.testing.assert_allclose(xs, np.sort(layers["h1"][0, :, 0]))
    np.testing.assert_allclose(hidden.lines[0].get_ydata(), xs**2)
    assert hidden.get_xlabel() == "h1"


def test_plot_layers_takes_an_input_coordinate_or_a_projection():
    grid = _grid_2d()
    layers = _layers(grid)
    tree = diagnostics.from_layer_samples(layers, grid)
    fig = diagnostics.plot_layers({"vi": tree}, x=np.int64(1))
    order = np.argsort(grid[:, 1], kind="stable")
    np.testing.assert_array_equal(_offsets(fig.axes[0])[:, 0], grid[order, 1])
    np.testing.assert_allclose(_offsets(fig.axes[0])[:, 1], layers["h1"][0, order, 0])
    np.testing.assert_array_equal(_offsets(fig.axes[-1])[:, 0], grid[order, 1])
    assert fig.axes[0].get_xlabel() == "x[1] (coordinate 1 of 2)"
    projection = grid @ np.array([0.3, -1.2])
    fig = diagnostics.plot_layers({"vi": tree}, x=projection)
    order = np.argsort(projection, kind="stable")
    for ax in (fig.axes[0], fig.axes[-1]):
        assert not ax.lines
        np.testing.assert_array_equal(_offsets(ax)[:, 0], projection[order])
    np.testing.assert_allclose(_offsets(fig.axes[-1])[:, 1], layers["h2"][0, order, 0])
    assert fig.axes[0].get_xlabel() == "x projected (values given)"


def test_plot_layers_keeps_lines_for_1d_inputs_sorted_along_each_hidden_sample():
    grid = np.linspace(-2.0, 2.0, G)[::-1, None]  # stored in decreasing order
    layers = _layers(grid, noise=0.3)
    fig = diagnostics.plot_layers({"vi": diagnostics.from_layer_samples(layers, grid)})
    first, hidden, composition = fig.axes
    for ax in (first, composition):
        assert not ax.collections and len(ax.lines) == S
        np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.sort(grid[:, 0]))
        assert ax.get_xlabel() == "x"
    # the hidden input is not monotone in x: each sample's line is sorted by it
    for line in hidden.lines:
        xs = line.get_xdata()
        assert np.all(np.diff(xs) >= 0)
        np.testing.assert_allclose(line.get_ydata(), xs**2)
    # x=0 on a 1-D grid is the same coordinate: lines again
    fig = diagnostics.plot_layers({"vi": diagnostics.from_layer_samples(layers, grid)}, x=0)
    assert len(fig.axes[0].lines) == S and not fig.axes[0].collections


def test_plot_layers_marks_a_multi_output_hidden_input_by_its_coordinate_0():
    grid = _grid_2d()
    layers = _layers(grid, P1=3)
    fig = diagnostics.plot_layers({"vi": diagnostics.from_layer_samples(layers, grid)}, x=0)
    hidden = fig.axes[1]
    assert not hidden.lines and len(hidden.collections) == S
    h = layers["h1"][0, :, 0]
    np.testing.assert_allclose(_offsets(hidden)[:, 0], np.sort(h))
    assert hidden.get_xlabel() == "h1[0] (output 0 of 3)"
    assert fig.axes[0].get_ylabel() == "vi\nh1[0] (output 0 of 3)"


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (2, r"as an index must be an integer input coordinate in \[0, 2\), got 2"),
        (-1, r"as an index .* in \[0, 2\), got -1"),
        (1.0, r"as an index .* in \[0, 2\), got 1.0"),
        (True, r"as an index .* in \[0, 2\), got True"),
        (np.array(1.5), r"as an index .* in \[0, 2\), got array\(1.5\)"),
        (np.zeros(G - 1), r"as a projection .* shape \(30,\), got shape \(29,\)"),
        (np.zeros((G, 1)), r"as a projection .* shape \(30,\), got shape \(30, 1\)"),
        (np.array(["a"] * G), r"as a projection must hold one number per grid point"),
        (
            np.r_[np.zeros(G - 2), np.nan, np.inf],
            "as a projection must be finite, got 2 non-finite values",
        ),
    ],
)
def test_plot_layers_refuses_a_bad_x_before_drawing(x, match):
    grid = _grid_2d()
    tree = diagnostics.from_layer_samples(_layers(grid), grid)
    before = plt.get_fignums()
    with pytest.raises(ValueError, match="plot_layers: x " + match):
        diagnostics.plot_layers({"vi": tree}, x=x)
    assert plt.get_fignums() == before


def test_compare_passes_x_on_and_refuses_a_bad_one_first():
    grid = _grid_2d()
    rng = np.random.default_rng(2)

    def tree():
        return diagnostics.from_layer_samples(
            {"h1": rng.normal(size=(40, G, 1)), "h2": rng.normal(size=(40, G, 1))},
            grid,
            num_chains=2,
        )

    vi, mcmc = tree(), tree()
    with warnings.catch_warnings():  # few draws: the health report may warn about them
        warnings.simplefilter("ignore")
        comp = diagnostics.compare({"vi": vi}, mcmc, points=[3, 7], x=grid[:, 0] - grid[:, 1])
        with pytest.raises(ValueError, match="plot_layers: x as an index"):
            diagnostics.compare({"vi": vi}, mcmc, x=5)
    layers = comp.figures["layers"]
    for k in (0, 2, 3, 5):  # first layer and composition, rows vi and MCMC
        offsets = _offsets(layers.axes[k])[:, 0]
        np.testing.assert_array_equal(offsets, np.sort(grid[:, 0] - grid[:, 1]))
    marginals = comp.figures["marginals"]
    assert marginals.axes[0].get_title() == f"h1 at x = ({grid[3, 0]:.2f}, {grid[3, 1]:.2f})"


def test_plot_marginals_names_points_of_many_dimensions_by_index():
    grid = np.random.default_rng(3).normal(size=(G, 5))
    tree = diagnostics.from_layer_samples({"f": np.zeros((S, G, 2))}, grid)
    fig = diagnostics.plot_marginals({"vi": tree}, points=[4])
    assert fig.axes[0].get_title() == "f[0] (output 0 of 2) at grid point 4"
    fig = diagnostics.plot_layers({"vi": tree})
    assert "D = 5" in fig.axes[0].get_xlabel()


def test_plot_layer_samples_draws_1d_inputs_and_refuses_several_dimensions():
    """plots.plot_layer_samples: each layer against x or its sorted input, the composition against x;
    a grid of two input dimensions is refused (joined lines along one coordinate would mislead)."""
    from numpyro_dgp.plots import plot_layer_samples

    rng = np.random.default_rng(0)
    grid = np.linspace(-1, 1, 9)[:, None]
    samples = {"h1": rng.normal(size=(3, 9, 1)), "h2": rng.normal(size=(3, 9, 1))}
    fig = plot_layer_samples(grid, samples)
    axes = fig.axes
    np.testing.assert_array_equal(axes[0].lines[0].get_xdata(), grid[:, 0])
    hidden = axes[1].lines[0].get_xdata()
    np.testing.assert_array_equal(hidden, np.sort(samples["h1"][0, :, 0]))
    np.testing.assert_array_equal(axes[2].lines[0].get_ydata(), samples["h2"][0, :, 0])
    plt.close(fig)
    with pytest.raises(ValueError, match=r"grid must have shape \(N, 1\), got \(9, 2\)"):
        plot_layer_samples(np.ones((9, 2)), samples)
