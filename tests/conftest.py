import os
import sys
from pathlib import Path

# A persistent XLA compilation cache for the run (this process, and the notebook kernels of
# test_tutorials, which inherit the environment): many tests build the same model at the same
# shapes, and every eager operation compiles a small program per shape (about 14,000 in a run
# before the core's hot functions were jitted; counted at 2501bb5).
# Set before jax is imported; an existing setting wins. The directory lives in the checkout
# (git-ignored), so a clean clone starts cold. The pytest-xdist workers and the notebook kernels
# share it, so one worker's compilation serves the other. JAX writes entries without a lock; an
# entry read while another process writes it fails to load, and JAX then warns and compiles again.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".jax_cache" / "main"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# Most of the suite's time is XLA compiling small programs that then run for milliseconds:
# skip XLA's expensive optimization passes (the same operations, less fusion; rounding can
# differ in the last digits). The quickstart notebook in smoke mode: 101 -> 67 s (another job
# shared the cores in both runs). Benchmarks and users keep XLA's defaults.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Every Python process of the run (the xdist workers, notebook kernels, the command line and
# fresh-process tests, about 40) imports JAX and NumPyro. Where the environment sets
# PYTHONDONTWRITEBYTECODE and the install skipped byte-compiling (the README's `pip install
# --no-compile`), each of them compiled those modules from source again: 5.5 s per import
# against 1.7 s from bytecode here, and 58 s against 33 s for the fresh-process tests of
# test_public_api and test_cli_data. The run writes bytecode, so the first import compiles
# what later ones read.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# The test suite runs in float64 (dense references to 1e-8).
jax.config.update("jax_enable_x64", True)
os.environ.setdefault("NUMPYRO_DGP_SMOKE", "1")


# Linux caps a process at vm.max_map_count memory maps (65,530 by default). XLA's CPU backend
# maps each compiled program's code in pieces (hundreds for a DGP's training step) and keeps it
# while JAX's in-memory caches hold the program, so a worker that runs a few hundred
# model-building tests (the --runslow tier: about 400 maps a test) runs out, and every later
# compilation fails with "Failed to materialize symbols". Past 40,000 maps, drop those caches;
# the persistent cache on disk still serves a later test that needs the same program.
_MAPS = Path("/proc/self/maps")


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    yield
    if _MAPS.exists() and _MAPS.read_bytes().count(b"\n") > 40_000:
        jax.clear_caches()


