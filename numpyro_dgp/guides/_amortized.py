"""``AutoAmortizedDGP``: encoder networks give each point's inducing values (AVDGP,
Meng & Zhang 2024).

**References:**

* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.typing import ArrayLike
from numpyro.distributions.util import vec_to_tril_matrix

from numpyro_dgp._protocol import INDUCING, LOCAL_KL, encoder_input_layer, with_tag
from numpyro_dgp._validation import check_choice, check_positive_int, check_positive_number
from numpyro_dgp.core import local_kl
from numpyro_dgp.guides._base import AutoFactorizedDGP, InducingSite, Placeholder, mlp
from numpyro_dgp.posteriors import (
    AMORTIZATION_RULES,
    AmortizedPosterior,
    check_points,
    check_weights,
    quadrature_log_weights,
    quadrature_points,
    unwrap_distribution,
)

#: The values of ``AutoAmortizedDGP(..., covariance=...)``.
COVARIANCES = ("diagonal", "full")


class AutoAmortizedDGP(AutoFactorizedDGP):
    """Amortized variational DGP (Meng & Zhang 2024): encoder networks map each layer's
    encoder input to the point's inducing values ``q(u_n) = N(g(p_n), h(p_n))``.

    For every layer built with ``gp_layer(..., inducing="amortized")``: a mean MLP
    ``g: D -> P M`` and a covariance MLP ``h`` (``"diagonal"``: ``P M`` softplus standard
    deviations, Meng & Zhang's choice for deep models; ``"full"``: a Cholesky factor per
    output), both ``stax`` MLPs with ``num_hidden`` hidden layers of width ``min(D, P M)`` (or
    ``hidden_width``) and LeakyReLU(0.2). We use 2 hidden layers, as the text of Meng & Zhang
    (2024) says (their released code has 1). Layers with global inducing points get
    :class:`AutoFactorizedDGP`'s Gaussian.

    Amortization rules of Meng & Zhang (2024), i.e. how the ``num_branches = S`` branches are
    propagated and what an inner layer's encoder sees:

    * ``"AR1"``: the encoder sees each branch's sample; one inducing set per branch;
      Monte Carlo branches (Meng & Zhang train it with ``S = 1``).
    * ``"AR2"``: the encoder sees the mean of the previous layer's branch means; one set
      shared by the branches; Monte Carlo branches, equal weights.
    * ``"AR2P"``: as AR2 with the weighted mean, and the branches drawn at learned quadrature
      points ``xi (S, P)`` per layer (bounded to (-5, 5)) with learned weights (softmax,
      uniform start) -- Meng & Zhang's main method; train it with :class:`numpyro_dgp.DGPElbo`,
      or with :class:`numpyro_dgp.PredictiveObjective` (``num_particles=1``) for AR2PP.

    Use with ``DGPElbo`` / ``PredictiveObjective`` and :func:`numpyro_dgp.predict` (which
    evaluate the encoders inside the model's run); ``Trace_ELBO`` is refused.

    :param model: a model with ``gp_layer(..., inducing="amortized")`` layers.
    :param rule: ``"AR1"``, ``"AR2"`` or ``"AR2P"``.
    :param num_branches: ``S``.
    :param covariance: ``"diagonal"`` or ``"full"``.
    :param hidden_width: encoder width (default ``min(D, P M)`` per layer).
    :param num_hidden: encoder hidden layers.
    :param init_scale: starting standard deviation of every ``q(u_n)``.
    :param points: AR2P starting points: ``{layer: (S, P)}`` or ``None`` (standard-normal
        draws, a fixed key).
    :param weights: AR2P starting weights ``(S,)`` (default uniform).
    :param learn_points: AR2P: learn the points and weights (else they stay at their start).
    :param kwargs: passed to :class:`~numpyro_dgp.guides.DGPGuide`: ``prefix`` (the
        parameter-name prefix) and ``inner_init`` (for the layers with global inducing points).
    :raises ValueError: for an unknown ``rule`` or ``covariance``, or invalid ``num_branches``,
        ``init_scale``, ``hidden_width`` or ``weights``.
    """

    def __init__(
        self,
        model: Callable,
        *,
        rule: str = "AR2P",
        num_branches: int = 32,
        covariance: str = "diagonal",
        hidden_width: int | None = None,
        num_hidden: int = 2,
        init_scale: float = 0.1,
        points: dict[str, ArrayLike] | None = None,
        weights: ArrayLike | None = None,
        learn_points: bool = True,
        **kwargs: Any,
    ) -> None:
        check_choice(rule, AMORTIZATION_RULES, "rule", "AutoAmortizedDGP")
        check_positive_int(num_branches, "num_branches", "AutoAmortizedDGP")
        check_choice(covariance, COVARIANCES, "covariance", "AutoAmortizedDGP")
        check_positive_number(init_scale, "init_scale", "AutoAmortizedDGP")
        check_positive_int(hidden_width, "hidden_width", "AutoAmortizedDGP", allow_none=True)
        self.rule, self.num_branches, self.covariance = rule, int(num_branches), covariance
        self.hidden_width, self.num_hidden = hidden_width, int(num_hidden)
        self.encoder_init_scale, self.initial_points = float(init_scale), points
        self.initial_weights = check_weights(weights, int(num_branches), "AutoAmortizedDGP")
        self.learn_points = bool(learn_points)
        super().__init__(model, **kwargs)

    encodes_inducing_sets = True

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        if not any(s.inducing == "amortized" for s in self.inducing_sites):
            raise ValueError(
                "AutoAmortizedDGP: the model has no gp_layer with inducing='amortized'; use "
                "AutoFactorizedDGP (or build the layers with inducing='amortized')"
            )

    def _encoder(self, site: InducingSite) -> Callable:
        """``p -> (loc (..., P, M), scale)`` with its parameters registered."""
        P, M, dtype = site.out_dim, site.num_inducing, site.dtype
        # the width D of the layer's encoder input, read off the site's tag
        in_dim = int(self.prototype_trace[site.name]["infer"][INDUCING].encoder_input.shape[-1])
        width = self.hidden_width or min(in_dim, P * M)
        base = f"{site.name}_{self.prefix}"
        full = self.covariance == "full"
        scale_out = P * M * (M + 1) // 2 if full else P * M
        mean_net = mlp(f"{base}.mean_net", in_dim, width, P * M, dtype, self.num_hidden)
        scale_net = mlp(f"{base}.scale_net", in_dim, width, scale_out, dtype, self.num_hidden)
        # softplus(raw + shift) starts at init_scale when the network's output is near 0
        shift = float(np.log(np.expm1(self.encoder_init_scale)))

        def encode(p):
            lead = p.shape[:-1]
            loc = mean_net(p).reshape(lead + (P, M))
            raw = scale_net(p)
            if not full:
                return loc, jax.nn.softplus(raw + shift).reshape(lead + (P, M)) + 1e-6
            tril = vec_to_tril_matrix(raw.reshape(lead + (P, M * (M + 1) // 2)))
            diag = jax.nn.softplus(jnp.diagonal(tril, axis1=-2, axis2=-1) + shift) + 1e-6
            return loc, jnp.tril(tril, -1) + diag[..., None] * jnp.eye(M, dtype=tril.dtype)

        return encode

    def _branches(self, site: InducingSite) -> tuple[jax.Array | None, jax.Array]:
        """``(points (S, P) or None, log_weights (S,))`` of this layer's branches."""
        S, dtype = self.num_branches, site.dtype
        if self.rule != "AR2P":
            return None, jnp.full((S,), -np.log(S), dtype)
        init = check_points(
            self.initial_points, site.layer, S, site.out_dim, "AutoAmortizedDGP", dtype
        )
        points = quadrature_points(f"{self.prefix}.{site.layer}.points", init, self.learn_points)
        log_weights = quadrature_log_weights(
            f"{self.prefix}.branch_logits", self.initial_weights, self.learn_points
        )
        return points, log_weights.astype(dtype)

    def _sample_site(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> jax.Array:
        """A global site's Gaussian, or the placeholder that carries an amortized layer's
        encoder."""
        if site.inducing != "amortized":
            return super()._sample_site(site, rng_key, args, kwargs)
        points, log_weights = self._branches(site)
        posterior = AmortizedPosterior(
            self._encoder(site), self.rule, self.num_branches, points, log_weights
        )
        # under the u site's own name, so NumPyro's ELBOs meet it (and refuse it) instead of
        # finding the model's u site uncovered; auxiliary: it is never a draw of u
        value_shape = self.prototype_trace[site.name]["value"].shape
        refusal = (
            f"AutoAmortizedDGP: q({site.name}) depends on the model's layer outputs (the "
            "encoder input), so the guide cannot be sampled on its own (NumPyro's "
            "Trace_ELBO, TraceMeanField_ELBO, Predictive); use numpyro_dgp.DGPElbo or "
            "numpyro_dgp.PredictiveObjective to train and numpyro_dgp.predict to predict: "
            "they evaluate the encoders inside the model's run"
        )
        placeholder = Placeholder(posterior, site.name, value_shape, 2, refusal)
        return numpyro.sample(site.name, placeholder, infer={"is_auxiliary": True})

    def median(self, params: dict) -> NoReturn:
        """Refused: the inducing values are functions of each point's encoder input.

        :raises NotImplementedError: always; use :func:`numpyro_dgp.predict`.
        """
        raise NotImplementedError(
            "AutoAmortizedDGP: the inducing values are a function of each point's encoder input, "
            "not global latents; use numpyro_dgp.predict"
        )

    def quantiles(self, params: dict, quantiles: ArrayLike) -> NoReturn:
        """Refused, as :meth:`median`.

        :raises NotImplementedError: always; use :func:`numpyro_dgp.predict`.
        """
        self.median(params)


class EncodedSets:
    """The inducing-marginalization engine's plug-in for layers with per-point inducing sets
    (an encoder posterior such as :class:`~numpyro_dgp.posteriors.AmortizedPosterior`: its
    ``encode``, ``mixture`` and ``sees_mixture_mean``), one per run of the model.

    :meth:`encoders` reads the encoders off a guide's trace; in a run, :meth:`encoder_input`
    gives an AR2 / AR2P encoder the weighted mean of the last mixture's component means,
    :meth:`record_input` keeps each layer's encoder input, :meth:`site` evaluates the encoder
    at the layer's ``u`` site (:attr:`local_q` keeps the layer's ``q(u_n | p_n)``) and
    :meth:`branched` records a mixture's weighted mean.

    :param posteriors: ``{u-site: posterior}`` of the run.
    """

    def __init__(self, posteriors: dict[str, Any]) -> None:
        self.posteriors = posteriors
        # u-site -> (loc, scale) of an encoder's q(u_n | p_n) at the model's p
        self.local_q: dict[str, tuple[jax.Array, jax.Array]] = {}
        # u-site -> the encoder input p of its layer
        self._encoder_inputs: dict[str, jax.Array] = {}
        # weighted mean of the last mixture's component means (AR2 / AR2P)
        self._mixture_mean: jax.Array | None = None

    @staticmethod
    def encoders(guide_trace: dict) -> dict[str, Any]:
        """``{u-site: encoder}`` from the placeholder sites of a guide that encodes per-point
        inducing sets (:class:`AutoAmortizedDGP`: the site's distribution carries a
        ``posterior`` with ``encode`` and a ``mixture``)."""
        return {
            site["fn"].site: site["fn"].posterior
            for site in guide_trace.values()
            if site["type"] == "sample"
            and hasattr(getattr(site["fn"], "posterior", None), "mixture")
        }

    def encoder_input(self, msg: dict) -> None:
        """An encoder-input message: after a mixture, an AR2 / AR2P encoder sees the weighted
        mean of its components."""
        post = self.posteriors.get(f"{encoder_input_layer(msg)}.u")
        if getattr(post, "sees_mixture_mean", False) and self._mixture_mean is not None:
            msg["value"] = self._mixture_mean

    def record_input(self, msg: dict) -> None:
        """Record the encoder input of a layer (its message's final value)."""
        self._encoder_inputs[f"{encoder_input_layer(msg)}.u"] = msg["value"]

    def site(self, msg: dict) -> None:
        """A sample site: if it is the ``u`` site of a layer with per-point inducing sets (it
        follows its encoder-input message; found by name: the guide's placeholder site of the
        same name replaces the site's infer tags), evaluate the guide's encoder at the model's
        encoder input and record ``q(u_n | p_n)`` and its per-point KL."""
        if msg["name"] not in self._encoder_inputs or msg["is_observed"]:
            return
        post = self.posteriors.get(msg["name"])
        if post is None or not hasattr(post, "encode"):
            shape = msg["fn"].shape()
            if msg["value"] is not None and jnp.shape(msg["value"]) != shape:
                # the guide's placeholder, replayed into an abstract first pass that knows no
                # posteriors yet (marginal_trace's probe): any value of the right shape serves
                msg["value"] = jnp.zeros(shape, jnp.result_type(msg["value"]))
            return  # no encoder for this layer: the sampled value is used
        loc, scale = post.encode(self._encoder_inputs[msg["name"]])
        base = unwrap_distribution(msg["fn"])
        prior_mean, prior_chol = base.loc, base.scale_tril[..., 0, :, :]
        batch = loc.shape[:-2]
        flat = lambda a, k: a.reshape((-1,) + a.shape[-k:])  # noqa: E731
        kl = local_kl(
            flat(loc - prior_mean, 2),
            flat(scale, scale.ndim - len(batch)),
            flat(jnp.broadcast_to(prior_chol, batch + prior_chol.shape[-2:]), 2),
        ).reshape(batch)
        self.local_q[msg["name"]] = (loc, scale)
        msg["value"] = loc  # never used as a draw: the layer marginalizes it
        with_tag(msg, LOCAL_KL, kl)

    def branched(self, log_weights: jax.Array, mean: jax.Array, shape: tuple) -> None:
        """Record the weighted mean of a mixture's component means ``mean``: the next layer's
        AR2 / AR2P encoder sees it."""
        weights = jax.nn.softmax(log_weights).astype(mean.dtype)
        self._mixture_mean = jnp.tensordot(weights, jnp.broadcast_to(mean, shape), axes=(0, 0))
