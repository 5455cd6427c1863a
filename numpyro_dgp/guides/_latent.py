"""The guides' ``q(w_n)`` for latent inputs (:func:`numpyro_dgp.latent_input`), and the small
MLP encoders the amortized guides share.

A latent input's guide site is a placeholder (:class:`Placeholder`) carrying a
:class:`~numpyro_dgp.posteriors.LatentPosterior`: the objectives evaluate it inside the model's
run (an encoder needs the model's encoder input), draw ``w`` from it (once, or ``K`` times for
the importance-weighted bound) and take its KL to the prior in closed form; prediction draws
the latents of new points from their prior.
"""

from __future__ import annotations

import zlib
from functools import partial
from typing import Any, Callable, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.example_libraries import stax
from jax.typing import ArrayLike, DTypeLike
from numpyro.distributions import constraints

from numpyro_dgp._protocol import latent_specs
from numpyro_dgp.posteriors import LatentPosterior

#: The values of a guide's ``latent_inputs``: free parameters per point, or an encoder.
LATENT_GUIDES = ("per_point", "amortized")


def mlp(
    name: str, in_dim: int, width: int, out_dim: int, dtype: DTypeLike, num_hidden: int = 2
) -> Callable:
    """A ``stax`` MLP ``in_dim -> out_dim``: ``num_hidden`` Dense layers of ``width`` with
    LeakyReLU(0.2), then a Dense output layer. Its parameters are ``numpyro.param`` sites
    ``"<name>.<i>"``, initialized with a key fixed by the name (the same start in every run).

    :return: the network, ``(..., in_dim) -> (..., out_dim)``.
    """
    layers = []
    for _ in range(num_hidden):
        layers += [stax.Dense(width), stax.elementwise(jax.nn.leaky_relu, negative_slope=0.2)]
    init_fn, apply_fn = stax.serial(*layers, stax.Dense(out_dim))
    _, params = init_fn(jax.random.PRNGKey(zlib.crc32(name.encode())), (-1, in_dim))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    leaves = [
        numpyro.param(f"{name}.{i}", jnp.asarray(leaf, dtype)) for i, leaf in enumerate(leaves)
    ]
    return partial(apply_fn, jax.tree_util.tree_unflatten(treedef, leaves))


class LatentSite(NamedTuple):
    """A latent input as a guide sees it.

    :ivar name: the sample site.
    :ivar latent_dim: ``Q``.
    :ivar encoder_dim: ``E``, the encoder input's width.
    :ivar plate: the data plate's name (its dimension is ``-1``).
    :ivar plate_size: its full size ``N``.
    :ivar batch_size: its subsample size ``B`` in the run the guide was set up on.
    :ivar dtype: the site's dtype.
    """

    name: str
    latent_dim: int
    encoder_dim: int
    plate: str
    plate_size: int
    batch_size: int
    dtype: Any


def latent_sites(trace: dict, full_sizes: dict) -> list[LatentSite]:
    """The latent inputs of a prototype trace (its :func:`~numpyro_dgp._protocol.latent_specs`).

    :param trace: the model's trace.
    :param full_sizes: ``{plate name: full size}``.
    :return: one :class:`LatentSite` per latent input, in execution order.
    """
    out = []
    for name, spec in latent_specs(trace).items():
        frame = [f for f in trace[name]["cond_indep_stack"] if f.dim == -1][0]
        out.append(
            LatentSite(
                name,
                spec.latent_dim,
                int(spec.encoder_input.shape[-1]),
                frame.name,
                int(full_sizes.get(frame.name, frame.size)),
                int(frame.size),
                trace[name]["value"].dtype,
            )
        )
    return out


class Placeholder(dist.Distribution):
    """A guide's placeholder site for a ``q`` that depends on the model's run (a latent input's
    ``q(w_n)``, an amortized layer's ``q(u_n | p_n)``): it only carries :attr:`posterior`,
    which the objectives evaluate inside the model's run. Its density is refused (with
    ``refusal``), so an objective that samples the guide on its own (NumPyro's ``Trace_ELBO``)
    fails loudly instead of scoring a placeholder.

    :param posterior: the site's ``q``.
    :param site: the site's name.
    :param value_shape: the site's value shape.
    :param event_dim: how many of its trailing dimensions are the event.
    :param refusal: the message :meth:`log_prob` raises.
    """

    support = constraints.real

    def __init__(
        self, posterior: Any, site: str, value_shape: tuple[int, ...], event_dim: int, refusal: str
    ) -> None:
        self.posterior = posterior
        self.site = site
        self.refusal = refusal
        value_shape = tuple(value_shape)
        super().__init__(batch_shape=value_shape[:-event_dim], event_shape=value_shape[-event_dim:])

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        """Zeros: a placeholder value, never used as a draw (the objectives replace it)."""
        return jnp.zeros(tuple(sample_shape) + self.batch_shape + self.event_shape)

    def log_prob(self, value: ArrayLike) -> NoReturn:
        """Refused: ``q`` is evaluated inside the model's run.

        :raises NotImplementedError: always.
        """
        raise NotImplementedError(self.refusal)


def _latent_placeholder(site: LatentSite, posterior: LatentPosterior) -> Placeholder:
    refusal = (
        f"the guide's q({site.name}) is evaluated inside the model's run, so the guide cannot "
        "be sampled on its own (NumPyro's Trace_ELBO, TraceMeanField_ELBO, Predictive); use "
        "numpyro_dgp.DGPElbo or numpyro_dgp.ImportanceWeightedElbo to train and "
        "numpyro_dgp.predict to predict"
    )
    shape = (site.batch_size, site.latent_dim)
    return Placeholder(posterior, site.name, shape, 1, refusal)


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
        network = mlp(f"{base}_encoder", site.encoder_dim, hidden_width, 2 * Q, site.dtype)

        def encode(encoder_input):
            out = network(encoder_input)
            return out[..., :Q], jax.nn.softplus(out[..., Q:]) + 1e-6

        return numpyro.sample(
            site.name,
            _latent_placeholder(site, LatentPosterior(encode)),
            infer={"is_auxiliary": True},
        )
    loc = numpyro.param(f"{base}_loc", jnp.zeros((site.plate_size, Q), site.dtype))
    scale = numpyro.param(
        f"{base}_scale", jnp.ones((site.plate_size, Q), site.dtype), constraint=constraints.positive
    )
    with numpyro.plate(
        site.plate, site.plate_size, subsample_size=site.batch_size, dim=-1
    ) as index:
        batch = (loc[index], scale[index])
        return numpyro.sample(
            site.name,
            _latent_placeholder(site, LatentPosterior(lambda _: batch)),
            infer={"is_auxiliary": True},
        )


def latent_draw(
    posterior: LatentPosterior, encoder_input: jax.Array, eps: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(w, loc, scale)``: draws ``w = loc + scale * eps`` of a latent input's ``q(w_n)``
    (``posterior``, evaluated at the model's ``encoder_input``), in the encoder input's dtype."""
    loc, scale = posterior.encode(encoder_input)
    dtype = encoder_input.dtype
    loc, scale = jnp.asarray(loc, dtype), jnp.asarray(scale, dtype)
    return loc + scale * eps, loc, scale


def latent_kl(loc: jax.Array, scale: jax.Array) -> jax.Array:
    """``(B,)`` ``KL[N(loc, scale^2) || N(0, I)]`` of each point's ``q(w_n)``."""
    kl = -jnp.log(scale) + 0.5 * (scale**2 + loc**2 - 1.0)
    return jnp.sum(kl, axis=-1)
