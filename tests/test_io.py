"""Tests for numpyro_dgp.io: exact round trips, atomic writes and clear errors."""

import contextlib
import json
import os
import stat

import jax

jax.config.update("jax_enable_x64", True)  # idempotent; float64 leaves must survive

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from numpyro_dgp import io as dgp_io  # noqa: E402
from numpyro_dgp.io import FORMAT_VERSION, load_params, save_params  # noqa: E402


def _nan_with_payload(dtype, payload):
    """A quiet NaN with extra mantissa bits set, to check bits survive (not just 'isnan')."""
    if dtype == np.float64:
        return np.array([0x7FF8000000000000 | payload], dtype=np.uint64).view(np.float64)
    return np.array([0x7FC00000 | payload], dtype=np.uint32).view(np.float32)


def _params():
    return {
        "h1.kernel.lengthscale": np.array([0.5, 1.5, -0.0], dtype=np.float64),
        "h1.u_loc": jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
        "layers/0": {
            "w.mean": np.concatenate(
                [_nan_with_payload(np.float64, 0x123), [np.inf, -np.inf, -0.0, 1e-310]]
            ),
            "w32": np.concatenate(
                [_nan_with_payload(np.float32, 0x45), np.array([np.inf, -0.0], np.float32)]
            ),
            "count": np.array(7, dtype=np.int32),  # 0-d must stay 0-d
            "mask": np.array([[True, False], [False, True]]),
            "jax_bool": jnp.array([True, False]),
            "jax_i32": jnp.array([1, -2, 3], dtype=jnp.int32),
            "scalar64": np.float64(-0.0),
            "empty": np.zeros((0, 3), dtype=np.float32),
            "nested.again": {"deep/er": np.array([-1], dtype=np.int64)},
        },
        "empty_group": {},
        "": np.array(3.0, dtype=np.float32),  # the empty string is a valid key too
        "bf16": jnp.array([1.5, -0.0, jnp.inf], dtype=jnp.bfloat16),
    }


def _assert_bitwise_equal_trees(expected, actual, where="params"):
    assert isinstance(actual, dict), where
    assert list(actual) == list(expected), where
    for key, exp in expected.items():
        act = actual[key]
        if isinstance(exp, dict):
            _assert_bitwise_equal_trees(exp, act, f"{where}[{key!r}]")
            continue
        exp = np.asarray(exp)
        act_np = np.asarray(act)
        assert act_np.dtype == exp.dtype, (where, key, act_np.dtype, exp.dtype)
        assert act_np.shape == exp.shape, (where, key)
        assert np.array_equal(
            np.ascontiguousarray(exp).reshape(-1).view(np.uint8),
            np.ascontiguousarray(act_np).reshape(-1).view(np.uint8),
        ), (where, key)


def _leaves(tree):
    for value in tree.values():
        if isinstance(value, dict):
            yield from _leaves(value)
        else:
            yield value


def test_round_trip_is_bit_exact(tmp_path):
    params = _params()
    path = tmp_path / "params.npz"
    save_params(path, params, metadata={"library": "numpyro_dgp", "layers": [2, 3]})
    loaded, metadata = load_params(path, return_metadata=True)
    _assert_bitwise_equal_trees(params, loaded)
    assert all(isinstance(leaf, jax.Array) for leaf in _leaves(loaded))
    assert loaded["layers/0"]["count"].shape == ()
    assert loaded["empty_group"] == {}
    assert metadata == {"library": "numpyro_dgp", "layers": [2, 3]}


