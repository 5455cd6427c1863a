"""VI and MCMC results as ArviZ ``DataTree``s with one layout: each layer's values on a grid."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from numpyro.handlers import seed, substitute, trace

from numpyro_dgp._predict.prediction import layer_outputs, sample_layers
from numpyro_dgp._protocol import inducing_site_names

if TYPE_CHECKING:
    import numpyro.infer
    import xarray


def layer_samples(
    model: Callable,
    samples: dict,
    rng_key: jax.Array,
    grid: ArrayLike,
    *args,
    params: dict | None = None,
    **kwargs,
) -> dict[str, jax.Array]:
    """Every layer's values on ``grid`` for each posterior sample of a sparse DGP, each layer
    drawn jointly over the grid (smooth samples).

    :param model: the model (the plain one, without MCMC handlers).
    :param samples: ``{site: (S, ...)}`` posterior samples; the model's latent sites among
        them (inducing values, sampled hyperparameters) are substituted, others (the data-point
        latents of :class:`~numpyro_dgp.handlers.latent_conditionals`) are ignored.
    :param rng_key: PRNG key (layer outputs given ``u`` are random).
    :param grid: ``(G, D)`` inputs of the first layer.
    :param args: further positional arguments of the model (called as ``model(grid, *args)``).
    :param params: ``numpyro.param`` values (fitted ones, or the model's own if ``None``).
    :param kwargs: keyword arguments of the model.
    :return: ``{layer: (S, G, P)}``.
    """
    grid = jnp.asarray(grid)
    params = dict(params or {})
    probe = trace(seed(substitute(model, data=params), rng_key)).get_trace(grid, *args, **kwargs)
    latent = {n for n, s in probe.items() if s["type"] == "sample" and not s["is_observed"]}
    chosen = {k: jnp.asarray(v) for k, v in samples.items() if k in latent}
    missing = sorted(n for n in inducing_site_names(probe) if n not in chosen)
    if missing:
        # drawing them from the prior would silently mix prior and posterior draws
        raise ValueError(
            f"layer_samples: samples lack the inducing-value sites {missing}; pass the "
            "posterior samples of every layer's inducing values (e.g. mcmc.get_samples())"
        )
    if not chosen:
        raise ValueError(
            f"layer_samples: none of the samples' sites {sorted(samples)} is a latent site of the "
            "model"
        )

    def one(key, sample):
        m = substitute(seed(model, key), data={**params, **sample})
        return layer_outputs(m, True, (grid, *args), kwargs)

    keys = jax.random.split(rng_key, next(iter(chosen.values())).shape[0])  # one per sample
    return jax.jit(jax.vmap(one))(keys, chosen)


def grid_inputs(tree: xarray.DataTree) -> np.ndarray:
    """The ``(G, D)`` grid inputs of a tree in this module's layout."""
    return np.asarray(tree["constant_data"]["grid_x"].values)


def layer_values(tree: xarray.DataTree, name: str, flat: bool = False) -> np.ndarray:
    """The ``(C, D, G, P)`` draws of layer ``name`` of a tree in this module's layout (``flat``:
    the chains one after another, ``(C * D, G, P)``)."""
    values = np.asarray(tree["posterior"][name].values)
    return values.reshape((-1,) + values.shape[2:]) if flat else values


def divergences(tree: xarray.DataTree) -> np.ndarray | None:
    """The ``(C, D)`` divergences of a tree in this module's layout (``None``: not recorded)."""
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"]:
        return np.asarray(tree["sample_stats"]["diverging"].values)
    return None


def layer_names(tree: xarray.DataTree) -> list[str]:
    """The layer variables of a tree made by this module, in order.

    :param tree: a ``DataTree`` in this module's layout.
    :return: the layer names (``[]`` for a tree without the ``layers`` attribute).
    """
    return list(tree.attrs.get("layers") or [])


def from_layer_samples(
    layers: Mapping[str, ArrayLike],
    grid: ArrayLike,
    *,
    num_chains: int = 1,
    extra: dict | None = None,
    sample_stats: dict | None = None,
    label: str | None = None,
) -> xarray.DataTree:
    """A ``DataTree`` in this module's layout.

    :param layers: ``{layer: (C, D, G, P)}`` or ``{layer: (S, G, P)}`` (reshaped into
        ``num_chains`` chains).
    :param grid: ``(G, D_in)`` first-layer inputs.
    :param num_chains: ``C`` for layers given as ``(S, G, P)`` (``S`` a multiple of it).
    :raises ValueError: ``S`` is not a multiple of ``num_chains``.
    :param extra: more posterior variables (e.g. hyperparameters), with the leading dims of
        the layers (``(C, D, ...)`` or ``(S, ...)``).
    :param sample_stats: e.g. ``{"diverging": (C, D)}``.
    :param label: a name for the method (stored in ``attrs``).
    :return: the ``DataTree``: groups ``posterior``, ``constant_data`` (``grid_x``) and, if
        given, ``sample_stats``; the layer names in ``attrs["layers"]``.
    """
    import arviz as az

    def shaped(v):  # (S, ...) -> (C, S / C, ...), unless given by chain as the layers are
        v = np.asarray(v)
        return v if by_chain else v.reshape((num_chains, -1) + v.shape[1:])

    names = list(layers)
    by_chain = np.ndim(layers[names[0]]) == 4
    num_samples = np.shape(layers[names[0]])[0]
    if not by_chain and num_samples % num_chains:
        raise ValueError(
            f"from_layer_samples: {num_samples} samples do not split into num_chains={num_chains} "
            "equal chains; pass a num_chains that divides the number of samples"
        )
    posterior = {n: shaped(v) for n, v in {**layers, **(extra or {})}.items()}
    data = {"posterior": posterior, "constant_data": {"grid_x": np.asarray(grid)}}
    if sample_stats:
        data["sample_stats"] = {k: np.asarray(v) for k, v in sample_stats.items()}
    tree = az.from_dict(
        data,
        dims={**{n: ["grid", f"{n}_output"] for n in names}, "grid_x": ["grid", "grid_x_dim"]},
        coords={"grid": np.arange(np.asarray(grid).shape[0])},
    )
    tree.attrs["layers"] = names
    if label is not None:
        tree.attrs["label"] = label
    return tree


def from_guide(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    grid: ArrayLike,
    *args,
    num_samples: int = 1000,
    label: str | None = None,
    **kwargs,
) -> xarray.DataTree:
    """A fitted guide's per-layer function samples on ``grid`` as a ``DataTree`` (one chain).

    Inducing values are drawn from the guide (jointly across layers, as the guide has them),
    then every layer is drawn jointly over the grid given its sampled input
    (:func:`numpyro_dgp.sample_layers`).

    :param model: the model the guide was fitted to.
    :param guide: the fitted guide.
    :param params: the fitted parameters.
    :param rng_key: PRNG key.
    :param grid: ``(G, D)`` inputs of the first layer.
    :param args: further positional arguments of the model.
    :param num_samples: number of draws.
    :param label: a name for the method (stored in ``attrs``).
    :param kwargs: keyword arguments of the model.
    :return: a ``DataTree`` in this module's layout with one chain of ``num_samples`` draws.
    """
    layers = sample_layers(
        model, guide, params, rng_key, grid, *args, num_samples=num_samples, **kwargs
    )
    return from_layer_samples(layers, grid, label=label)


def from_mcmc(
    mcmc: numpyro.infer.MCMC,
    grid: ArrayLike,
    *,
    model: Callable | None = None,
    params: dict | None = None,
    rng_key: jax.Array | None = None,
    args: tuple = (),
    kwargs: dict | None = None,
    label: str | None = None,
) -> xarray.DataTree:
    """An MCMC run's per-layer function values on ``grid`` as a ``DataTree``, chains kept.

    If the run has ``"<layer>.grid"`` sites (NUTS on :class:`~numpyro_dgp.handlers.exact_layers`
    with this ``grid``) they are used as they are. Otherwise (sparse model: inducing values
    sampled) the layers are re-run on ``grid`` for each sample with :func:`layer_samples`;
    pass the plain ``model``, its ``params`` and an ``rng_key``. Sampled kernel
    hyperparameters (sites with ``".kernel."`` in their name) are kept as posterior variables,
    and NUTS divergences as ``sample_stats/diverging``.

    :param mcmc: a run ``numpyro.infer.MCMC`` (any kernel, e.g. NUTS or
        :class:`~numpyro_dgp.infer.SGHMC`).
    :param grid: ``(G, D)`` inputs of the first layer.
    :param model: the plain model (needed without ``"<layer>.grid"`` sites).
    :param params: ``numpyro.param`` values for the re-run (see :func:`layer_samples`).
    :param rng_key: PRNG key of the re-run (needed without ``"<layer>.grid"`` sites).
    :param args: further positional arguments of the model.
    :param kwargs: keyword arguments of the model.
    :param label: a name for the method (stored in ``attrs``).
    :return: a ``DataTree`` in this module's layout with the run's chains and draws.
    """
    grid = np.asarray(grid)
    samples = mcmc.get_samples(group_by_chain=True)
    C, D = next(iter(samples.values())).shape[:2]
    grid_sites = [k for k in samples if k.endswith(".grid")]
    if grid_sites:
        grid_rows = np.asarray(samples[grid_sites[0]]).shape[2]
        if grid_rows != len(grid):
            raise ValueError(
                f"from_mcmc: the run's grid has {grid_rows} points, grid has {len(grid)}"
            )
        layers = {k[: -len(".grid")]: np.asarray(samples[k]) for k in grid_sites}
    elif model is None or rng_key is None:
        raise ValueError(
            "from_mcmc: the run has no '<layer>.grid' sites (exact_layers with a grid); pass "
            "model= and rng_key= to re-run the layers on the grid with the sampled inducing values"
        )
    else:
        flat = {k: np.asarray(v).reshape((C * D,) + v.shape[2:]) for k, v in samples.items()}
        rerun = layer_samples(model, flat, rng_key, grid, *args, params=params, **(kwargs or {}))
        layers = {k: np.asarray(v).reshape((C, D) + v.shape[1:]) for k, v in rerun.items()}
    hyper = {k: np.asarray(v) for k, v in samples.items() if ".kernel." in k}
    extra = mcmc.get_extra_fields(group_by_chain=True)  # NUTS records divergences, others not
    stats = {"diverging": np.asarray(extra["diverging"])} if "diverging" in extra else None
    return from_layer_samples(layers, grid, extra=hyper, sample_stats=stats, label=label)
