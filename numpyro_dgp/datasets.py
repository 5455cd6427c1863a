"""Toy regression problems and the standard UCI regression splits.

Two kinds of data are provided:

* one-dimensional toy problems (:func:`step_function`, :func:`sine`, :func:`identity`) used
  to show what depth buys a Gaussian-process model, and
* regression data in the standard UCI split layout used across the Bayesian deep-learning
  literature (the 20 fixed 90/10 train/test splits of Hernández-Lobato & Adams 2015 for
  boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht, year): any folder
  holding ``data.txt``, ``index_features.txt``, ``index_target.txt`` and
  ``index_{train,test}_<i>.txt`` (:func:`load_uci`), found by path or by name under a data
  directory you give (``data_dir=`` or ``$NUMPYRO_DGP_DATA``).

All arrays are returned as NumPy arrays (``float64`` unless asked otherwise); pass them to
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
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from numpyro_dgp._persist import uci_files as _uci_files
from numpyro_dgp._persist.tables import Table, read_table
from numpyro_dgp._persist.uci_files import (
    check_split,
    dataset_dir,
    default_data_dir,
    num_uci_splits,
    parse_splits,
    read_features_and_target,
    read_indices,
    resolve_uci_name,
    standardize_stats,
)
from numpyro_dgp._validation import check_choice

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


# ----------------------------------------------------------------------------------------
# Containers
# ----------------------------------------------------------------------------------------


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


def _check_rng_key(rng_key: jax.Array) -> np.ndarray:
    """Four ``uint32`` words drawn with ``rng_key`` (the seed of a NumPy generator).

    :raises TypeError: ``rng_key`` is not a JAX PRNG key.
    """
    # jax.random.bits accepts both raw uint32 keys (PRNGKey) and typed keys (key).
    try:
        return np.asarray(jax.random.bits(rng_key, (4,), jnp.uint32))
    except Exception as err:  # noqa: BLE001 - re-raised with a clearer message
        raise TypeError(
            f"rng_key must be a JAX PRNG key (jax.random.key or jax.random.PRNGKey), "
            f"got {type(rng_key).__name__}: {err}"
        ) from err


def _numpy_rng(rng_key: jax.Array) -> np.random.Generator:
    # Seed a NumPy generator from the JAX key so the data are float64 and reproducible
    # whether or not jax_enable_x64 is set (jax.random would give float32 without it).
    seed = _check_rng_key(rng_key)
    return np.random.default_rng([int(s) for s in seed])


def _check_toy_args(num_train: int, num_test: int, noise_std: float) -> None:
    """Raise unless the sizes are positive integers and ``noise_std`` a finite number >= 0.

    :raises ValueError: otherwise.
    """
    for arg_name, value in (("num_train", num_train), ("num_test", num_test)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{arg_name} must be a positive integer, got {value!r}")
    try:
        noise_ok = bool(np.isfinite(noise_std)) and noise_std >= 0
    except TypeError:
        noise_ok = False
    if not noise_ok:
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")


def _toy_problem(
    rng_key: jax.Array,
    fn: Callable[[np.ndarray], np.ndarray],
    name: str,
    num_train: int,
    num_test: int,
    noise_std: float,
) -> Dataset:
    _check_toy_args(num_train, num_test, noise_std)
    rng = _numpy_rng(rng_key)
    x_train = rng.uniform(-1.0, 1.0, size=num_train)
    # Evenly spaced test inputs make predictive plots and test metrics easy to read.
    x_test = np.linspace(-1.0, 1.0, num_test)
    # Test targets carry the same noise as the training targets so that test
    # log-likelihoods measure calibration against the generating process.
    y_train = fn(x_train) + noise_std * rng.standard_normal(num_train)
    y_test = fn(x_test) + noise_std * rng.standard_normal(num_test)
    return Dataset(
        X_train=x_train[:, None].astype(np.float64),
        y_train=y_train.astype(np.float64),
        X_test=x_test[:, None].astype(np.float64),
        y_test=y_test.astype(np.float64),
        name=name,
    )


def _step(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0.0, 1.0, -1.0)


def _sine(x: np.ndarray) -> np.ndarray:
    return np.sin(np.pi * x)


def _identity(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).copy()


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
    return _toy_problem(rng_key, _step, "step", num_train, num_test, noise_std)


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
    return _toy_problem(rng_key, _sine, "sine", num_train, num_test, noise_std)


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
    return _toy_problem(rng_key, _identity, "identity", num_train, num_test, noise_std)


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
UCI_DATASETS: tuple[str, ...] = _uci_files.UCI_DATASETS

#: Accepted short names (matched case-insensitively) -> canonical names.
UCI_ALIASES: dict[str, str] = _uci_files.UCI_ALIASES

#: Environment variable consulted by :func:`default_data_dir`.
DATA_DIR_ENV_VAR = _uci_files.DATA_DIR_ENV_VAR


def uci_split_indices(
    name: os.PathLike | str, split: int = 0, data_dir: os.PathLike | str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of one train/test split, as stored in ``index_{train,test}_K.txt``.

    :param name: data set name or alias under the data directory, or a folder path.
    :param split: split index, ``0 <= split < num_uci_splits(name)``.
    :param data_dir: data directory; see :func:`default_data_dir`.
    :return: ``(train_idx (N,), test_idx (N*,))`` 0-based ``int64`` row indices into
        ``data.txt``.
    """
    canonical, folder = dataset_dir(name, data_dir)
    split = check_split(split, num_uci_splits(folder), canonical)
    train_idx = read_indices(folder / f"index_train_{split}.txt")
    test_idx = read_indices(folder / f"index_test_{split}.txt")
    return train_idx, test_idx


