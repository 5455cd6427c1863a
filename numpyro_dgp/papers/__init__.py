"""Reproductions of published experiments, kept apart from the library.

``import numpyro_dgp`` never loads this package; the library never imports it. Tutorials and
benchmarks import its modules explicitly:

* :mod:`numpyro_dgp.papers.compositional` -- the 1-D composed-GP experiments and the four
  variational families of Table 1 of Ustyuzhaninov et al. (2020);
* :mod:`numpyro_dgp.papers.signflip` -- their sign-flip toy (each layer ``x`` or ``-x``),
  solved exactly by enumeration;
* :mod:`numpyro_dgp.papers.diffgp` -- the DiffGP runs on the UCI splits (Hegde et al. 2019);
* :mod:`numpyro_dgp.papers.letters` -- the letters classification toy of Meng & Zhang (2024);
* :mod:`numpyro_dgp.papers.results` -- merging benchmark result files.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian process
  flows. AISTATS.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

__all__ = []
