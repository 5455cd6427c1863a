"""What several handlers share: per-run state, refusing special layers, finding the last layer,
scoring a Gaussian observation site with a density that does not factorize over points."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.handlers import block, seed, trace
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import LAYER_RULE, get_tag, message_layer, trace_layer_names
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import unwrap_distribution

__all__ = [
    "PerRunMessenger",
    "SpreadTotal",
    "check_layer_supported",
    "gaussian_observation",
    "replace_observation",
]


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
        """Run the model under the handler (finding its last layer first where it needs it)."""
        if self._needs_last_layer() and self._last_layer is None:
            self._last_layer = self._find_last_layer(args, kwargs)
        return super().__call__(*args, **kwargs)

    def _find_last_layer(self, args: tuple, kwargs: dict) -> str:
        """Name of the last ``gp_layer`` the model runs, found by an abstract run."""
        found = {}

        def probe():
            # block: the probe's messages reach none of the handlers outside this one
            with block():
                tr = trace(seed(self.fn, 0)).get_trace(*args, **kwargs)
            names = trace_layer_names(tr)
            if not names:
                raise ValueError(f"{type(self).__name__}: the model runs no gp_layer")
            found["last"] = names[-1]
            return 0

        jax.eval_shape(probe)
        return found["last"]

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
