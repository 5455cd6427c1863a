"""The sign-flip toy of Ustyuzhaninov et al. (2020, Fig. 2): why layer-factorized guides collapse.

A "deep" model of ``L`` layers, each either ``x`` or ``-x``, fitted to ``y = x``. The composition
is ``f_L = c_L x`` with ``c_L = prod_l (1 - 2 s_l)``, where ``s_l = 1`` means that layer ``l``
flips the sign (``f_l = -f_{l-1}``). Only patterns with an even number of flips fit the data, so
the exact posterior puts equal mass on the ``2^(L-1)`` valid patterns (``+++``, ``+--``, ``-+-``,
``--+`` for ``L = 3``) and, for small noise, essentially none on the others: the layers are
dependent. Three variational families over sign patterns, fitted by minimizing the exact
``KL(q || p(s | y))``:

``"factorized"``
    ``q(s_1) q(s_2) ... q(s_L)``. Its best fit is a single valid pattern: ``KL = (L - 1) log 2``
    (``log 4`` for ``L = 3``).
``"chain"``
    ``q(s_1) prod_l q(s_l | s_{l-1})``, first order in the layer choices. For ``L = 3`` it can hold
    only two of the four valid patterns: ``KL = log 2``.
``"composition"``
    ``q(s_1) prod_l q(s_l | c_{l-1})``, each layer conditioned on the sign of the previous layer's
    output ``f_{l-1} = c_{l-1} x`` -- what the chain-structured DGP guide does when it conditions
    each layer on the previous layer's output. It represents the posterior exactly (``KL = 0``).

The model is an ordinary NumPyro program with enumerated discrete sites; :func:`exact_posterior`
and :func:`posterior_samples` use NumPyro's funsor-backed enumeration
(:mod:`numpyro.contrib.funsor`) to compute the exact posterior and to sample from it.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, NamedTuple, Sequence, cast

import funsor
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax.typing import ArrayLike
from numpyro.contrib.funsor import config_enumerate, enum, infer_discrete, plate_to_enum_plate
from numpyro.contrib.funsor import trace as enum_trace

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure

__all__ = [
    "SIGN_FAMILIES",
    "ExactPosterior",
    "SignFamilyFit",
    "exact_posterior",
    "fit_sign_family",
    "pattern_labels",
    "plot_sign_posteriors",
    "posterior_samples",
    "sign_flip_model",
    "sign_patterns",
    "summary_table",
]

#: Variational families over sign patterns (see the module docstring).
SIGN_FAMILIES = ("factorized", "chain", "composition")

# One plate (the data, dim -1); enumerated sites take dims -2, -3, ...
_MAX_PLATE_NESTING = 1
_FIRST_AVAILABLE_DIM = -_MAX_PLATE_NESTING - 1


def sign_flip_model(
    x: ArrayLike, y: ArrayLike | None = None, *, num_layers: int = 3, noise: float = 0.1
) -> jax.Array:
    """NumPyro model: ``num_layers`` layers, each ``f_l = +f_{l-1}`` or ``-f_{l-1}``, ``f_0 = x``.

    ``s_l ~ Bernoulli(0.5)`` (``1`` = layer ``l`` flips the sign) are global sites outside the data
    plate, marked ``infer={"enumerate": "parallel"}``. The data plate has ``dim=-1``, so use
    ``max_plate_nesting=1`` / ``first_available_dim=-2``: under parallel enumeration ``s_l`` arrives
    with shape ``(2,) + (1,) * l`` (its own dimension ``-(l + 1)``), and the running product of
    signs broadcasts over all enumerated dimensions without any indexing (no ``Vindex`` is needed
    because no parameter array is indexed by an enumerated value). ``f_L`` then has shape
    ``(2,) * L + (N,)`` under enumeration and ``(N,)`` otherwise.

    :param x: ``(N,)`` inputs.
    :param y: ``(N,)`` observations (``None`` samples them).
    :param num_layers: number of layers ``L``; the sites are ``"s1"`` .. ``"sL"``.
    :param noise: standard deviation of the Gaussian likelihood.
    :return: the composition ``f_L = (prod_l (1 - 2 s_l)) x``.
    """
    x = jnp.asarray(x)
    sign = jnp.ones(())
    for layer in range(1, num_layers + 1):
        s = numpyro.sample(f"s{layer}", dist.Bernoulli(probs=0.5), infer={"enumerate": "parallel"})
        sign = sign * (1.0 - 2.0 * s)
    f = sign * x
    with numpyro.plate("data", x.shape[-1], dim=-1):
        numpyro.sample("y", dist.Normal(f, noise), obs=y)
    return f


def sign_patterns(num_layers: int = 3) -> np.ndarray:
    """All ``2^L`` flip patterns, shape ``(2^L, L)``, ``s_1`` most significant (row-major order).

    :param num_layers: number of layers ``L``.
    :return: ``(2^L, L)`` ``int64`` patterns (``1`` = flip).
    """
    return np.array(list(itertools.product((0, 1), repeat=num_layers)), dtype=np.int64)


def pattern_labels(patterns: ArrayLike) -> list[str]:
    """Labels like ``"+-+"``: ``+`` for a layer ``x -> x``, ``-`` for a sign flip ``x -> -x``.

    :param patterns: ``(K, L)`` flip patterns (``1`` = flip).
    :return: ``K`` labels of ``L`` characters.
    """
    return ["".join("-" if s else "+" for s in row) for row in np.asarray(patterns)]


def _valid(patterns) -> np.ndarray:
    return np.asarray(patterns).sum(axis=-1) % 2 == 0


class ExactPosterior(NamedTuple):
    """Exact posterior over sign patterns.

    :ivar patterns: ``(2^L, L)`` flip patterns (``1`` = flip), row-major with ``s_1`` most
        significant.
    :ivar probabilities: ``(2^L,)`` ``p(s | y)``.
    :ivar log_evidence: ``log p(y)``.
    :ivar log_joint: ``(2^L,)`` ``log p(y, s)``.
    :ivar valid: ``(2^L,)`` booleans: whether a pattern has an even number of flips.
    """

    patterns: np.ndarray
    probabilities: np.ndarray
    log_evidence: float
    log_joint: np.ndarray
    valid: np.ndarray

    @property
    def log_probabilities(self) -> np.ndarray:
        """``log p(s | y)`` (finite even where ``probabilities`` underflows)."""
        return self.log_joint - self.log_evidence


def _log_joint_funsor(x, y, num_layers, noise):
    """``log p(y, s_1..s_L)`` as a funsor over the enumerated sites (the data plate summed out)."""
    model = enum(config_enumerate(sign_flip_model), first_available_dim=_FIRST_AVAILABLE_DIM)
    with plate_to_enum_plate():
        tr = enum_trace(model).get_trace(x, y, num_layers=num_layers, noise=noise)
    factors, plates = [], frozenset()
    for site in tr.values():
        if site["type"] != "sample":
            continue
        log_prob = site["fn"].log_prob(site["value"])
        factors.append(
            funsor.to_funsor(log_prob, output=funsor.Real, dim_to_name=site["infer"]["dim_to_name"])
        )
        plates |= frozenset(f.name for f in site["cond_indep_stack"] if f.dim is not None)
    return funsor.sum_product.sum_product(
        funsor.ops.logaddexp, funsor.ops.add, factors, eliminate=plates, plates=plates
    )


def exact_posterior(
    x: ArrayLike, y: ArrayLike, *, num_layers: int = 3, noise: float = 0.1
) -> ExactPosterior:
    """Exact posterior over the ``2^L`` sign patterns by funsor-backed parallel enumeration.

    The model is traced under ``enum(config_enumerate(sign_flip_model), first_available_dim=-2)``;
    the per-site log factors are contracted over the data plate only, leaving the joint
    ``log p(y, s)`` as a tensor over the enumerated dimensions, which is then normalized.

    :param x: ``(N,)`` inputs.
    :param y: ``(N,)`` observations.
    :param num_layers: number of layers ``L``.
    :param noise: likelihood standard deviation.
    :return: :class:`ExactPosterior`.
    """
    names = tuple(f"s{layer}" for layer in range(1, num_layers + 1))
    joint = _log_joint_funsor(x, y, num_layers, noise)
    if set(joint.inputs) != set(names):
        raise ValueError(
            f"unexpected free variables {sorted(joint.inputs)} in the joint log density"
        )
    # Bernoulli's enumeration support is (0, 1), so index == value along every dimension.
    log_joint = np.asarray(joint.align(names).data, dtype=np.float64).reshape(-1)
    log_evidence = float(np.logaddexp.reduce(log_joint))
    patterns = sign_patterns(num_layers)
    return ExactPosterior(
        patterns, np.exp(log_joint - log_evidence), log_evidence, log_joint, _valid(patterns)
    )


def posterior_samples(
    rng_key: jax.Array,
    x: ArrayLike,
    y: ArrayLike,
    num_samples: int,
    *,
    num_layers: int = 3,
    noise: float = 0.1,
) -> np.ndarray:
    """Sign patterns drawn from the exact posterior with ``infer_discrete(temperature=1)``.

    :param rng_key: PRNG key; split into one key per draw.
    :param x: ``(N,)`` inputs.
    :param y: ``(N,)`` observations.
    :param num_samples: number of draws (each a forward-filter backward-sample pass;
        vectorized with ``vmap``).
    :param num_layers: as in :func:`sign_flip_model`.
    :param noise: as in :func:`sign_flip_model`.
    :return: ``(num_samples, L)`` ``int64`` flip patterns (``1`` = flip).
    """
    names = [f"s{layer}" for layer in range(1, num_layers + 1)]
    model = config_enumerate(sign_flip_model)

    def one(key):
        sampler = infer_discrete(
            model, first_available_dim=_FIRST_AVAILABLE_DIM, temperature=1, rng_key=key
        )
        tr = numpyro.handlers.trace(sampler).get_trace(x, y, num_layers=num_layers, noise=noise)
        return jnp.stack([jnp.asarray(tr[name]["value"]).reshape(()) for name in names])

    keys = jax.random.split(rng_key, num_samples)
    return np.asarray(jax.jit(jax.vmap(one))(keys)).astype(np.int64)


class SignFamilyFit(NamedTuple):
    """A variational family over sign patterns, fitted by minimizing the exact KL.

    :ivar family: one of :data:`SIGN_FAMILIES`.
    :ivar patterns: ``(2^L, L)`` flip patterns, as in :class:`ExactPosterior`.
    :ivar probabilities: ``(2^L,)`` ``q(s)`` of the best restart.
    :ivar elbo: exactly enumerated ``sum_s q(s) [log p(y, s) - log q(s)]``.
    :ivar kl: ``KL(q || p(s | y)) = log p(y) - elbo``.
    :ivar invalid_mass: ``q`` mass on odd-flip (invalid) patterns.
    :ivar num_valid_patterns: number of valid patterns with ``q(s) > threshold``.
    :ivar logits: ``(L, 2)`` best logits; ``logits[l, k]`` is the flip logit of layer
        ``l + 1`` in context ``k`` (unused entries keep their initial values).
    :ivar restart_kls: ``(num_restarts,)`` final KL of every restart.
    """

    family: str
    patterns: np.ndarray
    probabilities: np.ndarray
    elbo: float
    kl: float
    invalid_mass: float
    num_valid_patterns: int
    logits: np.ndarray
    restart_kls: np.ndarray


def _check_sign_family(family: str) -> None:
    """Raise unless ``family`` is one of :data:`SIGN_FAMILIES`.

    :raises ValueError: otherwise.
    """
    if family not in SIGN_FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {SIGN_FAMILIES}")


def _contexts(family: str, patterns: np.ndarray) -> np.ndarray:
    """Which conditional each layer uses for each pattern, shape (2^L, L), values in {0, 1}."""
    _check_sign_family(family)
    ctx = np.zeros_like(patterns)
    if family == "chain":  # q(s_l | s_{l-1})
        ctx[:, 1:] = patterns[:, :-1]
    elif (
        family == "composition"
    ):  # q(s_l | c_{l-1}), c_{l-1} negative iff an odd number of flips so far
        ctx[:, 1:] = np.cumsum(patterns, axis=1)[:, :-1] % 2
    return ctx  # factorized: every layer its own single conditional


def _log_q(logits, patterns, contexts):
    """``log q(s)`` for every pattern: sum over layers of Bernoulli log-probabilities."""
    layer_logits = logits[jnp.arange(patterns.shape[1])[None, :], contexts]  # (2^L, L)
    return jnp.sum(
        jnp.where(
            patterns == 1, jax.nn.log_sigmoid(layer_logits), jax.nn.log_sigmoid(-layer_logits)
        ),
        -1,
    )


def _elbo(logits, log_joint, patterns, contexts):
    log_q = _log_q(logits, patterns, contexts)
    return jnp.sum(jnp.exp(log_q) * (log_joint - log_q))


def _check_exact_layers(patterns: np.ndarray, num_layers: int) -> None:
    """Raise unless the exact posterior's ``patterns`` are of ``num_layers`` layers.

    :raises ValueError: otherwise.
    """
    if patterns.shape[1] != num_layers:
        raise ValueError("`exact` was computed for a different number of layers")


def fit_sign_family(
    rng_key: jax.Array,
    family: str,
    x: ArrayLike,
    y: ArrayLike,
    *,
    num_layers: int = 3,
    noise: float = 0.1,
    num_steps: int = 1000,
    num_restarts: int = 8,
    learning_rate: float = 0.1,
    init_scale: float = 1.0,
    optimizer: optax.GradientTransformation | None = None,
    threshold: float = 1e-3,
    exact: ExactPosterior | None = None,
) -> SignFamilyFit:
    """Fit a family over sign patterns by maximizing the exactly enumerated ELBO.

    Each restart draws logits ``~ N(0, init_scale^2)`` and runs ``num_steps`` of optax Adam on
    ``-sum_s q(s) [log p(y, s) - log q(s)]`` (exact: a sum over all ``2^L`` patterns); the restart
    with the highest ELBO is returned.

    The default optimizer is ``optax.adam(learning_rate, b2=0.9)``. The short second-moment memory
    matters: with small noise the invalid patterns cost ``~ 2 sum x^2 / noise^2`` nats (about 1500
    for the default data), so the first gradients are huge; with the default ``b2=0.999`` Adam's
    second-moment estimate remembers them for thousands of steps and the logits barely move
    afterwards (1500 steps left the factorized KL at 1.61 instead of ``log 4``).

    :param rng_key: PRNG key of the initial logits.
    :param family: ``"factorized"``, ``"chain"`` or ``"composition"``.
    :param x: ``(N,)`` inputs.
    :param y: ``(N,)`` observations.
    :param num_layers: as in :func:`sign_flip_model`.
    :param noise: as in :func:`sign_flip_model`.
    :param num_steps: optimizer steps per restart.
    :param num_restarts: independent restarts (run in parallel with ``vmap``).
    :param learning_rate: Adam's step size (default optimizer only).
    :param init_scale: standard deviation of the initial logits.
    :param optimizer: replaces the default ``optax.adam(learning_rate, b2=0.9)``.
    :param threshold: a valid pattern counts as represented when ``q(s) > threshold``.
    :param exact: precomputed :func:`exact_posterior` for the same data (computed if omitted).
    :return: :class:`SignFamilyFit` of the best restart.
    """
    if exact is None:
        exact = exact_posterior(x, y, num_layers=num_layers, noise=noise)
    patterns = exact.patterns
    _check_exact_layers(patterns, num_layers)
    pat = jnp.asarray(patterns)
    ctx = jnp.asarray(_contexts(family, patterns))
    log_joint = jnp.asarray(exact.log_joint)
    if optimizer is None:
        optimizer = optax.adam(learning_rate, b2=0.9)
    loss = lambda logits: -_elbo(logits, log_joint, pat, ctx)  # noqa: E731

    def run(init):
        def step(carry, _):
            logits, state = carry
            grads = jax.grad(loss)(logits)
            updates, state = optimizer.update(grads, state, logits)
            return (optax.apply_updates(logits, updates), state), None

        (logits, _), _ = jax.lax.scan(step, (init, optimizer.init(init)), None, length=num_steps)
        return logits, -loss(logits)

    dtype = log_joint.dtype
    inits = init_scale * jax.random.normal(rng_key, (num_restarts, num_layers, 2), dtype=dtype)
    all_logits, elbos = jax.jit(jax.vmap(run))(inits)
    elbos = np.asarray(elbos)
    best = int(np.argmax(elbos))
    logits = all_logits[best]
    log_q = np.asarray(_log_q(logits, pat, ctx))
    q = np.exp(log_q)
    elbo = float(elbos[best])
    valid = exact.valid
    return SignFamilyFit(
        family=family,
        patterns=patterns,
        probabilities=q,
        elbo=elbo,
        kl=exact.log_evidence - elbo,
        invalid_mass=float(q[~valid].sum()),
        num_valid_patterns=int(np.sum(q[valid] > threshold)),
        logits=np.asarray(logits),
        restart_kls=exact.log_evidence - elbos,
    )


def summary_table(
    results: Sequence[SignFamilyFit], exact: ExactPosterior, *, markdown: bool = False
) -> list[dict] | str:
    """One row per family (and one for the exact posterior): KL, ELBO, invalid mass, q per pattern.

    :param results: fitted families.
    :param exact: the exact posterior for the same data.
    :param markdown: return a markdown table (string) instead of a list of dicts.
    :return: the rows as dicts (keys ``family``, ``kl``, ``elbo``, ``invalid_mass``,
        ``num_valid_patterns`` and one per pattern label), or a markdown table.
    """
    labels = pattern_labels(exact.patterns)
    rows = [
        dict(
            family="exact",
            kl=0.0,
            elbo=exact.log_evidence,
            invalid_mass=float(exact.probabilities[~exact.valid].sum()),
            num_valid_patterns=int(np.sum(exact.probabilities[exact.valid] > 1e-3)),
            **{lab: float(p) for lab, p in zip(labels, exact.probabilities)},
        )
    ]
    for r in results:
        rows.append(
            dict(
                family=r.family,
                kl=r.kl,
                elbo=r.elbo,
                invalid_mass=r.invalid_mass,
                num_valid_patterns=r.num_valid_patterns,
                **{lab: float(p) for lab, p in zip(labels, r.probabilities)},
            )
        )
    if not markdown:
        return rows
    cols = ["family", "kl", "elbo", "invalid_mass", "num_valid_patterns", *labels]
    fmt = lambda v: (  # noqa: E731
        v if isinstance(v, str) else (str(v) if isinstance(v, int) else f"{v:.4g}")
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(row[c]) for c in cols) + " |" for row in rows]
    return "\n".join(lines)


def plot_sign_posteriors(
    exact: ExactPosterior,
    fitted_results: Sequence[SignFamilyFit] = (),
    ax: matplotlib.axes.Axes | None = None,
) -> matplotlib.figure.Figure:
    """Grouped bar chart of the probability of every sign pattern: exact posterior and each family.

    :param exact: the exact posterior.
    :param fitted_results: fitted families, drawn next to the exact bars.
    :param ax: axes to draw on (a new figure if omitted).
    :return: the figure holding ``ax``.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 3.5))
    else:  # a Figure, unless the caller's axes sit on a SubFigure (then that is what is returned)
        fig = cast("matplotlib.figure.Figure", ax.figure)
    labels = pattern_labels(exact.patterns)
    series = [("exact", exact.probabilities)] + [
        (f"{r.family} (KL={r.kl:.3f})", r.probabilities) for r in fitted_results
    ]
    positions = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, (name, probs) in enumerate(series):
        ax.bar(positions + (i - (len(series) - 1) / 2) * width, probs, width, label=name)
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, family="monospace")
    for tick, ok in zip(ax.get_xticklabels(), exact.valid):
        tick.set_color("black" if ok else "gray")
    ax.set_xlabel("sign pattern (layer 1 .. L; gray = odd number of flips)")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
