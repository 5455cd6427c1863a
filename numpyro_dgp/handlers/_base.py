"""What several handlers share (per-run state, refusing special layers, finding the last layer,
scoring a Gaussian observation site with a density that does not factorize over points), and the
small handlers: fast minibatch indices, data-parallel sharding of the data plate, coherent
function samples, layers at chosen inputs, weighted quadrature branches (AR2P for any guide).

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike
from numpyro.handlers import block, seed
from numpyro.primitives import Messenger

from numpyro_dgp._compat import numpyro_subsample_fn
from numpyro_dgp._protocol import (
    LAYER_MESSAGE,
    LAYER_RULE,
    abstract_read,
    get_tag,
    layer_call,
    message_layer,
    replace_layer_inputs,
    request_full_cov,
    trace_layer_names,
    with_tag,
)
from numpyro_dgp._validation import check_mapping, check_positive_int
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import (
    check_points,
    check_weights,
    quadrature_log_weights,
    quadrature_points,
    unwrap_distribution,
)


class PerRunMessenger(Messenger):
    """A handler whose per-run state (layer order, grid outputs) is reset on every model run
    (and when it is built)."""

    def __init__(self, fn: Callable | None = None) -> None:
        self._reset()
        super().__init__(fn)

    def __enter__(self) -> PerRunMessenger:
        """Reset the per-run state and push the handler on the stack."""
        self._reset()
        super().__enter__()
        return self

    #: The last ``gp_layer`` the model runs, found once (by an abstract run) for a handler
    #: whose :meth:`_needs_last_layer` asks for it.
    _last_layer: str | None = None

    def _reset(self) -> None:
        """Reset the per-run state (subclasses override this)."""

    def _needs_last_layer(self) -> bool:
        """Whether the handler acts on the model's last layer (subclasses override this)."""
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model under the handler (finding its last layer first, by an abstract run,
        where it needs it)."""
        if self._needs_last_layer() and self._last_layer is None:
            # block: the probe's messages reach none of the handlers outside this one
            with block():
                names = abstract_read(seed(self.fn, 0), args, kwargs, trace_layer_names)
            if not names:
                raise ValueError(f"{type(self).__name__}: the model runs no gp_layer")
            self._last_layer = names[-1]
        return super().__call__(*args, **kwargs)

    def _problem_after_run(self) -> str | None:
        """What went wrong in a run that finished without an exception, or ``None``
        (subclasses override this; the error is raised after the handler leaves the stack)."""
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *exc_rest: Any) -> None:
        """Pop the handler off the stack; raise :meth:`_problem_after_run` if the run had one."""
        problem = self._problem_after_run() if exc_type is None else None
        super().__exit__(exc_type, *exc_rest)
        if problem is not None:
            raise ValueError(problem)


def check_layer_supported(msg: dict, handler: str) -> None:
    """Refuse a layer message ``handler`` cannot take: per-point inducing sets and a layer
    another handler's rule computes (the same refusal for every handler that replaces a
    layer's computation).

    :raises NotImplementedError: for either.
    """
    layer = message_layer(msg)
    if layer.inducing == "amortized":
        raise NotImplementedError(
            f"{handler}: layer {layer.name!r} has per-point inducing sets "
            f"(inducing='amortized'), which {handler} does not support; give the layer "
            "global inducing points (inducing='global' or 'locations')"
        )
    rule = get_tag(msg, LAYER_RULE)
    if rule is not None and rule.computes_layer:
        raise NotImplementedError(
            f"{handler}: layer {layer.name!r} is {rule.what}, which {handler} does not support"
        )


def gaussian_observation(
    msg: dict, layer: Layer, N: int, caller: str, refusal: str
) -> tuple[dist.Normal, jax.Array, jax.Array]:
    """The Normal likelihood of an observation site scored against ``layer``'s ``P`` outputs at
    ``N`` points, its value checked to be ``(N, P)`` (or ``(N,)`` for one output), and the
    likelihood's variances ``(N, P)``.

    :param refusal: what the error for another likelihood says after naming it.
    :raises NotImplementedError: for a likelihood that is not a Normal.
    :raises ValueError: for a value of another shape.
    """
    base = unwrap_distribution(msg["fn"])
    if not isinstance(base, dist.Normal):
        raise NotImplementedError(
            f"{caller}: observation site {msg['name']!r} has likelihood {type(base).__name__}; "
            + refusal
        )
    y = jnp.asarray(msg["value"])
    P = layer.out_dim
    if y.shape not in [(N, P)] + ([(N,)] if P == 1 else []):
        raise ValueError(
            f"{caller}: observation site {msg['name']!r} has shape {y.shape}; layer "
            f"{layer.name!r} puts {P} output(s) at {N} points, so it must be ({N}, {P})"
            + (f" or ({N},)" if P == 1 else "")
        )
    return base, y, jnp.broadcast_to(base.scale**2, y.shape).reshape(N, P)


class SpreadTotal(dist.Distribution):
    """Stands in for an observed site whose joint log density (:meth:`total_log_prob`) does not
    factorize over points: spread evenly over the batch entries (their sum is exact; a single
    entry means nothing on its own). Scoring only."""

    support = dist.constraints.real
    reparametrized_params: list[str] = []

    def log_prob(self, value: jax.Array) -> jax.Array:
        total = self.total_log_prob(value)
        return jnp.full(
            self.batch_shape, total / np.prod(self.batch_shape), dtype=jnp.result_type(total)
        )

    def total_log_prob(self, value: jax.Array) -> jax.Array:
        """The joint log density of the observations ``value``."""
        raise NotImplementedError


def replace_observation(msg: dict, fn: dist.Distribution) -> None:
    """Score the observation site ``msg`` with ``fn`` (its batch shape the site's)."""
    event_dim = msg["fn"].event_dim
    msg["fn"] = dist.Independent(fn, event_dim) if event_dim else fn


def _top_k_subsample(size: int, subsample_size: int, rng_key: jax.Array | None = None) -> jax.Array:
    if rng_key is None:
        raise ValueError(
            "Missing random key to generate subsample indices: run the model under "
            "numpyro.handlers.seed (SVI does this); HMC/NUTS do not support subsampling"
        )
    # The positions of the subsample_size largest of size iid uniforms: a uniformly random
    # subset in random order, as NumPyro's Fisher-Yates shuffle gives.
    # float32 draws whatever the default precision: half the sort width; ties are harmless
    uniforms = jax.random.uniform(rng_key, (size,), jnp.float32)
    return jax.lax.top_k(uniforms, subsample_size)[1].astype(jnp.arange(0).dtype)


class fast_subsample(Messenger):
    """Draw ``numpyro.plate(..., subsample_size=B)`` indices as the ``lax.top_k`` of uniforms.

    On CPU NumPyro shuffles with a sequential loop of ``B`` steps (a ``lax.scan`` of
    Fisher-Yates swaps); the positions of the ``B`` largest of ``N`` uniforms are a subset with
    the same (uniform) distribution, in random order, found by one vectorized ``top_k``
    (``O(N log B)``). Subsamples that are already set (replayed from a
    guide, or substituted) are left alone.

    :param fn: the model or guide.
    """

    def process_message(self, msg: dict) -> None:
        """Swap NumPyro's subsample function of a plate message for the ``top_k`` one."""
        if msg["type"] == "plate" and msg["value"] is None and msg["fn"] is numpyro_subsample_fn:
            msg["fn"] = _top_k_subsample


class data_parallel(Messenger):
    """Data-parallel training: shard the points of the plate ``"data"`` across devices.

    The plate's indices (the minibatch drawn inside the step, or all points) get a sharding
    constraint over ``mesh`` (default: every device on one axis), so XLA's partitioner runs
    everything computed from them -- for a model that takes its inputs through the plate
    (``numpyro.subsample(X, event_dim=1)``, as :func:`numpyro_dgp.models.deep_gp_regression`
    does) the layer inputs, the per-point conditionals, the Monte Carlo draws and the
    likelihood -- on each device's share; a model that feeds the whole ``X`` to its layers
    outside the plate only gets its likelihood split. It replicates the small global parts
    (inducing values, kernel matrices, KL terms), and reduces the sums over points and their
    gradients across devices. The model is unchanged and so is the loss: JAX's partitionable
    random numbers give every point the same draw as on one device, so the sharded loss
    equals the single-device loss on the same minibatch up to the order of the reductions
    (checked by the package's tests). Wrap the model (and the guide, if it has the plate) before
    building ``SVI``; use with :func:`numpyro_dgp.fit` as usual::

        svi = SVI(data_parallel(model), guide, optimizer, DGPElbo())

    On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (set before JAX starts)
    gives two devices to test with; the speed-up is for several accelerators.

    :param fn: the model or guide.
    :param mesh: a ``jax.sharding.Mesh`` whose first axis the points are split over; default
        one axis over ``jax.devices()``.
    """

    def __init__(self, fn: Callable | None = None, mesh: Mesh | None = None) -> None:
        self.mesh = Mesh(np.asarray(jax.devices()), ("data",)) if mesh is None else mesh
        super().__init__(fn)

    def postprocess_message(self, msg: dict) -> None:
        """Constrain the plate's indices to be sharded over the mesh's first axis."""
        if msg["type"] == "plate" and msg["name"] == "data" and msg["value"] is not None:
            sharding = NamedSharding(self.mesh, PartitionSpec(self.mesh.axis_names[0]))
            msg["value"] = jax.lax.with_sharding_constraint(msg["value"], sharding)


class coherent_layers(Messenger):
    """Draw every layer's output jointly over its input points (full covariance).

    Function samples drawn this way are smooth curves; the default point-by-point draw is
    enough for the ELBO but looks like noise when plotted. Cost ``O(N^3)`` per layer.

    :param fn: the model.
    """

    def process_message(self, msg: dict) -> None:
        """Ask every layer message for a joint draw (``full_cov=True``)."""
        if msg["type"] == LAYER_MESSAGE:
            request_full_cov(msg)


class layer_inputs(PerRunMessenger):
    """Evaluate the named layers at given inputs instead of the previous layer's output.

    A DGP layer is a function of its own input; ``layer_inputs(model, {"h2": H})`` runs
    ``model`` with layer ``h2`` evaluated at ``H``, so the moments a handler such as the
    objectives and :func:`numpyro_dgp.predict` records for ``h2`` are those of ``f_2(H)``
    under the fitted ``q`` (the ``Var[f_2(0)]`` of Ustyuzhaninov et al. 2020). The rest of
    the run is unchanged: the layers before still draw their outputs (a guide that correlates
    layers conditions ``f_2``'s inducing values on them, so the law of total variance over runs
    gives ``f_2(H)``'s marginal), and the layers after see ``f_2(H)``.

    Enter it inside the handlers that should see the replaced input (wrap the model itself).

    :param fn: the model.
    :param inputs: ``{layer name: array}``; each array must broadcast to the shape of that
        layer's usual input (the number of points and the input width stay as they are).
    :raises ValueError: if ``inputs`` is not a non-empty dict; on exit, if the model ran no
        layer of a given name; during the run, if an input does not broadcast to its layer's
        input shape.
    """

    def __init__(
        self, fn: Callable | None = None, inputs: dict[str, ArrayLike] | None = None
    ) -> None:
        check_mapping(inputs, "inputs", "layer_inputs")
        assert inputs is not None  # refused above
        self.inputs = {name: jnp.asarray(value) for name, value in inputs.items()}
        super().__init__(fn)

    def _reset(self) -> None:
        self._seen: set[str] = set()

    def _problem_after_run(self) -> str | None:
        missing = sorted(set(self.inputs) - self._seen)
        if missing:
            return (
                f"layer_inputs: the model has no layer named {missing} (inputs were given for them)"
            )
        return None

    def process_message(self, msg: dict) -> None:
        """Replace the input of the named layers' messages."""
        if msg["type"] != LAYER_MESSAGE:
            return
        layer, X, _ = layer_call(msg)
        if layer.name not in self.inputs:
            return
        self._seen.add(layer.name)
        value = self.inputs[layer.name]
        try:
            value = jnp.broadcast_to(value.astype(X.dtype), X.shape)
        except ValueError:
            raise ValueError(
                f"layer_inputs: the input for layer {layer.name!r} has shape {value.shape}, which "
                f"does not broadcast to the layer's input shape {X.shape}"
            ) from None
        replace_layer_inputs(msg, value)


class _WeightedPoints(NamedTuple):
    """The :class:`~numpyro_dgp._protocol.LayerRule` of a :class:`quadrature` layer: its
    outputs become a weighted mixture at ``mixture = (points (S, P), log_weights (S,))``."""

    mixture: tuple
    what: str = "a quadrature layer"
    computes_layer: bool = False


class quadrature(Messenger):
    """Propagate ``S`` weighted branches through a DGP's inner layers: the AR2P rule of Meng &
    Zhang (2024) for any guide.

    Every inner layer's output becomes ``S`` branches ``mean + xi_s * std`` (per point; a
    branch keeps its own path through the later layers) with points ``xi (S, P)`` per layer
    and weights ``w (S,)`` -- learnable (``numpyro.param``s ``"quadrature.<layer>.points"``,
    bounded to (-5, 5), and ``"quadrature.logits"``) or fixed. The objective is
    ``sum_s w_s E[log p(y | branch s)]`` (:class:`numpyro_dgp.DGPElbo`) or
    ``log sum_s w_s p(y | branch s)`` (:class:`numpyro_dgp.PredictiveObjective`), and
    :func:`numpyro_dgp.predict` returns the weighted mixture. With one inner output and the
    points fixed at Gauss-Hermite nodes with their weights this is Gauss-Hermite quadrature
    of the expectation over that layer. It acts where the inducing values are marginalized
    (:class:`numpyro_dgp.DGPElbo`, :class:`numpyro_dgp.PredictiveObjective`,
    :func:`numpyro_dgp.predict`; the last layer is integrated by Gauss-Hermite as always, so
    its points are registered but unused); a plain run of the model (``Trace_ELBO``,
    ``Predictive``) does not branch.

    :param fn: the model.
    :param num_points: ``S``.
    :param points: initial points: ``{layer: (S, P)}``, one ``(S,)`` array for every layer
        (each output gets the same points), or ``None`` (standard-normal draws, a fixed key).
    :param weights: ``(S,)`` initial weights (default uniform).
    :param learnable: learn points and weights (else they stay fixed).
    :raises ValueError: if ``num_points`` is not a positive integer or ``weights`` are not
        ``num_points`` positive numbers.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        num_points: int = 32,
        points: dict[str, ArrayLike] | ArrayLike | None = None,
        weights: ArrayLike | None = None,
        learnable: bool = True,
    ) -> None:
        check_positive_int(num_points, "num_points", "quadrature")
        self.weights = check_weights(weights, num_points, "quadrature")
        self.num_points = num_points
        self.points = points
        self.learnable = bool(learnable)
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        """Tag every layer message with its points and weights (its
        :class:`~numpyro_dgp._protocol.LayerRule`)."""
        if msg["type"] != LAYER_MESSAGE:
            return
        layer = message_layer(msg)
        rule = get_tag(msg, LAYER_RULE)
        if rule is not None and rule.computes_layer:
            raise NotImplementedError(
                f"quadrature: layer {layer.name!r} is {rule.what}, which quadrature does not branch"
            )
        # registered on every run (SVI's initial run is a plain model run); the last layer's
        # points go unused: marginalize_inducing integrates that layer by Gauss-Hermite
        points = quadrature_points(
            f"quadrature.{layer.name}.points",
            check_points(self.points, layer.name, self.num_points, layer.out_dim, "quadrature"),
            self.learnable,
        )
        log_weights = quadrature_log_weights("quadrature.logits", self.weights, self.learnable)
        with_tag(msg, LAYER_RULE, _WeightedPoints((points, log_weights)))
