"""Toy regression problems, the standard UCI regression splits and a user's own table.

Three kinds of data are read:

* one-dimensional toy problems (:func:`step_function`, :func:`sine`, :func:`identity`) used
  to show what depth buys a Gaussian-process model,
* a user's own table (:func:`read_table`): a CSV file with a header row, or an ``.npz`` of
  named columns (the command line's ``fit`` and ``predict`` read their data with it), and
* regression data in the standard UCI split layout used across the Bayesian deep-learning
  literature (the 20 fixed 90/10 train/test splits of Hernández-Lobato & Adams 2015 for
  boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht, year): any folder
  holding ``data.txt``, ``index_features.txt``, ``index_target.txt`` and
  ``index_{train,test}_<i>.txt`` (:func:`load_uci`), found by path or by name under a data
  directory you give (``data_dir=`` or ``$NUMPYRO_DGP_DATA``).

All arrays are returned as ``float64`` NumPy arrays; pass them to
``jnp.asarray`` when a model needs them on the device.

**References:**

* Hernández-Lobato, Adams (2015). Probabilistic backpropagation for scalable learning of
  Bayesian neural networks. ICML.
* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, NamedTuple

import numpy as np

from numpyro_dgp.datasets._tables import Table, read_table

if TYPE_CHECKING:
    import jax

# NumPy only at import: the command line checks its data directory, data set, splits and tables
# with this module before it imports JAX (the toy problems import it when they run).

__all__ = [
    "Dataset",
    "UCISplit",
    "step_function",
    "sine",
    "identity",
    "TOY_PROBLEMS",
    "UCI_DATASETS",
    "UCI_ALIASES",
    "DATA_DIR_ENV_VAR",
    "resolve_uci_name",
    "default_data_dir",
    "num_uci_splits",
    "uci_split_indices",
    "load_uci",
    "random_uci_split",
    "parse_splits",
    "Table",
    "read_table",
]


class Dataset(NamedTuple):
    """A regression problem with a fixed train/test split.

    :ivar X_train: training inputs, shape ``(N, D)``.
    :ivar y_train: training targets, shape ``(N,)``.
    :ivar X_test: test inputs, shape ``(N*, D)``.
    :ivar y_test: test targets, shape ``(N*,)``.
    :ivar name: short name of the problem, e.g. ``"step"``.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    name: str


