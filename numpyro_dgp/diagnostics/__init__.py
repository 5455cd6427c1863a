"""How far is a variational answer from MCMC ground truth, layer by layer (ArviZ-backed).

Every inference result becomes an ArviZ ``DataTree`` with one layout: group ``posterior``
holds each layer's function values on a grid, ``<layer>`` with dims ``(chain, draw, grid,
<layer>_output)`` (layer ``l``'s grid inputs are layer ``l-1``'s values there), plus any
sampled hyperparameters; ``constant_data/grid_x`` holds the first layer's grid inputs;
``sample_stats/diverging`` the MCMC divergences where there are some.

* :func:`from_guide` -- a fitted guide: inducing values drawn from ``q``, each layer drawn
  jointly over the grid (coherent function samples).
* :func:`from_mcmc` -- a ``numpyro.infer.MCMC`` run: the ``"<layer>.grid"`` sites of
  :class:`numpyro_dgp.handlers.exact_layers`, or (sparse models: NUTS with
  :class:`~numpyro_dgp.handlers.latent_conditionals`, :class:`~numpyro_dgp.infer.SGHMC`) the
  layers re-run on the grid with each sampled ``u``.
* :func:`layer_metrics` -- per layer, output and grid point: variances, VI/MCMC variance
  ratio, Wasserstein-1 between the marginals, the KL between moment-matched Gaussians, and
  how much of the MCMC mass the VI central interval covers.
* :func:`mcmc_health` -- R-hat, bulk/tail ESS and divergences per layer, per-chain means, and
  the chains grouped into modes; warns (:class:`MultimodalityWarning`) when chains settled in
  different compositions instead of averaging them away.
* :func:`mode_evidence` -- the posterior mass of each mode the chains found (bridge sampling,
  Meng & Wong 1996; Gronau et al. 2017, between the mode's draws and a Gaussian fitted to
  them), and :func:`mode_mixture` -- the modes pooled with those weights: a ground truth
  across modes from chains that each stay in one.
* :func:`ground_truth` -- the definition of converged ground truth in one call: chains from
  dispersed starts, their modes weighed by mass, R-hat and ESS checked within every mode
  that holds more than a set share of it; the modes pooled by mass as the reference.
* :func:`compare` -- all of it for several variational results against one MCMC result:
  a tidy table, a summary, the health report and figures.

**References:**

* Meng, Wong (1996). Simulating ratios of normalizing constants via a simple identity: a
  theoretical exploration. Statistica Sinica.
* Gronau, Sarafoglou, Matzke, Ly, Boehm, Marsman, Leslie, Forster, Wagenmakers, Steingroever
  (2017). A tutorial on bridge sampling. Journal of Mathematical Psychology.
"""

from numpyro_dgp.diagnostics._compare import (
    Comparison,
    compare,
    layer_metrics,
    plot_layers,
    plot_marginals,
    wasserstein_1d,
)
from numpyro_dgp.diagnostics._modes import (
    GroundTruth,
    Health,
    ModeEvidence,
    MultimodalityWarning,
    ground_truth,
    mcmc_health,
    mode_evidence,
    mode_mixture,
)
from numpyro_dgp.diagnostics._trees import (
    from_guide,
    from_layer_samples,
    from_mcmc,
    layer_names,
    layer_samples,
)

__all__ = [
    "Comparison",
    "GroundTruth",
    "Health",
    "ModeEvidence",
    "MultimodalityWarning",
    "compare",
    "from_guide",
    "from_layer_samples",
    "from_mcmc",
    "ground_truth",
    "layer_metrics",
    "layer_names",
    "layer_samples",
    "mcmc_health",
    "mode_evidence",
    "mode_mixture",
    "plot_layers",
    "plot_marginals",
    "wasserstein_1d",
]
