"""Tests for numpyro_dgp.datasets: toy problems, UCI loading, standardization, data lookup."""

import os
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # idempotent

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from numpyro_dgp import datasets  # noqa: E402
from numpyro_dgp.datasets import (  # noqa: E402
    TOY_PROBLEMS,
    UCI_ALIASES,
    UCI_DATASETS,
    Dataset,
    UCISplit,
    default_data_dir,
    identity,
    load_uci,
    num_uci_splits,
    resolve_uci_name,
    sine,
    step_function,
    uci_split_indices,
)

# (N, D) from shared/data/uci/README.md
UCI_SHAPES = {
    "bostonHousing": (506, 13),
    "concrete": (1030, 8),
    "energy": (768, 8),
    "kin8nm": (8192, 8),
    "power-plant": (9568, 4),
    "wine-quality-red": (1599, 11),
    "yacht": (308, 6),
}


@pytest.fixture(scope="module")
def uci_dir(uci_data_dir):
    return uci_data_dir


# ---------------------------------------------------------------------------------------
# Toy problems
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TOY_PROBLEMS))
def test_toy_shapes_dtypes_and_ranges(name):
    data = TOY_PROBLEMS[name](jax.random.PRNGKey(0), num_train=37, num_test=11)
    assert isinstance(data, Dataset)
    assert data.name == name
    assert data.X_train.shape == (37, 1) and data.y_train.shape == (37,)
    assert data.X_test.shape == (11, 1) and data.y_test.shape == (11,)
    for arr in data[:4]:
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float64
    assert np.all(np.abs(data.X_train) <= 1.0)
    np.testing.assert_allclose(data.X_test[:, 0], np.linspace(-1.0, 1.0, 11))


@pytest.mark.parametrize("name", sorted(TOY_PROBLEMS))
def test_toy_is_deterministic_in_the_key(name):
    fn = TOY_PROBLEMS[name]
    a = fn(jax.random.PRNGKey(3))
    b = fn(jax.random.PRNGKey(3))
    c = fn(jax.random.PRNGKey(4))
    for x, y in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.X_train, c.X_train)
    # New-style typed keys work too and match the raw key with the same seed.
    d = fn(jax.random.key(3))
    np.testing.assert_array_equal(a.X_train, d.X_train)


def test_step_function_targets():
    data = step_function(jax.random.PRNGKey(1), num_train=500, num_test=101, noise_std=0.01)
    for X, y in ((data.X_train, data.y_train), (data.X_test, data.y_test)):
        expected = np.where(X[:, 0] >= 0.0, 1.0, -1.0)
        assert np.max(np.abs(y - expected)) < 0.1
        assert 0.0 < np.std(y - expected) < 0.02  # the noise is there, at the right scale
    # The grid includes x = 0 exactly (odd num_test), which belongs to the upper step.
    noiseless = step_function(jax.random.PRNGKey(1), num_test=101, noise_std=0.0)
    assert noiseless.y_test[50] == 1.0 and noiseless.X_test[50, 0] == 0.0
    assert set(np.unique(noiseless.y_train)) <= {-1.0, 1.0}


def test_sine_and_identity_targets_without_noise():
    s = sine(jax.random.PRNGKey(2), noise_std=0.0)
    np.testing.assert_allclose(s.y_train, np.sin(np.pi * s.X_train[:, 0]), atol=1e-12)
    np.testing.assert_allclose(s.y_test, np.sin(np.pi * s.X_test[:, 0]), atol=1e-12)
    i = identity(jax.random.PRNGKey(2), noise_std=0.0)
    np.testing.assert_array_equal(i.y_train, i.X_train[:, 0])
    np.testing.assert_array_equal(i.y_test, i.X_test[:, 0])


def test_toy_defaults():
    data = step_function(jax.random.PRNGKey(0))
    assert data.X_train.shape == (100, 1) and data.X_test.shape == (200, 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_train": 0}, "num_train"),
        ({"num_test": -1}, "num_test"),
        ({"num_train": 2.5}, "num_train"),
        ({"noise_std": -0.1}, "noise_std"),
        ({"noise_std": float("nan")}, "noise_std"),
    ],
)
def test_toy_argument_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sine(jax.random.PRNGKey(0), **kwargs)