class UCISplit(NamedTuple):
    """One train/test split of a UCI data set, standardized with the *training* statistics.

    Both splits are transformed with the training split's mean and standard deviation, so
    ``X_train`` has column means 0 and standard deviations 1 (up to rounding) while
    ``X_test`` in general does not. Columns that are constant on the training split get a
    standard deviation of 1 instead of 0, so they become all-zero rather than NaN.

    Reporting in the original target units (as the published tables do):

    * test log-likelihood per point: ``ll_original = ll_standardized - log(y_std)``;
    * RMSE: ``rmse_original = rmse_standardized * y_std``;
    * predictive means: :meth:`unstandardize_y`; predictive standard deviations scale by
      ``y_std`` (variances by ``y_std ** 2``).

    :ivar X_train: standardized training inputs, shape ``(N, D)``.
    :ivar y_train: standardized training targets, shape ``(N,)``.
    :ivar X_test: test inputs standardized with the training statistics, shape ``(N*, D)``.
    :ivar y_test: test targets standardized with the training statistics, shape ``(N*,)``.
    :ivar x_mean: training-input column means, shape ``(D,)``.
    :ivar x_std: training-input column standard deviations (1 for constant columns),
        shape ``(D,)``.
    :ivar y_mean: training-target mean.
    :ivar y_std: training-target standard deviation (1 if the target is constant).
    :ivar name: canonical data set name, e.g. ``"bostonHousing"``.
    :ivar split: index of the split, ``0 <= split < num_uci_splits(name)`` (for
        :func:`random_uci_split`: the seed of the permutation).
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float
    name: str
    split: int

    def unstandardize_y(self, y: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
        """Map standardized targets (or predictive means) back to the original units.

        :param y: standardized values, any shape; NumPy or JAX array.
        :return: ``y * y_std + y_mean``, same shape and array type as ``y``.
        """
        return y * self.y_std + self.y_mean


# ----------------------------------------------------------------------------------------
# Toy 1-D problems
# ----------------------------------------------------------------------------------------


def _toy_problem(
    rng_key: jax.Array,
    fn: Callable[[np.ndarray], np.ndarray],
    name: str,
    num_train: int,
    num_test: int,
    noise_std: float,
) -> Dataset:
    import jax
    import jax.numpy as jnp

    from numpyro_dgp._validation import check_positive_int, check_positive_number

    check_positive_int(num_train, "num_train", name)
    check_positive_int(num_test, "num_test", name)
    check_positive_number(noise_std, "noise_std", name, allow_zero=True)
    # Seed a NumPy generator from the JAX key so the data are float64 and reproducible
    # whether or not jax_enable_x64 is set (jax.random would give float32 without it);
    # jax.random.bits accepts both raw uint32 keys (PRNGKey) and typed keys (key).
    try:
        seed = np.asarray(jax.random.bits(rng_key, (4,), jnp.uint32))
    except Exception as err:  # noqa: BLE001 - re-raised with a clearer message
        raise TypeError(
            f"rng_key must be a JAX PRNG key (jax.random.key or jax.random.PRNGKey), "
            f"got {type(rng_key).__name__}: {err}"
        ) from err
    rng = np.random.default_rng([int(s) for s in seed])
    x_train = rng.uniform(-1.0, 1.0, size=num_train)
    # Evenly spaced test inputs make predictive plots and test metrics easy to read.
    x_test = np.linspace(-1.0, 1.0, num_test)
    # Test targets carry the same noise as the training targets so that test
    # log-likelihoods measure calibration against the generating process.
    y_train = fn(x_train) + noise_std * rng.standard_normal(num_train)
    y_test = fn(x_test) + noise_std * rng.standard_normal(num_test)
    return Dataset(x_train[:, None], y_train, x_test[:, None], y_test, name)


def step_function(
    rng_key: jax.Array, num_train: int = 100, num_test: int = 200, noise_std: float = 0.01
) -> Dataset:
    """Noisy step function, the standard deep-GP demonstration problem.

    ``y = 1`` for ``x >= 0`` and ``y = -1`` otherwise, plus Gaussian noise. A stationary
    GP has to choose between a short lengthscale (wiggly everywhere) and a long one (smooth
    through the jump); a two-layer DGP warps the input and fits both regimes.

    :param rng_key: JAX PRNG key.
    :param num_train: number of training points, drawn uniformly on ``[-1, 1]``.
    :param num_test: number of test points, on an evenly spaced grid over ``[-1, 1]``.
    :param noise_std: standard deviation of the additive Gaussian noise (train and test).
    :return: :class:`Dataset` with ``X_train (num_train, 1)``, ``y_train (num_train,)``,
        ``X_test (num_test, 1)``, ``y_test (num_test,)``, all ``float64``; name ``"step"``.
    """
    return _toy_problem(
        rng_key, lambda x: np.where(x >= 0.0, 1.0, -1.0), "step", num_train, num_test, noise_std
    )


def sine(
    rng_key: jax.Array, num_train: int = 100, num_test: int = 200, noise_std: float = 0.01
) -> Dataset:
    """Noisy ``y = sin(pi x)`` on ``[-1, 1]`` (the 3-layer sine fit of Ustyuzhaninov et al.
    (2020), App. E).

    :param rng_key: JAX PRNG key.
    :param num_train: number of training points, drawn uniformly on ``[-1, 1]``.
    :param num_test: number of test points, on an evenly spaced grid over ``[-1, 1]``.
    :param noise_std: standard deviation of the additive Gaussian noise (train and test).
    :return: :class:`Dataset` with ``X_train (num_train, 1)``, ``y_train (num_train,)``,
        ``X_test (num_test, 1)``, ``y_test (num_test,)``, all ``float64``; name ``"sine"``.
    """
    return _toy_problem(
        rng_key, lambda x: np.sin(np.pi * x), "sine", num_train, num_test, noise_std
    )


def identity(
    rng_key: jax.Array, num_train: int = 100, num_test: int = 200, noise_std: float = 0.01
) -> Dataset:
    """Noisy ``y = x`` on ``[-1, 1]``; a sanity check that depth does not hurt simple fits.

    :param rng_key: JAX PRNG key.
    :param num_train: number of training points, drawn uniformly on ``[-1, 1]``.
    :param num_test: number of test points, on an evenly spaced grid over ``[-1, 1]``.
    :param noise_std: standard deviation of the additive Gaussian noise (train and test).
    :return: :class:`Dataset` with ``X_train (num_train, 1)``, ``y_train (num_train,)``,
        ``X_test (num_test, 1)``, ``y_test (num_test,)``, all ``float64``; name
        ``"identity"``.
    """
    return _toy_problem(rng_key, np.copy, "identity", num_train, num_test, noise_std)


#: Toy problems by name; each is called as ``fn(rng_key, num_train=..., num_test=...,
#: noise_std=...)``.
TOY_PROBLEMS: dict[str, Callable[..., Dataset]] = {
    "step": step_function,
    "sine": sine,
    "identity": identity,
}


# ----------------------------------------------------------------------------------------
# UCI regression data
# ----------------------------------------------------------------------------------------

#: Canonical names, equal to the folder names under the data directory.
UCI_DATASETS: tuple[str, ...] = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "power-plant",
    "wine-quality-red",
    "yacht",
)

#: Accepted short names (matched case-insensitively) -> canonical names.
UCI_ALIASES: dict[str, str] = {
    "boston": "bostonHousing",
    "boston-housing": "bostonHousing",
    "housing": "bostonHousing",
    "power": "power-plant",
    "powerplant": "power-plant",
    "ccpp": "power-plant",
    "wine": "wine-quality-red",
    "wine-red": "wine-quality-red",
    "winered": "wine-quality-red",
    "red-wine": "wine-quality-red",
}

#: Environment variable consulted by :func:`default_data_dir`.
DATA_DIR_ENV_VAR = "NUMPYRO_DGP_DATA"

#: The files of the standard split layout that every data set folder must hold.
_LAYOUT_FILES = ("data.txt", "index_features.txt", "index_target.txt")


def resolve_uci_name(name: str) -> str:
    """Map a known data set name or alias to its folder name; other names pass unchanged.

    Matching is case-insensitive, so ``"Boston"``, ``"bostonhousing"`` and
    ``"bostonHousing"`` all give ``"bostonHousing"``. A name that is neither a known set nor
    an alias (e.g. ``"protein"``) is returned as given: it is looked up as a folder name.

    :param name: a name from :data:`UCI_DATASETS`, an alias from :data:`UCI_ALIASES`, or the
        name of any folder in the standard layout.
    :return: the folder name.
    :raises ValueError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    key = name.strip().lower()
    canonical = {known.lower(): known for known in UCI_DATASETS} | UCI_ALIASES
    return canonical.get(key, name.strip())


