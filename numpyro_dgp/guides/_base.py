"""Shared machinery of the DGP guides (finding the layers' inducing sites in a model),
``AutoFactorizedDGP``: independent Gaussians over each layer's inducing values (DSVI), and the
guides' ``q(w_n)`` for latent inputs (:func:`numpyro_dgp.latent_input`) with the small MLP
encoders the amortized guides share.

A latent input's guide site is a placeholder (:class:`Placeholder`) carrying a
:class:`~numpyro_dgp.posteriors.LatentPosterior`: the objectives evaluate it inside the model's
run (an encoder needs the model's encoder input), draw ``w`` from it (once, or ``K`` times for
the importance-weighted bound) and take its KL to the prior in closed form; prediction draws
the latents of new points from their prior.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
"""

from __future__ import annotations

import zlib
from functools import cache, partial
from typing import Any, Callable, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.example_libraries import stax
from jax.scipy.special import ndtri
from jax.typing import ArrayLike, DTypeLike
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer.autoguide import AutoGuide, AutoNormal
from numpyro.infer.initialization import init_to_mean, init_to_uniform

from numpyro_dgp._compat import softplus_lower_cholesky
from numpyro_dgp._protocol import abstract_read, inducing_tag, latent_specs
from numpyro_dgp._validation import check_choice, check_positive_int, check_positive_number
from numpyro_dgp.posteriors import CholeskyNormal, LatentPosterior, gaussian_parameters


class InducingSite(NamedTuple):
    """One layer's inducing-value site as the guide sees it.

    :ivar name: site name (``"<layer>.u"``).
    :ivar layer: layer name.
    :ivar out_dim: ``P``.
    :ivar num_inducing: ``M``.
    :ivar whiten: whitened prior ``N(0, I)``.
    :ivar is_last: the last layer in execution order.
    :ivar inducing: the layer's inducing mode.
    :ivar dtype: the site's dtype.
    """

    name: str
    layer: str
    out_dim: int
    num_inducing: int
    whiten: bool
    is_last: bool
    inducing: str = "global"
    dtype: Any = None

    @property
    def size(self) -> int:
        """``P * M``, the number of inducing values."""
        return self.out_dim * self.num_inducing


def _init_inducing_to_mean(site: dict) -> Any:
    """Initial values for the prototype run: inducing sites at their prior mean (so that, with
    inducing locations, each layer's locations are the previous layer's prior mean), others
    by NumPyro's ``init_to_uniform``."""
    return init_to_mean(site) if inducing_tag(site) is not None else init_to_uniform(site)


#: The values of ``inner_init``.
INNER_INITS = ("deterministic", "prior")