def test_round_trip_as_numpy(tmp_path):
    params = _params()
    save_params(tmp_path / "p.npz", params)
    loaded = load_params(tmp_path / "p.npz", as_numpy=True)
    _assert_bitwise_equal_trees(params, loaded)
    assert all(isinstance(leaf, np.ndarray) for leaf in _leaves(loaded))
    assert loaded["bf16"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_metadata_defaults_to_empty_dict(tmp_path):
    save_params(tmp_path / "p.npz", {"a": np.ones(2)})
    params, metadata = load_params(tmp_path / "p.npz", return_metadata=True)
    assert metadata == {}
    assert set(params) == {"a"}


def test_python_scalars_and_sequences_become_arrays(tmp_path):
    save_params(tmp_path / "p.npz", {"f": 1.5, "i": 2, "b": True, "l": [1.0, 2.0]})
    loaded = load_params(tmp_path / "p.npz", as_numpy=True)
    assert loaded["f"].shape == () and loaded["f"].dtype == np.float64
    assert loaded["i"].shape == () and loaded["i"].dtype.kind == "i"
    assert loaded["b"].dtype == np.bool_
    np.testing.assert_array_equal(loaded["l"], [1.0, 2.0])


@pytest.mark.parametrize("as_str", [True, False])
def test_path_without_npz_suffix_is_used_verbatim(tmp_path, as_str):
    path = tmp_path / "checkpoint"
    save_params(str(path) if as_str else path, {"x": np.arange(3)})
    assert path.is_file()
    assert not (tmp_path / "checkpoint.npz").exists()
    loaded = load_params(str(path) if as_str else path, as_numpy=True)
    np.testing.assert_array_equal(loaded["x"], np.arange(3))


def test_overwrite_replaces_previous_file(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.ones(2)})
    save_params(path, {"b": np.zeros(3)})
    assert set(load_params(path)) == {"b"}
    assert sorted(os.listdir(tmp_path)) == ["p.npz"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_new_file_gets_umask_mode_and_existing_mode_is_kept(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.ones(2)})
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask
    os.chmod(path, 0o640)
    save_params(path, {"a": np.ones(2)})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


# ---------------------------------------------------------------------------------------
# Atomicity
# ---------------------------------------------------------------------------------------


def _write_then_fail(file, *args, **kwargs):
    file.write(b"PK\x03\x04 half an archive")
    raise RuntimeError("disk on fire")