def default_data_dir(data_dir: os.PathLike | str | None = None) -> Path:
    """The folder that holds the data sets: ``data_dir``, else ``$NUMPYRO_DGP_DATA``.

    There is no built-in default: the data live wherever you keep them. An explicit argument
    or a set environment variable that points nowhere is an error rather than being skipped,
    so a typo never silently loads other data.

    :param data_dir: explicit data directory, or ``None`` to read the environment variable.
    :return: absolute path of the data directory.
    :raises FileNotFoundError: the directory does not exist, or neither is given.
    """
    env_value = os.environ.get(DATA_DIR_ENV_VAR, "")
    if data_dir is None and not env_value:
        raise FileNotFoundError(
            "no data directory given: pass data_dir= (--data-dir on the command line), set the "
            f"{DATA_DIR_ENV_VAR} environment variable, or pass the path of a data set folder"
        )
    path = Path(env_value if data_dir is None else data_dir).expanduser()
    if not path.is_dir():
        env = f"{DATA_DIR_ENV_VAR}={env_value!r}"
        given = env if data_dir is None else f"data_dir={str(path)!r}"
        raise FileNotFoundError(f"{given} is not an existing directory")
    return path.resolve()


def _dataset_dir(name: str | os.PathLike, data_dir: os.PathLike | str | None) -> tuple[str, Path]:
    """``(name, folder)`` of a data set given by path, or by name under the data directory.

    :raises FileNotFoundError: no such folder, or one without the files of the split layout.
    """
    if isinstance(name, os.PathLike) or (
        isinstance(name, str) and (os.sep in name or name.startswith("~"))
    ):
        folder = Path(name).expanduser().resolve()
        canonical = folder.name
        if not folder.is_dir():
            raise FileNotFoundError(f"data set folder {str(folder)!r} does not exist")
    else:
        canonical = resolve_uci_name(name)
        base = default_data_dir(data_dir)
        folder = base / canonical
        if not folder.is_dir():
            available = sorted(
                p.name for p in base.iterdir() if all((p / f).is_file() for f in _LAYOUT_FILES)
            )
            raise FileNotFoundError(
                f"data set folder for name={canonical!r} not found: {folder} does not exist "
                f"(data sets in {str(base)!r}: {', '.join(available) or 'none'})"
            )
    missing = [f for f in _LAYOUT_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{str(folder)!r} is not a folder in the standard split layout: it lacks "
            f"{missing} (expected data.txt, index_features.txt, index_target.txt, "
            "index_train_<i>.txt, index_test_<i>.txt)"
        )
    return canonical, folder