class DGPGuide(AutoGuide):
    """Base class: finds the ``gp_layer`` inducing sites in the prototype trace and hands the
    remaining latent sites (e.g. hyperparameters with priors) to an ``AutoNormal``.

    :param model: a model built with :func:`numpyro_dgp.gp_layer`.
    :param inner_init: ``"deterministic"`` (inner layers start at ``init_scale`` times their
        prior factor, the DSVI convention) or ``"prior"``; the last layer starts at its prior.
    :param init_scale: the factor for ``"deterministic"``.
    :param prefix: parameter-name prefix.
    :param latent_inputs: the ``q(w_n)`` of the model's latent inputs
        (:func:`numpyro_dgp.latent_input`): ``"per_point"`` (free parameters per training point)
        or ``"amortized"`` (an MLP of the site's encoder input).
    :param latent_hidden_width: the width of the ``"amortized"`` encoder's two hidden layers.
    :raises ValueError: if ``inner_init`` or ``latent_inputs`` is unknown, or ``init_scale`` or
        ``latent_hidden_width`` is not positive.
    """

    #: whether the guide handles layers with per-point inducing sets (``inducing="amortized"``)
    encodes_inducing_sets = False

    def __init__(
        self,
        model: Callable,
        *,
        inner_init: str = "deterministic",
        init_scale: float = 1e-5,
        prefix: str = "auto",
        latent_inputs: str = "per_point",
        latent_hidden_width: int = 32,
    ) -> None:
        name = type(self).__name__
        check_choice(inner_init, INNER_INITS, "inner_init", name)
        check_positive_number(init_scale, "init_scale", name)
        check_choice(latent_inputs, LATENT_GUIDES, "latent_inputs", name)
        check_positive_int(latent_hidden_width, "latent_hidden_width", name)
        self.latent_inputs = latent_inputs
        self.latent_hidden_width = int(latent_hidden_width)
        self.latent_sites: list[LatentSite] = []
        self.inner_init = inner_init
        self.init_scale = float(init_scale)
        super().__init__(model, prefix=prefix, init_loc_fn=_init_inducing_to_mean)
        self.inducing_sites: list[InducingSite] = []
        self._other_guide = None
        #: the shapes and dtypes of the arguments the structure was built from (the
        #: training arguments), so that checks of fitted parameters never rerun initialization
        #: on other inputs
        self.prototype_args: tuple[tuple, dict] | None = None

    def _prototype_model(self, rng_key: jax.Array | None) -> Callable:
        """The model run the structure is read from: latent sites at their initial values
        (inducing values at their prior mean), as NumPyro's ``initialize_model`` runs it."""
        return handlers.substitute(
            handlers.seed(self.model, rng_key), substitute_fn=self.init_loc_fn
        )

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        """Read the model's structure from one abstract run (``jax.eval_shape``: nothing is
        computed or compiled): the sites, their shapes and dtypes, tags, plates. Values the
        guide starts from (the inducing values' prior, which depends on the data through the
        k-means initialization of inducing inputs) are computed when the parameters are
        created (:meth:`_prior_moments`), inside the same run as the rest of initialization."""
        with handlers.block():
            model = self._prototype_model(jax.random.PRNGKey(0))
            self.prototype_trace = abstract_read(model, args, kwargs, _abstract_trace)
        self.prototype_args = jax.tree_util.tree_map(_abstract_value, (args, kwargs))
        for name, site in self.prototype_trace.items():
            if site["type"] == "plate":
                self._prototype_frame_full_sizes[name] = site["args"][0]
        self.inducing_sites = self._read_inducing_sites()
        self.latent_sites = latent_sites(self.prototype_trace, self._prototype_frame_full_sizes)
        u_names = {s.name for s in self.inducing_sites} | {s.name for s in self.latent_sites}
        others = [
            n
            for n, s in self.prototype_trace.items()
            if s["type"] == "sample" and not s["is_observed"] and n not in u_names
        ]
        local = [n for n in others if self.prototype_trace[n]["cond_indep_stack"]]
        latent_names = [s.name for s in self.latent_sites]
        if local and latent_names:
            raise ValueError(
                f"{type(self).__name__}: the model has latent inputs {latent_names} and other "
                f"local latent sites {local}; their guides would draw the data plate's "
                "subsample twice. Make the other local sites latent inputs, or give them a "
                "guide of your own"
            )
        if others:
            self._other_guide = AutoNormal(
                handlers.block(self.model, hide=list(u_names)), prefix=f"{self.prefix}_other"
            )

    def _read_inducing_sites(self) -> list[InducingSite]:
        """The prototype trace's inducing sites in execution order, at least one: global ones
        outside data plates, per-point ones (``inducing='amortized'``) only for a guide that
        ``encodes_inducing_sets``.

        :raises ValueError: otherwise, or if the model has no ``gp_layer`` inducing sites.
        """
        guide = type(self).__name__
        sites = []
        for name, site in self.prototype_trace.items():
            tag = inducing_tag(site)
            if tag is None:
                continue
            if tag.inducing == "amortized" and not self.encodes_inducing_sets:
                raise ValueError(
                    f"{guide}: layer {tag.layer!r} has per-point "
                    "inducing sets (inducing='amortized'); use numpyro_dgp.guides.AutoAmortizedDGP"
                )
            if tag.inducing != "amortized" and site["cond_indep_stack"]:
                plates = [f.name for f in site["cond_indep_stack"]]
                raise ValueError(
                    f"{guide}: inducing site {name!r} is inside plate(s) {plates}; "
                    "call gp_layer outside data plates (subsample the inputs first)"
                )
            P, M = site["value"].shape[-2:]
            dtype = site["value"].dtype
            sites.append(
                InducingSite(name, tag.layer, P, M, tag.whiten, False, tag.inducing, dtype)
            )
        if not sites:
            raise ValueError(
                f"{guide}: the model has no gp_layer inducing sites ('<name>.u'); "
                "build the model with numpyro_dgp.gp_layer"
            )
        sites[-1] = sites[-1]._replace(is_last=True)
        return sites

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, jax.Array]:
        """Sample every latent site of the model (the guide as a NumPyro program).

        The run's key is drawn on every call (so the key stream does not depend on whether the
        structure was built before); the starting values (:meth:`_prior_moments`) are computed
        with it. The structure is built once.
        """
        rng_key = numpyro.prng_key()
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        # the latent sites other than the inducing values: AutoNormal's, and the latent
        # inputs' placeholders
        result = {} if self._other_guide is None else dict(self._other_guide(*args, **kwargs))
        for site in self.latent_sites:
            result[site.name] = sample_latent(
                site, self.latent_inputs, self.prefix, self.latent_hidden_width
            )
        result.update(self._sample_inducing(rng_key, args, kwargs))
        return result

    def _sample_inducing(self, rng_key: jax.Array | None, args: tuple, kwargs: dict) -> dict:
        """``{site: value}`` of the inducing sites (each guide's own)."""
        raise NotImplementedError

    def _prior_moments(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> tuple[jax.Array, jax.Array]:
        """``(loc (P, M), scale_tril (P, M, M))`` of the site's prior at initialization.

        Whitened global inducing values need no model run (``N(0, I)``); otherwise the prior
        (``K(Z, Z)`` at the k-means inducing inputs, the inducing locations' mean) comes from
        one run of the model at its initial values with ``rng_key``.
        """
        P, M = site.out_dim, site.num_inducing
        if site.inducing == "global" and site.whiten:
            # built on the host: an eager run (svi.init) compiles nothing for these constants
            eye = np.broadcast_to(np.eye(M, dtype=site.dtype), (P, M, M))
            return jax.device_put(np.zeros((P, M), site.dtype)), jax.device_put(eye)
        with handlers.block():
            tr = handlers.trace(self._prototype_model(rng_key)).get_trace(*args, **kwargs)
        moments = gaussian_parameters(tr[site.name]["fn"], (P, M))
        assert moments is not None  # gp_layer's inducing prior is a multivariate normal
        return moments

    def setup(self, rng_key: jax.Array, *args: Any, **kwargs: Any) -> DGPGuide:
        """Build the guide's structure from the model run on the *training* arguments.

        ``svi.init`` does this; call it on a fresh guide before :func:`numpyro_dgp.predict`
        with loaded parameters (with ``y`` given, so ``y`` is not mistaken for a latent site).

        :param rng_key: PRNG key of the (blocked) initialization run.
        :param args: the model's positional arguments.
        :param kwargs: the model's keyword arguments.
        :return: ``self``.
        """
        # one blocked run builds this guide and any sub-guide (AutoNormal) it owns
        with handlers.block():
            handlers.seed(self, rng_key)(*args, **kwargs)
        return self

    def sample_posterior(
        self,
        rng_key: jax.Array,
        params: dict,
        *args: Any,
        sample_shape: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> dict[str, jax.Array]:
        """Draw latent values (inducing sites and any others) from the fitted guide.

        :param rng_key: PRNG key.
        :param params: the guide's parameter values.
        :param args: the model's positional arguments.
        :param sample_shape: leading shape of the draws.
        :param kwargs: the model's keyword arguments.
        :return: ``{site: array of shape sample_shape + site shape}``.
        """
        if self.prototype_trace is None:
            self.setup(rng_key, *args, **kwargs)

        def one(key, params):
            tr = handlers.trace(
                handlers.seed(handlers.substitute(self, data=params), key)
            ).get_trace(*args, **kwargs)
            return {
                n: s["value"]
                for n, s in tr.items()
                if s["type"] == "sample"
                and not s["is_observed"]
                and not s["infer"].get("is_auxiliary")
            }

        keys = jax.random.split(rng_key, int(np.prod(sample_shape)))
        samples = jax.jit(jax.vmap(one, in_axes=(0, None)))(keys, params)
        return jax.tree_util.tree_map(
            lambda x: x.reshape(tuple(sample_shape) + x.shape[1:]), samples
        )

    @staticmethod
    def _lazy_param(name: str, init: Callable[[], jax.Array], **kwargs: Any) -> jax.Array:
        """``numpyro.param(name, ...)`` whose initial value ``init()`` is computed only when the
        parameter is created (not when a value is substituted, as in every training step).

        NumPyro draws a key from the run's stream for a callable initial value; the draw here
        is served by a stream of its own, so the guide's samples get the same keys as before.
        """
        create = partial(numpyro.param, name, lambda _: init(), **kwargs)
        return handlers.block(
            handlers.seed(create, rng_seed=0), hide_fn=lambda msg: msg["type"] == "prng_key"
        )()

    def _initial_scale_tril(self, site: InducingSite, prior_scale_tril: jax.Array) -> jax.Array:
        """``(P, M, M)`` starting factor of ``site`` under :attr:`inner_init`."""
        if self.inner_init == "deterministic" and not site.is_last:
            return prior_scale_tril * self.init_scale
        return prior_scale_tril

    def _locs(self, params: dict) -> dict[str, jax.Array]:
        """``{site: (P, M)}`` the means of the inducing values (each guide's own)."""
        raise NotImplementedError

    def _stds(self, params: dict) -> dict[str, jax.Array]:
        """``{site: (P, M)}`` the marginal standard deviations of the inducing values."""
        raise NotImplementedError

    def median(self, params: dict) -> dict[str, jax.Array]:
        """Posterior medians: the means of the inducing values (and AutoNormal's for others).

        :param params: the guide's parameter values.
        :return: ``{site: value}``, ``(P, M)`` per inducing site.
        """
        out = {} if self._other_guide is None else self._other_guide.median(params)
        out.update(self._locs(params))
        return out

    def quantiles(self, params: dict, quantiles: ArrayLike) -> dict[str, jax.Array]:
        """Marginal quantiles ``m + z_q sd`` of every site (``sd`` the marginal standard
        deviation).

        :param params: the guide's parameter values.
        :param quantiles: ``(Q,)`` probabilities.
        :return: ``{site: value}``, ``(Q, P, M)`` per inducing site.
        """
        quantiles = jnp.asarray(quantiles)
        out = {} if self._other_guide is None else self._other_guide.quantiles(params, quantiles)
        z = ndtri(quantiles).reshape((-1, 1, 1))
        stds = self._stds(params)
        for name, loc in self._locs(params).items():
            out[name] = loc + z * stds[name]
        return out


def _abstract_value(x: Any) -> Any:
    """``x`` with its arrays as ``jax.ShapeDtypeStruct`` (a
    :class:`~numpyro_dgp._protocol.InducingTag` or a ``LatentSpec``: its ``encoder_input``)."""
    if hasattr(x, "encoder_input"):
        return x._replace(encoder_input=_abstract_value(x.encoder_input))
    if isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval"):
        weak = bool(getattr(getattr(x, "aval", None), "weak_type", False))
        return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), weak_type=weak)
    return x