def test_toy_rejects_non_key():
    with pytest.raises(TypeError, match="rng_key"):
        sine("not a key")


# ---------------------------------------------------------------------------------------
# Names and data directory lookup
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("boston", "bostonHousing"),
        ("Boston", "bostonHousing"),
        ("bostonhousing", "bostonHousing"),
        ("power", "power-plant"),
        ("wine", "wine-quality-red"),
        ("wine-red", "wine-quality-red"),
        ("yacht", "yacht"),
        ("KIN8NM", "kin8nm"),
    ],
)
def test_alias_resolution(alias, canonical):
    assert resolve_uci_name(alias) == canonical


def test_aliases_point_at_known_sets():
    assert set(UCI_ALIASES.values()) <= set(UCI_DATASETS)
    assert len(UCI_DATASETS) == 7


def test_unknown_names_are_folder_names(tmp_path):
    assert resolve_uci_name("protein") == "protein"
    assert resolve_uci_name(" naval ") == "naval"
    _write_fake(tmp_path, "yacht")
    with pytest.raises(FileNotFoundError, match=r"name='protein' not found.*data sets in .*: yacht"):
        load_uci("protein", data_dir=tmp_path)
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_uci_name("")


def test_any_folder_in_the_standard_layout_by_name_or_path(tmp_path):
    folder, data = _write_fake(tmp_path, "naval", n_splits=3)
    by_name = load_uci("naval", split=2, data_dir=tmp_path)
    assert by_name.name == "naval" and by_name.split == 2
    for ref in (folder, str(folder), str(folder) + os.sep):
        by_path = load_uci(ref, split=2)
        np.testing.assert_array_equal(by_path.X_train, by_name.X_train)
        assert by_path.name == "naval"
    assert num_uci_splits(folder) == 3
    (folder / "n_splits.txt").unlink()  # the split count then comes from the index files
    assert num_uci_splits(folder) == 3
    train, test = uci_split_indices(folder, 1)
    assert len(train) == 7 and len(test) == 3


def test_a_folder_outside_the_layout_is_refused(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "data.txt").write_text("1 2\n")
    with pytest.raises(FileNotFoundError, match=r"not a folder in the standard split layout.*index_features.txt"):
        load_uci(folder)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_uci(tmp_path / "absent")


def test_explicit_data_dir_wins_over_env(tmp_path, monkeypatch):
    env_dir = tmp_path / "env"
    arg_dir = tmp_path / "arg"
    env_dir.mkdir()
    arg_dir.mkdir()
    monkeypatch.setenv("NUMPYRO_DGP_DATA", str(env_dir))
    assert default_data_dir() == env_dir.resolve()
    assert default_data_dir(arg_dir) == arg_dir.resolve()
    assert default_data_dir(str(arg_dir)) == arg_dir.resolve()


def test_missing_explicit_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir=.*nowhere"):
        default_data_dir(tmp_path / "nowhere")


def test_env_var_pointing_nowhere_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMPYRO_DGP_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="NUMPYRO_DGP_DATA"):
        default_data_dir()


def test_no_default_data_dir(monkeypatch):
    monkeypatch.delenv("NUMPYRO_DGP_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as info:
        default_data_dir()
    msg = str(info.value)
    assert "--data-dir" in msg and "NUMPYRO_DGP_DATA" in msg
    with pytest.raises(FileNotFoundError, match="no data directory given"):
        load_uci("kin8nm")


# ---------------------------------------------------------------------------------------
# UCI loading on a small synthetic folder (always runs)
# ---------------------------------------------------------------------------------------


def _write_fake(root: Path, name="yacht", data=None, n_splits=2, float_indices=True):
    folder = root / name
    folder.mkdir(parents=True)
    if data is None:
        rng = np.random.default_rng(0)
        data = np.column_stack(
            [
                rng.normal(5.0, 3.0, 10),
                np.full(10, 7.0),  # constant column: std 0 must not give NaN
                rng.normal(-2.0, 0.5, 10),
                rng.normal(100.0, 10.0, 10),  # target
            ]
        )
    np.savetxt(folder / "data.txt", data, fmt="%.17g", delimiter="\t")
    fmt = "%.1f" if float_indices else "%d"
    np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt=fmt)
    np.savetxt(folder / "index_target.txt", [3], fmt=fmt)
    perm = np.random.default_rng(1).permutation(len(data))
    for k in range(n_splits):
        perm = np.roll(perm, 3)
        np.savetxt(folder / f"index_train_{k}.txt", perm[:7], fmt=fmt)
        np.savetxt(folder / f"index_test_{k}.txt", perm[7:], fmt=fmt)
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    return folder, data