def num_uci_splits(name: os.PathLike | str, data_dir: os.PathLike | str | None = None) -> int:
    """Number of train/test splits of a data set (20 for the standard sets).

    :param name: data set name or alias under the data directory, or a folder path.
    :param data_dir: data directory; see :func:`default_data_dir`.
    :return: number of splits, read from ``n_splits.txt`` where the folder has one, else the
        number of ``index_train_<i>.txt`` files.
    :raises ValueError: an ``n_splits.txt`` that does not hold a positive integer.
    :raises FileNotFoundError: no such data set, or no split files.
    """
    _, folder = _dataset_dir(name, data_dir)
    path = folder / "n_splits.txt"
    if path.is_file():
        value = _read_numbers(path, "split count", 1)[0]
        if not (np.isfinite(value) and value >= 1 and value == int(value)):
            raise ValueError(f"split count file {path} must hold a positive integer, got {value}")
        return int(value)
    count = len(list(folder.glob("index_train_*.txt")))
    if count == 0:
        raise FileNotFoundError(f"{folder} holds no index_train_<i>.txt split files")
    return count


def _read_numbers(path: Path, kind: str, ndmin: Literal[1, 2]) -> np.ndarray:
    """The numbers of the text file ``path`` (``kind``: "index" or "data" in messages); a
    missing file (NumPy's FileNotFoundError), one that does not parse as numbers or holds none
    is refused."""
    try:
        numbers = np.loadtxt(path, dtype=np.float64, ndmin=ndmin)
    except ValueError as err:
        raise ValueError(f"{kind} file {path} could not be parsed as numbers: {err}") from err
    if numbers.size == 0:
        raise ValueError(f"{kind} file {path} is empty")
    return numbers


def _read_indices(path: Path, upper: int | None = None) -> np.ndarray:
    """The 0-based ``int64`` indices of a whitespace-separated index file (``3.0`` read as 3),
    checked to be whole, non-negative and below ``upper`` (where given).

    :raises ValueError: otherwise.
    """
    raw = _read_numbers(path, "index", 1).reshape(-1)
    if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
        raise ValueError(f"index file {path} holds non-integer indices")
    idx = raw.astype(np.int64)
    if np.any(idx < 0):
        raise ValueError(f"index file {path} holds negative indices (they must be 0-based)")
    if upper is not None and np.any(idx >= upper):
        raise ValueError(
            f"index file {path} holds index {int(idx.max())} but only {upper} are valid"
        )
    return idx