def _abstract_trace(tr: dict) -> dict:
    """What the guides keep of a prototype trace: each site's type, value shape and dtype
    (``jax.ShapeDtypeStruct``), tags, plates, observed flag and plain arguments (sizes, a
    latent input's ``LatentSpec``); no distributions and no values, so nothing of the abstract
    run (its tracers) outlives it."""
    out = {}
    for name, site in tr.items():
        out[name] = {
            "type": site["type"],
            "name": name,
            "value": _abstract_value(site.get("value")),
            "infer": {k: _abstract_value(v) for k, v in (site.get("infer") or {}).items()},
            "is_observed": site.get("is_observed", False),
            "cond_indep_stack": site.get("cond_indep_stack", []),
            "args": tuple(
                _abstract_value(a)
                for a in site.get("args", ())
                if isinstance(a, (int, np.integer, type(None))) or hasattr(a, "encoder_input")
            ),
        }
    return out


class AutoFactorizedDGP(DGPGuide):
    """Doubly stochastic variational inference's guide (Salimbeni & Deisenroth 2017).

    ``q(u) = prod_l prod_p N(u_lp | m_lp, S_lp)`` with a full Cholesky factor per layer and
    output. Its Gaussian is read off the guide trace by :class:`numpyro_dgp.DGPElbo`, which
    marginalizes the inducing values; with NumPyro's ``Trace_ELBO`` the values are sampled
    (as :class:`~numpyro_dgp.posteriors.CholeskyNormal`: the log-density of a draw needs no
    solve against the factor, so a near-deterministic inner layer cannot overflow it).

    :param model: a NumPyro model built with :func:`numpyro_dgp.gp_layer`.
    :param inner_init: ``"deterministic"`` (inner layers start with ``sqrt(S) = init_scale``
        times the prior factor, the DSVI convention) or ``"prior"`` (every layer starts at
        its prior). The last layer always starts at its prior.
    :param init_scale: the factor for ``"deterministic"`` (default ``1e-5``).
    :param prefix: parameter-name prefix; parameters are ``"<site>_<prefix>_loc"`` and
        ``"<site>_<prefix>_scale_tril"``.
    """

    def _q(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> tuple[jax.Array, jax.Array]:
        """The parameters of ``q(u)`` for one inducing site: ``loc (P, M)``,
        ``scale_tril (P, M, M)`` (starting, when they are created, from the prior at
        initialization)."""
        # computed once, when the first parameter is created
        prior = cache(partial(self._prior_moments, site, rng_key, args, kwargs))
        loc = self._lazy_param(f"{site.name}_{self.prefix}_loc", lambda: prior()[0])
        scale_tril = self._lazy_param(
            f"{site.name}_{self.prefix}_scale_tril",
            lambda: self._initial_scale_tril(site, prior()[1]),
            constraint=softplus_lower_cholesky,
        )
        return loc, scale_tril

    def _sample_inducing(self, rng_key: jax.Array | None, args: tuple, kwargs: dict) -> dict:
        return {s.name: self._sample_site(s, rng_key, args, kwargs) for s in self.inducing_sites}

    def _sample_site(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> jax.Array:
        loc, scale_tril = self._q(site, rng_key, args, kwargs)
        return numpyro.sample(site.name, CholeskyNormal(loc, scale_tril).to_event(1))

    def _locs(self, params: dict) -> dict[str, jax.Array]:
        return {s.name: params[f"{s.name}_{self.prefix}_loc"] for s in self.inducing_sites}

    def _stds(self, params: dict) -> dict[str, jax.Array]:
        """``sqrt(diag S)`` per site."""
        return {
            s.name: jnp.sqrt(jnp.sum(params[f"{s.name}_{self.prefix}_scale_tril"] ** 2, axis=-1))
            for s in self.inducing_sites
        }


# ---- latent inputs: the guides' q(w_n), and the MLP encoders ----


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
    hidden = [stax.Dense(width), stax.elementwise(jax.nn.leaky_relu, negative_slope=0.2)]
    init_fn, apply_fn = stax.serial(*(hidden * num_hidden), stax.Dense(out_dim))
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


def _latent_site(site: LatentSite, posterior: LatentPosterior) -> jax.Array:
    """The latent input's auxiliary guide site: a :class:`Placeholder` carrying ``posterior``."""
    refusal = (
        f"the guide's q({site.name}) is evaluated inside the model's run, so the guide cannot "
        "be sampled on its own (NumPyro's Trace_ELBO, TraceMeanField_ELBO, Predictive); use "
        "numpyro_dgp.DGPElbo or numpyro_dgp.ImportanceWeightedElbo to train and "
        "numpyro_dgp.predict to predict"
    )
    fn = Placeholder(posterior, site.name, (site.batch_size, site.latent_dim), 1, refusal)
    return numpyro.sample(site.name, fn, infer={"is_auxiliary": True})


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

        return _latent_site(site, LatentPosterior(encode))
    loc = numpyro.param(f"{base}_loc", jnp.zeros((site.plate_size, Q), site.dtype))
    scale = numpyro.param(
        f"{base}_scale", jnp.ones((site.plate_size, Q), site.dtype), constraint=constraints.positive
    )
    with numpyro.plate(
        site.plate, site.plate_size, subsample_size=site.batch_size, dim=-1
    ) as index:
        batch = (loc[index], scale[index])
        return _latent_site(site, LatentPosterior(lambda _: batch))


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