def test_failed_write_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.arange(4.0)})
    before = path.read_bytes()

    monkeypatch.setattr(np, "savez", _write_then_fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_params(path, {"a": np.zeros(10)})

    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["p.npz"]
    monkeypatch.undo()
    np.testing.assert_array_equal(load_params(path)["a"], np.arange(4.0))


def test_failed_rename_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.arange(4.0)})
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(dgp_io.os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        save_params(path, {"a": np.zeros(10)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["p.npz"]


def test_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(np, "savez", _write_then_fail)
    with pytest.raises(RuntimeError):
        save_params(tmp_path / "new.npz", {"a": np.ones(1)})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------
# Validation on save
# ---------------------------------------------------------------------------------------


def test_non_string_key_is_rejected_with_its_location(tmp_path):
    with pytest.raises(TypeError, match=r"keys must be strings.*int key 3.*params\['h1'\]"):
        save_params(tmp_path / "p.npz", {"h1": {3: np.ones(1)}})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad", ["a string", None, object(), np.array(["x", "y"])])
def test_non_array_value_is_rejected_naming_the_key(tmp_path, bad):
    with pytest.raises(TypeError, match=r"params\['h1'\]\['kernel\.variance'\]"):
        save_params(tmp_path / "p.npz", {"h1": {"kernel.variance": bad}})
    assert os.listdir(tmp_path) == []


def test_prng_key_leaf_is_rejected(tmp_path):
    with pytest.raises(TypeError, match=r"params\['key'\]"):
        save_params(tmp_path / "p.npz", {"key": jax.random.key(0)})


def test_params_must_be_a_mapping(tmp_path):
    with pytest.raises(TypeError, match="params must be a mapping"):
        save_params(tmp_path / "p.npz", [np.ones(2)])


def test_metadata_must_be_json_serializable(tmp_path):
    with pytest.raises(TypeError, match="metadata must be JSON-serializable"):
        save_params(tmp_path / "p.npz", {"a": np.ones(1)}, metadata={"arr": np.ones(2)})
    assert os.listdir(tmp_path) == []


def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_params(tmp_path / "nope" / "p.npz", {"a": np.ones(1)})


# ---------------------------------------------------------------------------------------
# Validation on load
# ---------------------------------------------------------------------------------------


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_params(tmp_path / "missing.npz")


def test_truncated_file_raises_value_error_naming_path(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, _params())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="p.npz"):
        load_params(path)


def test_flipped_bytes_raise_value_error(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.arange(1000.0)})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the array payload: the zip CRC check must catch it
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        load_params(path)


def test_garbage_file_raises_value_error(tmp_path):
    path = tmp_path / "p.npz"
    path.write_bytes(b"definitely not a zip archive")
    with pytest.raises(ValueError, match="p.npz"):
        load_params(path)


def test_foreign_npz_and_npy_raise_value_error(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="plain.npz"):
        load_params(tmp_path / "plain.npz")
    np.save(tmp_path / "single.npy", np.ones(2))
    with pytest.raises(ValueError, match="single.npy"):
        load_params(tmp_path / "single.npy")


def test_newer_format_version_is_rejected(tmp_path):
    header = {"format": "numpyro_dgp.params", "format_version": FORMAT_VERSION + 1,
              "tree": {"type": "dict", "items": []}, "metadata": {}}
    with open(tmp_path / "future.npz", "wb") as f:
        np.savez(f, __numpyro_dgp_header__=np.array(json.dumps(header)))
    with pytest.raises(ValueError, match="format_version"):
        load_params(tmp_path / "future.npz")


def _x64_disabled():
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(False)

    @contextlib.contextmanager
    def ctx():
        jax.config.update("jax_enable_x64", False)
        try:
            yield
        finally:
            jax.config.update("jax_enable_x64", True)

    return ctx()


def test_float64_without_x64_raises_clear_error(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, {"h1": {"w": np.ones(2, dtype=np.float64)}, "b": np.ones(2, np.float32)})
    with _x64_disabled():
        with pytest.raises(ValueError, match="jax_enable_x64") as info:
            load_params(path)
        assert "params['h1']['w']" in str(info.value)
        assert "float64" in str(info.value)
        # The NumPy escape hatch still gives the exact values.
        loaded = load_params(path, as_numpy=True)
        assert loaded["h1"]["w"].dtype == np.float64
    # float32-only files load fine without x64.
    save_params(tmp_path / "f32.npz", {"b": np.ones(2, np.float32)})
    with _x64_disabled():
        assert load_params(tmp_path / "f32.npz")["b"].dtype == jnp.float32


def test_file_is_an_ordinary_npz(tmp_path):
    # Other tools (plain numpy) can still open the archive and read the header.
    path = tmp_path / "p.npz"
    save_params(path, {"a.b": np.ones(2)}, metadata={"model": "dgp"})
    with np.load(path, allow_pickle=False) as npz:
        header = json.loads(str(npz["__numpyro_dgp_header__"][()]))
    assert header["format_version"] == FORMAT_VERSION
    assert header["metadata"] == {"model": "dgp"}


def test_check_arguments_without_a_model_are_refused(tmp_path):
    # guide= and args= alone would load unchecked while the caller believes them checked
    path = save_params(tmp_path / "p.npz", {"a": np.ones(2)})
    with pytest.raises(ValueError, match="pass model= too"):
        load_params(path, args=(np.ones((3, 1)),))


@pytest.mark.parametrize(
    "edit",
    [
        lambda tree: {**tree, "items": [["a", {**tree["items"][0][1], "type": "arr"}]]},
        lambda tree: {**tree, "items": [["a", {**tree["items"][0][1], "encoding": "zip"}]]},
        lambda tree: tree["items"][0][1],  # the tree is one array, not a dict of parameters
    ],
    ids=["unknown node type", "unknown encoding", "top level not a dict"],
)
def test_hand_edited_header_trees_are_refused(tmp_path, edit):
    import json

    from numpyro_dgp.io import _HEADER_KEY

    path = tmp_path / "p.npz"
    save_params(path, {"a": np.arange(3.0)})
    with np.load(path) as npz:
        members = {name: npz[name] for name in npz.files}
    header = json.loads(str(members[_HEADER_KEY][()]))
    header["tree"] = edit(header["tree"])
    members[_HEADER_KEY] = np.asarray(json.dumps(header))
    np.savez(path, **members)
    with pytest.raises(ValueError, match="is corrupt"):
        load_params(path)