def _features_and_target(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of the data set in ``folder``, by its feature and target indices.

    :raises ValueError: rows with NaN or inf, or a target that is not one column apart from
        the features.
    """
    data = _read_numbers(folder / "data.txt", "data", 2)
    bad_rows = np.flatnonzero(~np.all(np.isfinite(data), axis=1))
    if bad_rows.size:
        shown = ", ".join(str(int(r)) for r in bad_rows[:5])
        more = "" if bad_rows.size <= 5 else f" and {bad_rows.size - 5} more"
        raise ValueError(
            f"data file {folder / 'data.txt'} has {bad_rows.size} row(s) with NaN/inf values "
            f"(0-based rows {shown}{more})"
        )
    features = _read_indices(folder / "index_features.txt", data.shape[1])
    target = _read_indices(folder / "index_target.txt", data.shape[1])
    if target.size != 1:
        raise ValueError(
            f"index file {folder / 'index_target.txt'} must hold exactly one column, "
            f"got {target.size}"
        )
    if target[0] in features:
        raise ValueError(
            f"target column {int(target[0])} is also listed in {folder / 'index_features.txt'}"
        )
    return data[:, features], data[:, target[0]]


def _split_indices(
    canonical: str, folder: Path, split: int, upper: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(train_idx, test_idx)`` of a split the data set in ``folder`` has, each index below
    ``upper`` where given.

    :raises ValueError: ``split`` is not an integer or out of range, malformed index files, or
        a row in both parts.
    """
    n_splits = num_uci_splits(folder)
    whole = not isinstance(split, bool) and isinstance(split, (int, np.integer))
    if not whole or not 0 <= split < n_splits:
        raise ValueError(
            f"split={split!r} is out of range for {canonical!r}: valid splits are the integers "
            f"0..{n_splits - 1}"
        )
    train_idx, test_idx = (
        _read_indices(folder / f"index_{part}_{split}.txt", upper) for part in ("train", "test")
    )
    overlap = np.intersect1d(train_idx, test_idx)
    if overlap.size:
        raise ValueError(
            f"split={split} of {canonical!r}: {overlap.size} row(s) appear in both "
            f"index_train_{split}.txt and index_test_{split}.txt"
        )
    return train_idx, test_idx


def uci_split_indices(
    name: os.PathLike | str, split: int = 0, data_dir: os.PathLike | str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of one train/test split, as stored in ``index_{train,test}_K.txt``.

    :param name: data set name or alias under the data directory, or a folder path.
    :param split: split index, ``0 <= split < num_uci_splits(name)``.
    :param data_dir: data directory; see :func:`default_data_dir`.
    :return: ``(train_idx (N,), test_idx (N*,))`` 0-based ``int64`` row indices into
        ``data.txt``.
    :raises ValueError: ``split`` out of range, malformed index files, or a row in both parts.
    """
    return _split_indices(*_dataset_dir(name, data_dir), split)


def load_uci(
    name: os.PathLike | str, split: int = 0, data_dir: os.PathLike | str | None = None
) -> UCISplit:
    """Load one standardized train/test split of a UCI regression data set.

    Inputs and target are standardized with the training split's mean and standard deviation
    (population std, ``ddof=0``); see :class:`UCISplit` for converting metrics back to the
    original units.

    :param name: data set name under the data directory (any folder name; the standard sets
        also by the aliases of :data:`UCI_ALIASES`), or the path of a folder in the standard
        split layout (a :class:`~pathlib.Path`, or a string containing a path separator).
    :param split: split index, ``0 <= split < num_uci_splits(name)``.
    :param data_dir: data directory; see :func:`default_data_dir`.
    :return: :class:`UCISplit` with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (N*, D)``,
        ``y_test (N*,)``, ``x_mean (D,)``, ``x_std (D,)`` and float ``y_mean``, ``y_std``.
    :raises ValueError: ``split`` out of range, malformed or NaN-holding files,
        overlapping train/test indices.
    :raises FileNotFoundError: missing data directory or files.
    """
    canonical, folder = _dataset_dir(name, data_dir)
    X, y = _features_and_target(folder)
    train_idx, test_idx = _split_indices(canonical, folder, split, X.shape[0])
    return _standardized_split(X, y, train_idx, test_idx, canonical, int(split))


def random_uci_split(
    name: os.PathLike | str,
    seed: int,
    train_fraction: float = 0.8,
    test_fraction: float = 0.1,
    data_dir: os.PathLike | str | None = None,
    part: str = "test",
) -> UCISplit:
    """A random train/test split of a UCI set (the protocol of Meng & Zhang (2024): 8:1:1
    train, test and validation), standardized like :func:`load_uci`.

    The rows are permuted with ``seed``; the first ``train_fraction`` are the training rows,
    the next ``test_fraction`` the test rows and the rest the validation rows.

    :param name: data set name under the data directory, or a folder path (as for
        :func:`load_uci`).
    :param seed: NumPy seed of the permutation (``UCISplit.split`` records it).
    :param train_fraction: share of rows for training.
    :param test_fraction: share of rows for testing (the rest is the validation part).
    :param data_dir: data directory; see :func:`default_data_dir`.
    :param part: ``"test"``, or ``"validation"`` to get the validation rows in ``X_test`` /
        ``y_test`` instead (same training rows and statistics), e.g. for early stopping.
    :return: :class:`UCISplit` (as from :func:`load_uci`, with ``split`` set to ``seed``).
    :raises ValueError: fractions out of range, an empty held-out part or an unknown ``part``.
    """
    # the tolerance lets 0.8 + 0.2 (1.0000000000000002 in floating point) through
    if not (0 < train_fraction < 1 and 0 < test_fraction <= 1 - train_fraction + 1e-12):
        raise ValueError(
            "random_uci_split: need 0 < train_fraction < 1 and 0 < test_fraction <= "
            f"1 - train_fraction, got {train_fraction}, {test_fraction}"
        )
    if part not in ("test", "validation"):
        raise ValueError(
            f"random_uci_split: part must be one of ('test', 'validation'), got {part!r}"
        )
    canonical, folder = _dataset_dir(name, data_dir)
    X, y = _features_and_target(folder)
    num_rows = X.shape[0]
    perm = np.random.default_rng(int(seed)).permutation(num_rows)
    num_train = int(round(train_fraction * num_rows))
    num_test = min(int(round(test_fraction * num_rows)), num_rows - num_train)
    train_idx, test_idx, validation_idx = np.split(perm, [num_train, num_train + num_test])
    held_out_idx = test_idx if part == "test" else validation_idx
    if held_out_idx.size == 0:
        raise ValueError(
            f"random_uci_split: the {part} part is empty (train_fraction={train_fraction}, "
            f"test_fraction={test_fraction}, {num_rows} rows)"
        )
    return _standardized_split(X, y, train_idx, held_out_idx, canonical, int(seed))


def _standardized_split(X, y, train_idx, test_idx, canonical, split):
    X_train, X_test = X[train_idx], X[test_idx]
    y_train, y_test = y[train_idx], y[test_idx]

    x_mean, x_std = X_train.mean(axis=0), X_train.std(axis=0)
    y_mean, y_std = y_train.mean(axis=0), y_train.std(axis=0)
    # A constant training column would divide by zero; scaling by 1 maps it to zeros.
    x_std, y_std = np.where(x_std > 0.0, x_std, 1.0), np.where(y_std > 0.0, y_std, 1.0)

    return UCISplit(
        X_train=(X_train - x_mean) / x_std,
        y_train=(y_train - y_mean) / y_std,
        X_test=(X_test - x_mean) / x_std,
        y_test=(y_test - y_mean) / y_std,
        x_mean=x_mean,
        x_std=x_std,
        y_mean=float(y_mean),
        y_std=float(y_std),
        name=canonical,
        split=split,
    )


def parse_splits(text: str) -> list[int]:
    """Split indices from a command-line string: ``"0-4"`` -> ``[0, 1, 2, 3, 4]``;
    ``"0,3,7"`` -> ``[0, 3, 7]``; ranges and lists combine (``"0-2,7"``).

    :param text: comma-separated non-negative indices and inclusive ranges ``a-b`` (``a <= b``).
    :return: the indices in the order given (not sorted, not deduplicated).
    :raises ValueError: no indices, or a part that is not a non-negative integer or an
        increasing range (e.g. ``-1``, ``3-1``, ``a``), named in the message.
    """
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        bounds = part.split("-")
        if not part:
            continue
        if not (1 <= len(bounds) <= 2 and all(b.strip().isdigit() for b in bounds)):
            raise ValueError(
                f"{part!r} is not a split index or a range: use non-negative integers and "
                f"inclusive ranges a-b, e.g. '0-4' or '0,3,7' (got {text!r})"
            )
        a, b = int(bounds[0]), int(bounds[-1])
        if b < a:
            raise ValueError(
                f"the range {part!r} is empty: write it low-high, e.g. '{b}-{a}' (got {text!r})"
            )
        out.extend(range(a, b + 1))
    if not out:
        raise ValueError(f"no split indices in {text!r}: use e.g. '0-4' or '0,3,7'")
    return out
