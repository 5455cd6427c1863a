"""The guides' ``q(w_n)`` for latent inputs (:func:`numpyro_dgp.latent_input`), and the small
MLP encoders the amortized guides share.

A latent input's guide site is a placeholder (:class:`LatentQ`) carrying a
:class:`~numpyro_dgp.posteriors.LatentPosterior`: the objectives evaluate it inside the model's
run (an encoder needs the model's encoder input), draw ``w`` from it (once, or ``K`` times for
the importance-weighted bound) and take its KL to the prior in closed form; prediction draws
the latents of new points from their prior.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.example_libraries import stax
from jax.typing import ArrayLike, DTypeLike
from numpyro.distributions import constraints

from numpyro_dgp.posteriors import LatentPosterior

__all__ = ["LATENT_GUIDES", "LatentQ", "LatentSite", "latent_sites", "mlp", "sample_latent"]

#: The values of a guide's ``latent_inputs``: free parameters per point, or an encoder.
LATENT_GUIDES = ("per_point", "amortized")


def mlp(
    hidden_width: int, out_dim: int, num_hidden: int = 2, negative_slope: float = 0.2
) -> tuple[Callable, Callable]:
    """A ``stax`` MLP: ``num_hidden`` Dense layers of ``hidden_width`` with LeakyReLU, then a
    Dense output layer.

    :param hidden_width: width of the hidden layers.
    :param out_dim: output width.
    :param num_hidden: number of hidden layers.
    :param negative_slope: LeakyReLU slope for negative inputs.
    :return: ``(init_fn, apply_fn)``.
    """
    layers = []
    for _ in range(num_hidden):
        layers += [
            stax.Dense(hidden_width),
            stax.elementwise(jax.nn.leaky_relu, negative_slope=negative_slope),
        ]
    return stax.serial(*layers, stax.Dense(out_dim))


def register_mlp(prefix: str, init_fn: Callable, in_dim: int, dtype: DTypeLike) -> Any:
    """The MLP's parameters as ``numpyro.param`` sites ``"<prefix>.<i>"``, initialized by
    ``init_fn`` with a key fixed by the prefix (the same start in every run)."""
    key = jax.random.PRNGKey(zlib.crc32(prefix.encode()))
    _, params = init_fn(key, (-1, in_dim))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    leaves = [
        numpyro.param(f"{prefix}.{i}", jnp.asarray(leaf, dtype)) for i, leaf in enumerate(leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


class LatentSite(NamedTuple):
    """A latent input as a guide sees it.

    :ivar name: the sample site.
    :ivar latent_dim: ``Q``.
    :ivar encoder_dim: ``E``, the encoder input's width.
    :ivar plate: the data plate's name.
    :ivar plate_size: its full size ``N``.
    :ivar batch_size: its subsample size ``B`` in the run the guide was set up on.
    :ivar plate_dim: its dimension.
    :ivar dtype: the site's dtype.
    """

    name: str
    latent_dim: int
    encoder_dim: int
    plate: str
    plate_size: int
    batch_size: int
    plate_dim: int
    dtype: Any


def latent_sites(trace: dict, specs: dict, full_sizes: dict) -> list[LatentSite]:
    """The latent inputs of a prototype trace.

    :param trace: the model's trace.
    :param specs: ``{site: LatentSpec}`` (:func:`numpyro_dgp._protocol.latent_specs`).
    :param full_sizes: ``{plate name: full size}``.
    :return: one :class:`LatentSite` per latent input, in execution order.
    """
    out = []
    for name, spec in specs.items():
        frame = [f for f in trace[name]["cond_indep_stack"] if f.dim == -1][0]
        out.append(
            LatentSite(
                name,
                spec.latent_dim,
                int(spec.encoder_input.shape[-1]),
                frame.name,
                int(full_sizes.get(frame.name, frame.size)),
                int(frame.size),
                frame.dim,
                trace[name]["value"].dtype,
            )
        )
    return out


class LatentQ(dist.Distribution):
    """Placeholder guide site of a latent input: it only carries :attr:`posterior`, which the
    objectives evaluate inside the model's run. Its density is refused, so an objective that
    samples the guide on its own (NumPyro's ``Trace_ELBO``) fails loudly instead of scoring a
    placeholder.

    :param posterior: the site's ``q(w_n)``.
    :param site: the site's name.
    :param value_shape: ``(B, Q)``.
    """

    support = constraints.real

    def __init__(self, posterior: LatentPosterior, site: str, value_shape: tuple[int, ...]) -> None:
        self.posterior = posterior
        self.site = site
        super().__init__(batch_shape=tuple(value_shape[:-1]), event_shape=tuple(value_shape[-1:]))

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        """Zeros: a placeholder value, never used as a draw (the objectives replace it)."""
        return jnp.zeros(tuple(sample_shape) + self.batch_shape + self.event_shape)

    def log_prob(self, value: ArrayLike) -> NoReturn:
        """Refused: ``q(w_n)`` is evaluated inside the model's run.

        :raises NotImplementedError: always.
        """
        raise NotImplementedError(
            f"the guide's q({self.site}) is evaluated inside the model's run, so the guide cannot "
            "be sampled on its own (NumPyro's Trace_ELBO, TraceMeanField_ELBO, Predictive); use "
            "numpyro_dgp.DGPElbo or numpyro_dgp.ImportanceWeightedElbo to train and "
            "numpyro_dgp.predict to predict"
        )


def _softplus_scale(raw: jax.Array) -> jax.Array:
    return jax.nn.softplus(raw) + 1e-6


def sample_latent(site: LatentSite, mode: str, prefix: str, hidden_width: int) -> jax.Array:
    """The guide's placeholder site of one latent input.

    ``"per_point"``: parameters ``"<site>_<prefix>_loc"`` and ``"<site>_<prefix>_scale"`` of
    shape ``(N, Q)`` (starting at the prior, ``N(0, I)``), indexed by the data plate's
    subsample (the guide's plate, whose indices the model's plate replays). ``"amortized"``: an
    MLP ``E -> 2 Q`` (two hidden layers of ``hidden_width``, parameters
    ``"<site>_<prefix>_encoder.<i>"``) giving the mean and, through a softplus, the scale.

    :param site: the latent input.
    :param mode: one of :data:`LATENT_GUIDES`.
    :param prefix: the guide's parameter prefix.
    :param hidden_width: the encoder's width.
    :return: the placeholder's value (zeros, ``(B, Q)``).
    """
    Q, base = site.latent_dim, f"{site.name}_{prefix}"
    if mode == "amortized":
        init_fn, apply_fn = mlp(hidden_width, 2 * Q)
        params = register_mlp(f"{base}_encoder", init_fn, site.encoder_dim, site.dtype)

        def encode(encoder_input):
            out = apply_fn(params, encoder_input)
            return out[..., :Q], _softplus_scale(out[..., Q:])

        return numpyro.sample(
            site.name,
            LatentQ(LatentPosterior(encode), site.name, (site.batch_size, Q)),
            infer={"is_auxiliary": True},
        )
    loc = numpyro.param(f"{base}_loc", jnp.zeros((site.plate_size, Q), site.dtype))
    scale = numpyro.param(
        f"{base}_scale", jnp.ones((site.plate_size, Q), site.dtype), constraint=constraints.positive
    )
    with numpyro.plate(
        site.plate, site.plate_size, subsample_size=site.batch_size, dim=site.plate_dim
    ) as index:
        batch = (loc[index], scale[index])
        return numpyro.sample(
            site.name,
            LatentQ(LatentPosterior(lambda _: batch), site.name, (site.batch_size, Q)),
            infer={"is_auxiliary": True},
        )
