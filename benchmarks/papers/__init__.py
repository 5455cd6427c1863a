"""Reproductions of published experiments: the drivers behind benchmark scripts and tutorials.

They live beside the benchmarks, outside the installed package: ``numpyro_dgp`` never imports
them, and they use it like any other program (a few of its private helpers included, so they
follow the checkout they sit in). The benchmark scripts, run as ``python benchmarks/<script>.py``
from the repository root, import them as ``papers.<module>`` (``benchmarks/`` is the script's
folder, so it is on ``sys.path``); the tests (``tests/papers/``) and the tutorials that use them
put ``benchmarks/`` on ``sys.path`` first.

* ``papers.compositional`` -- the 1-D composed-GP experiments and the four variational
  families of Table 1 of Ustyuzhaninov et al. (2020) (``benchmarks/compositional.py``,
  ``benchmarks/mcmc_ground_truth.py``, tutorials 02 and 03);
* ``papers.signflip`` -- their sign-flip toy (each layer ``x`` or ``-x``), solved exactly by
  enumeration (tutorial 03);
* ``papers.diffgp`` -- the DiffGP runs on the UCI splits (Hegde et al. 2019;
  ``benchmarks/sde_flow.py``);
* ``papers.letters`` -- the letters classification toy of Meng & Zhang (2024)
  (``benchmarks/amortized.py``, tutorial 04);
* ``papers.results`` -- merging benchmark result files written by separate processes
  (``benchmarks/amortized.py``, ``nested.py``, ``sde_flow.py``).

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian process
  flows. AISTATS.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

__all__: list[str] = []