def test_fake_split_standardizes_with_train_statistics(tmp_path):
    folder, data = _write_fake(tmp_path)
    s = load_uci("yacht", split=1, data_dir=tmp_path)
    assert isinstance(s, UCISplit) and s.name == "yacht" and s.split == 1
    train_idx = np.loadtxt(folder / "index_train_1.txt").astype(int)
    test_idx = np.loadtxt(folder / "index_test_1.txt").astype(int)
    X_tr, y_tr = data[train_idx][:, :3], data[train_idx, 3]
    X_te, y_te = data[test_idx][:, :3], data[test_idx, 3]

    np.testing.assert_allclose(s.x_mean, X_tr.mean(0))
    np.testing.assert_allclose(s.x_std, [X_tr[:, 0].std(), 1.0, X_tr[:, 2].std()])
    np.testing.assert_allclose(s.y_mean, y_tr.mean())
    np.testing.assert_allclose(s.y_std, y_tr.std())
    np.testing.assert_allclose(s.X_test, (X_te - s.x_mean) / s.x_std)
    np.testing.assert_allclose(s.y_test, (y_te - y_tr.mean()) / y_tr.std())
    assert np.all(np.isfinite(s.X_train)) and np.all(np.isfinite(s.X_test))
    np.testing.assert_array_equal(s.X_train[:, 1], 0.0)  # the constant column
    np.testing.assert_allclose(s.unstandardize_y(s.y_test), y_te)
    np.testing.assert_allclose(s.unstandardize_y(s.y_train), y_tr)
    assert isinstance(s.y_mean, float) and isinstance(s.y_std, float)


def test_fake_split_integer_indices_and_dtype(tmp_path):
    _write_fake(tmp_path, float_indices=False)
    s = load_uci("yacht", data_dir=tmp_path)
    assert s.X_train.dtype == np.float64 and s.y_test.dtype == np.float64
    assert s.X_train.shape == (7, 3) and s.X_test.shape == (3, 3)
    assert num_uci_splits("yacht", data_dir=tmp_path) == 2


@pytest.mark.parametrize("split", [2, -1, 100])
def test_split_out_of_range(tmp_path, split):
    _write_fake(tmp_path)
    with pytest.raises(ValueError, match=rf"split={split} is out of range.*0\.\.1"):
        load_uci("yacht", split=split, data_dir=tmp_path)


def test_nan_row_names_the_file(tmp_path):
    data = np.arange(40, dtype=float).reshape(10, 4)
    data[4, 2] = np.nan
    _write_fake(tmp_path, data=data)
    with pytest.raises(ValueError, match=r"data\.txt.*NaN.*rows 4"):
        load_uci("yacht", data_dir=tmp_path)


def test_overlapping_indices_are_rejected(tmp_path):
    folder, _ = _write_fake(tmp_path)
    np.savetxt(folder / "index_test_0.txt", [0, 1, 2], fmt="%d")
    np.savetxt(folder / "index_train_0.txt", [2, 3, 4, 5], fmt="%d")
    with pytest.raises(ValueError, match="both"):
        load_uci("yacht", data_dir=tmp_path)


def test_non_integer_index_is_rejected(tmp_path):
    folder, _ = _write_fake(tmp_path)
    (folder / "index_train_0.txt").write_text("0\n1.5\n2\n")
    with pytest.raises(ValueError, match=r"index_train_0\.txt.*non-integer"):
        load_uci("yacht", data_dir=tmp_path)


def test_index_out_of_bounds_is_rejected(tmp_path):
    folder, _ = _write_fake(tmp_path)
    (folder / "index_test_0.txt").write_text("0\n10\n")
    with pytest.raises(ValueError, match=r"index_test_0\.txt.*index 10"):
        load_uci("yacht", data_dir=tmp_path)