def _check_float_dtype(dtype: DTypeLike) -> np.dtype:
    """``dtype`` as a NumPy dtype, checked to be a floating one.

    :raises ValueError: otherwise.
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    return dtype


def _check_disjoint(
    train_idx: np.ndarray, test_idx: np.ndarray, split: int, canonical: str
) -> None:
    """Raise if a row is in both the training and the test indices of ``split``.

    :raises ValueError: naming how many rows are.
    """
    overlap = np.intersect1d(train_idx, test_idx)
    if overlap.size:
        raise ValueError(
            f"split={split} of {canonical!r}: {overlap.size} row(s) appear in both "
            f"index_train_{split}.txt and index_test_{split}.txt"
        )


def load_uci(
    name: os.PathLike | str,
    split: int = 0,
    data_dir: os.PathLike | str | None = None,
    dtype: DTypeLike = np.float64,
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
    :param dtype: floating dtype of the returned arrays (statistics are computed in float64).
    :return: :class:`UCISplit` with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (N*, D)``,
        ``y_test (N*,)``, ``x_mean (D,)``, ``x_std (D,)`` and float ``y_mean``, ``y_std``.
    :raises ValueError: ``split`` out of range, malformed or NaN-holding files,
        overlapping train/test indices.
    :raises FileNotFoundError: missing data directory or files.
    """
    dtype = _check_float_dtype(dtype)
    canonical, folder = dataset_dir(name, data_dir)
    split = check_split(split, num_uci_splits(folder), canonical)
    X, y, num_rows = read_features_and_target(folder)

    train_idx = read_indices(folder / f"index_train_{split}.txt", upper=num_rows)
    test_idx = read_indices(folder / f"index_test_{split}.txt", upper=num_rows)
    _check_disjoint(train_idx, test_idx, split, canonical)
    return _standardized_split(X, y, train_idx, test_idx, dtype, canonical, split)


def random_uci_split(
    name: os.PathLike | str,
    seed: int,
    train_fraction: float = 0.8,
    test_fraction: float = 0.1,
    data_dir: os.PathLike | str | None = None,
    dtype: DTypeLike = np.float64,
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
    :param dtype: floating dtype of the returned arrays (statistics are computed in float64).
    :param part: ``"test"``, or ``"validation"`` to get the validation rows in ``X_test`` /
        ``y_test`` instead (same training rows and statistics), e.g. for early stopping.
    :return: :class:`UCISplit` (as from :func:`load_uci`, with ``split`` set to ``seed``).
    :raises ValueError: fractions out of range, an empty held-out part, an unknown ``part``
        or a non-floating ``dtype``.
    """
    dtype = _check_random_split_args(dtype, train_fraction, test_fraction, part)
    canonical, folder = dataset_dir(name, data_dir)
    X, y, num_rows = read_features_and_target(folder)
    perm = np.random.default_rng(int(seed)).permutation(num_rows)
    num_train = int(round(train_fraction * num_rows))
    num_test = min(int(round(test_fraction * num_rows)), num_rows - num_train)
    train_idx = perm[:num_train]
    held_out_idx = (
        perm[num_train : num_train + num_test] if part == "test" else perm[num_train + num_test :]
    )
    _check_held_out(held_out_idx, part, train_fraction, test_fraction, num_rows)
    return _standardized_split(X, y, train_idx, held_out_idx, dtype, canonical, int(seed))


def _check_random_split_args(
    dtype: DTypeLike, train_fraction: float, test_fraction: float, part: str
) -> np.dtype:
    """``dtype`` as a floating NumPy dtype, with the fractions and ``part`` checked.

    :raises ValueError: a non-floating dtype, fractions out of range or an unknown ``part``.
    """
    dtype = _check_float_dtype(dtype)
    # the tolerance lets 0.8 + 0.2 (1.0000000000000002 in floating point) through
    if not (0 < train_fraction < 1 and 0 < test_fraction <= 1 - train_fraction + 1e-12):
        raise ValueError(
            "random_uci_split: need 0 < train_fraction < 1 and 0 < test_fraction <= "
            f"1 - train_fraction, got {train_fraction}, {test_fraction}"
        )
    check_choice(part, ("test", "validation"), "part", "random_uci_split")
    return dtype


def _check_held_out(
    held_out_idx: np.ndarray, part: str, train_fraction: float, test_fraction: float, num_rows: int
) -> None:
    """Raise if the held-out ``part`` of a random split has no rows.

    :raises ValueError: otherwise.
    """
    if held_out_idx.size == 0:
        raise ValueError(
            f"random_uci_split: the {part} part is empty (train_fraction={train_fraction}, "
            f"test_fraction={test_fraction}, {num_rows} rows)"
        )


def _standardized_split(X, y, train_idx, test_idx, dtype, canonical, split):
    X_train, X_test = X[train_idx], X[test_idx]
    y_train, y_test = y[train_idx], y[test_idx]

    x_mean, x_std = standardize_stats(X_train)
    y_mean, y_std = standardize_stats(y_train)

    return UCISplit(
        X_train=((X_train - x_mean) / x_std).astype(dtype),
        y_train=((y_train - y_mean) / y_std).astype(dtype),
        X_test=((X_test - x_mean) / x_std).astype(dtype),
        y_test=((y_test - y_mean) / y_std).astype(dtype),
        x_mean=x_mean.astype(dtype),
        x_std=x_std.astype(dtype),
        y_mean=float(y_mean),
        y_std=float(y_std),
        name=canonical,
        split=split,
    )


# the table reader lives in _tables, the folder lookup and parse_splits in _uci_files (the command
# line checks its arguments and the data directory without importing JAX); documented and pickled
# as part of this module
for _obj in (Table, read_table, parse_splits, resolve_uci_name, default_data_dir, num_uci_splits):
    _obj.__module__ = __name__
del _obj