# Property-based tests (hypothesis) are deterministic here: the same examples on every run and
# machine (derandomize, no example database), no per-example deadline (the first example of a
# shape compiles), and few examples per test (each one runs JAX programs). A test may ask for
# more or fewer with its own @settings; HYPOTHESIS_PROFILE=thorough draws many more.
settings.register_profile("numpyro_dgp", derandomize=True, database=None, deadline=None, max_examples=15,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", settings.get_profile("numpyro_dgp"), derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "numpyro_dgp"))


#: The standard UCI splits beside the repository (tests pass this path explicitly; the package
#: itself has no default data directory). ``$NUMPYRO_DGP_DATA`` points elsewhere if set.
UCI_DATA_DIR = Path(os.environ.get("NUMPYRO_DGP_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data" / "uci")


@pytest.fixture(scope="session")
def uci_data_dir() -> Path:
    """The UCI data directory; the test is skipped, with the reason, when it is absent."""
    if not UCI_DATA_DIR.is_dir():
        pytest.skip(f"UCI data not available at {UCI_DATA_DIR} (set NUMPYRO_DGP_DATA to run this test)")
    return UCI_DATA_DIR


#: the dependency versions the suite last passed with (the README's test command installs them)
CONSTRAINTS = Path(__file__).resolve().parent / "constraints.txt"


def pytest_report_header(config):
    """The versions the suite runs against, and those that differ from ``constraints.txt``."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = {}
    for line in CONSTRAINTS.read_text().splitlines():
        name, _, pin = line.split("#")[0].strip().partition("==")
        if pin:
            pinned[name] = pin
    installed = {}
    for name in pinned:
        try:
            installed[name] = version(name)
        except PackageNotFoundError:
            installed[name] = None
    shown = ", ".join(f"{n} {installed[n]}" for n in ("jax", "jaxlib", "numpyro", "numpy", "arviz")
                      if n in installed)
    other = [f"{n} {installed[n]} (tested {pinned[n]})" for n in pinned
             if installed[n] is not None and installed[n] != pinned[n]]
    return [f"numpyro-dgp dependencies: {shown}",
            "versions other than tests/constraints.txt: " + (", ".join(other) if other else "none")]


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--seed-offset", type=int, default=0, metavar="K",
                     help="perturb every random seed the tests use by K (0: the seeds as written); "
                          "tests/flake_check.py reruns the stochastic tests over several K")


def _perturb_seeds(offset: int) -> None:
    """Derive every seed the tests (and the code they call) use from (seed, ``offset``).

    A stochastic test passes at its written seed by construction; whether its tolerance is honest
    shows only at other seeds. Rather than editing each test, the seed constructors are replaced
    for the whole run: ``jax.random.PRNGKey(s)`` and ``jax.random.key(s)`` return
    ``fold_in(original(s), offset)`` (same type, shape and dtype), and integer seeds given to
    ``numpy.random.default_rng``, ``numpy.random.RandomState`` and ``numpy.random.seed`` become the
    pair ``[seed, offset]``. Patching at configure time, before the test modules are imported,
    also reaches module-level keys, fixtures of every scope, and ``numpyro.handlers.seed(rng_seed=s)``
    (which calls ``jax.random.PRNGKey``). With ``offset == 0`` nothing is patched.
    """
    import numbers

    import numpy as np

    orig_prng_key, orig_key = jax.random.PRNGKey, jax.random.key

    def prng_key(seed, *args, **kwargs):
        return jax.random.fold_in(orig_prng_key(seed, *args, **kwargs), offset)

    def key(seed, *args, **kwargs):
        return jax.random.fold_in(orig_key(seed, *args, **kwargs), offset)

    def np_seed(seed):
        return [int(seed), offset] if isinstance(seed, numbers.Integral) else seed

    orig_default_rng, orig_np_seed, OrigRandomState = np.random.default_rng, np.random.seed, np.random.RandomState

    class RandomState(OrigRandomState):  # a subclass, so isinstance checks still hold
        def __init__(self, seed=None):
            super().__init__(np_seed(seed))

    jax.random.PRNGKey, jax.random.key = prng_key, key
    np.random.default_rng = lambda seed=None: orig_default_rng(np_seed(seed))
    np.random.seed = lambda seed=None: orig_np_seed(np_seed(seed))
    np.random.RandomState = RandomState


def pytest_configure(config):
    offset = config.getoption("--seed-offset")
    if offset:
        _perturb_seeds(offset)


# The tutorial notebooks are the longest tests (1.5-4 min each against seconds for the rest):
# run them first, longest first, then the other tests of 25-40 s (mypy, the docs build, fresh
# processes), so pytest-xdist's workers do not end on one long test while the other waits.
_NOTEBOOKS_LONGEST_FIRST = ["04_amortized", "07_likelihoods_and_latents", "03_mcmc_ground_truth", "08_vecchia_ground_truth", "05_sde_flow", "06_nested_compression", "02_swapping_guides"]
_LONG_TESTS = ["tests/test_structure.py::test_mypy_finds_nothing_in_the_package",
               "tests/test_docs.py::test_docs_build_without_warnings_and_document_every_public_name",
               "tests/test_cli_data.py::test_fit_then_predict_in_fresh_processes",
               "tests/test_recipes.py::test_demo_runs_and_the_dgp_beats_the_svgp"]


def _run_order(item):
    if item.nodeid in _LONG_TESTS:
        return len(_NOTEBOOKS_LONGEST_FIRST) + 1 + _LONG_TESTS.index(item.nodeid)
    if not item.nodeid.startswith("tests/test_tutorials.py"):
        return len(_NOTEBOOKS_LONGEST_FIRST) + 1 + len(_LONG_TESTS)
    return next((i for i, name in enumerate(_NOTEBOOKS_LONGEST_FIRST) if name in item.nodeid),
                len(_NOTEBOOKS_LONGEST_FIRST))


#: node ids of the default suite's slowest cases, run only with --runslow (see the file's header)
SLOW_CASES = Path(__file__).resolve().parent / "slow_cases.txt"


def _slow_case_ids() -> set[str]:
    lines = (line.split("  # ")[0].strip() for line in SLOW_CASES.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def _mark_slow_cases(config, items) -> None:
    """Mark the cases listed in ``slow_cases.txt`` slow; on a whole-suite run (no paths given),
    a listed id that names no collected test is an error, so a renamed test cannot silently
    move back into the default suite."""
    listed = _slow_case_ids()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword \
            and not config.option.markexpr:
        stale = sorted(listed - {item.nodeid for item in items})
        if stale:
            raise pytest.UsageError(f"tests/slow_cases.txt lists ids that name no test: {stale}")


def pytest_collection_modifyitems(config, items):
    items.sort(key=_run_order)  # stable: everything else keeps its order
    _mark_slow_cases(config, items)
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