def test_missing_dataset_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="concrete"):
        load_uci("concrete", data_dir=tmp_path)


def test_missing_data_dir_in_load(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir="):
        load_uci("yacht", data_dir=tmp_path / "absent")


# ---------------------------------------------------------------------------------------
# The real UCI data (skipped when absent)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", UCI_DATASETS)
def test_uci_shapes_and_train_standardization(uci_dir, name):
    N, D = UCI_SHAPES[name]
    s = load_uci(name, split=0, data_dir=uci_dir)
    assert s.name == name and s.split == 0
    n_train, n_test = len(s.y_train), len(s.y_test)
    assert s.X_train.shape == (n_train, D) and s.X_test.shape == (n_test, D)
    assert s.x_mean.shape == (D,) and s.x_std.shape == (D,)
    assert n_train + n_test == N
    assert 0.85 * N < n_train < 0.95 * N  # the 90/10 protocol
    # Train split: exactly standardized (up to rounding).
    np.testing.assert_allclose(s.X_train.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(s.y_train.mean(), 0.0, atol=1e-10)
    np.testing.assert_allclose(s.y_train.std(), 1.0, rtol=1e-10)
    non_constant = s.X_train.std(0) > 0
    np.testing.assert_allclose(s.X_train.std(0)[non_constant], 1.0, rtol=1e-10)
    # Test split: transformed with train statistics, so it is not exactly standardized.
    assert np.max(np.abs(s.X_test.mean(0))) > 1e-6
    assert abs(s.y_test.mean()) > 1e-6
    assert np.all(np.isfinite(s.X_train)) and np.all(np.isfinite(s.X_test))


@pytest.mark.parametrize("name", UCI_DATASETS)
def test_uci_splits_are_disjoint_and_cover_the_rows(uci_dir, name):
    N, _ = UCI_SHAPES[name]
    n_splits = num_uci_splits(name, data_dir=uci_dir)
    assert n_splits == 20
    for k in range(n_splits):
        train_idx, test_idx = uci_split_indices(name, k, data_dir=uci_dir)
        assert np.intersect1d(train_idx, test_idx).size == 0
        assert len(np.unique(train_idx)) == len(train_idx)
        assert len(np.unique(test_idx)) == len(test_idx)
        np.testing.assert_array_equal(np.union1d(train_idx, test_idx), np.arange(N))


def test_uci_rows_follow_the_index_files(uci_dir):
    s = load_uci("boston", split=5, data_dir=uci_dir)
    train_idx, test_idx = uci_split_indices("bostonHousing", 5, data_dir=uci_dir)
    data = np.loadtxt(uci_dir / "bostonHousing" / "data.txt")
    np.testing.assert_allclose(s.X_train * s.x_std + s.x_mean, data[train_idx, :13])
    np.testing.assert_allclose(s.unstandardize_y(s.y_test), data[test_idx, 13])
    assert s.name == "bostonHousing"


def test_uci_different_splits_differ(uci_dir):
    a = load_uci("yacht", split=0, data_dir=uci_dir)
    b = load_uci("yacht", split=1, data_dir=uci_dir)
    assert a.y_mean != b.y_mean


def test_uci_bad_split_on_real_data(uci_dir):
    with pytest.raises(ValueError, match=r"split=20 is out of range.*0\.\.19"):
        load_uci("energy", split=20, data_dir=uci_dir)


def test_uci_found_through_env_var(uci_dir, monkeypatch):
    monkeypatch.setenv("NUMPYRO_DGP_DATA", str(uci_dir))
    # the folder itself, however it is reached (uci_dir may be, or lie under, a symbolic link)
    assert default_data_dir().samefile(uci_dir)
    assert load_uci("wine", split=3).X_train.shape[1] == 11


def test_data_folder_reached_through_a_symbolic_link(tmp_path, monkeypatch):
    """A data folder that is a link (users' often are) is found through the argument and
    through the environment variable, and its data sets load."""
    _write_fake(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    assert default_data_dir(link).samefile(tmp_path / "real")
    monkeypatch.setenv("NUMPYRO_DGP_DATA", str(link))
    assert default_data_dir().samefile(tmp_path / "real")
    assert load_uci("yacht", split=0).X_train.shape[1] == 3


def test_random_split_is_disjoint_sized_and_seeded(tmp_path):
    data = np.column_stack([np.arange(40.0), np.arange(40.0) ** 0.5, np.zeros(40), np.arange(40.0) * 2])
    _write_fake(tmp_path, data=data)
    s = datasets.random_uci_split("yacht", seed=3, data_dir=tmp_path)
    assert s.X_train.shape == (32, 3) and s.X_test.shape == (4, 3) and s.split == 3
    train_rows = np.round(s.unstandardize_y(s.y_train) / 2).astype(int)
    test_rows = np.round(s.unstandardize_y(s.y_test) / 2).astype(int)
    assert not set(train_rows) & set(test_rows)  # 4 validation rows are left out
    np.testing.assert_allclose(s.y_mean, data[train_rows, 3].mean())
    again = datasets.random_uci_split("yacht", seed=3, data_dir=tmp_path)
    np.testing.assert_array_equal(again.y_test, s.y_test)
    other = datasets.random_uci_split("yacht", seed=4, data_dir=tmp_path)
    assert not np.array_equal(other.y_test, s.y_test)
    with pytest.raises(ValueError, match="train_fraction"):
        datasets.random_uci_split("yacht", seed=0, train_fraction=0.95, test_fraction=0.1, data_dir=tmp_path)


def test_random_split_validation_part_is_the_rest_with_training_statistics(tmp_path):
    data = np.column_stack([np.arange(40.0), np.arange(40.0) ** 0.5, np.zeros(40), np.arange(40.0) * 2])
    _write_fake(tmp_path, data=data)
    s = datasets.random_uci_split("yacht", seed=3, data_dir=tmp_path)
    v = datasets.random_uci_split("yacht", seed=3, data_dir=tmp_path, part="validation")
    np.testing.assert_array_equal(v.X_train, s.X_train)
    assert (v.y_mean, v.y_std) == (s.y_mean, s.y_std)
    rows = lambda split, y: set(np.round(split.unstandardize_y(y) / 2).astype(int).tolist())  # noqa: E731
    train, test, valid = rows(s, s.y_train), rows(s, s.y_test), rows(v, v.y_test)
    assert len(valid) == 4 and not valid & train and not valid & test
    assert train | test | valid == set(range(40))
    # 0.8 + 0.2 is 1.0000000000000002 in floating point: still a valid (empty-validation) request
    whole = datasets.random_uci_split("yacht", seed=3, train_fraction=0.8, test_fraction=0.2, data_dir=tmp_path)
    assert whole.X_test.shape == (8, 3)
    with pytest.raises(ValueError, match="validation part is empty"):
        datasets.random_uci_split("yacht", seed=3, train_fraction=0.8, test_fraction=0.2, data_dir=tmp_path,
                                  part="validation")
    with pytest.raises(ValueError, match="part must be"):
        datasets.random_uci_split("yacht", seed=3, data_dir=tmp_path, part="valid")


def test_malformed_split_files_and_dtypes_are_refused(tmp_path):
    folder, _ = _write_fake(tmp_path)
    (folder / "n_splits.txt").write_text("2.5\n")
    with pytest.raises(ValueError, match="must hold a positive integer"):
        num_uci_splits(folder)
    (folder / "n_splits.txt").write_text("two\n")
    with pytest.raises(ValueError, match="could not be parsed as numbers"):
        num_uci_splits(folder)
    (folder / "n_splits.txt").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        num_uci_splits(folder)
    (folder / "n_splits.txt").unlink()
    for index_file in folder.glob("index_train_*.txt"):
        index_file.unlink()
    with pytest.raises(FileNotFoundError, match="holds no index_train"):
        num_uci_splits(folder)


def test_a_split_whose_train_and_test_rows_overlap_is_refused_by_both_readers(tmp_path):
    folder, _ = _write_fake(tmp_path, "yacht", n_splits=1)
    train = np.loadtxt(folder / "index_train_0.txt")
    np.savetxt(folder / "index_test_0.txt", train[:2], fmt="%.1f")
    for read in (lambda: uci_split_indices(folder, 0), lambda: load_uci(folder, split=0)):
        with pytest.raises(ValueError, match=r"split=0 of 'yacht': 2 row\(s\) appear in both"):
            read()
