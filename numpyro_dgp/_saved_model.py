"""Whole-model save and load: a fitted model as one directory that predicts in a new process.

:func:`save_model` writes a model built by one of the factories of :mod:`numpyro_dgp.models`
(:func:`~numpyro_dgp.models.deep_gp_regression`, :func:`~numpyro_dgp.models.diffgp`,
:func:`~numpyro_dgp.models.amortized_dgp`), its guide (one of :mod:`numpyro_dgp.guides`), the
fitted parameters and, optionally, the standardization of the data; :func:`load_model` gives
back a :class:`SavedModel` that predicts in the original units of the data, with no training
data and no user code.

Directory layout (format version 1)::

    MODEL_DIR/
        model.json    # human-readable: format, format_version, library_version, the factory
                      # and its arguments, the guide and its options, input_dim, dtype,
                      # standardization, feature and target names, sha256 of params.npz
        params.npz    # the parameters (numpyro_dgp.io.save_params format)

The directory is written next to its target under a temporary name and renamed onto it
(atomic on POSIX file systems): a failed save leaves no partial directory and any previous
model in place. Loading checks the format version, the presence of both files, the checksum
of the parameters, and the parameters' names, shapes and dtypes against the rebuilt model
and guide (:class:`~numpyro_dgp.ParameterMismatchError`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from numpyro_dgp import __version__
from numpyro_dgp._persist.encoding import decode_value, encode_value
from numpyro_dgp._persist.model_files import (
    CONFIG_FILE,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    PARAMS_FILE,
    ModelFileError,
    check_model_directory,
    check_model_dtype,
    check_model_output,
    check_params_file,
    newer_library_hint,
    read_config,
    sha256,
)
from numpyro_dgp._persist.standardization import Standardization, check_standardization
from numpyro_dgp._protocol import model_config
from numpyro_dgp._validation import check_positive_int

__all__ = [
    "ModelFileError",
    "SavedModel",
    "Standardization",
    "load_model",
    "save_model",
]

#: the factories a saved model can name
_FACTORIES = ("deep_gp_regression", "diffgp", "amortized_dgp")

#: constructor options recorded per guide class (attribute name, keyword)
_GUIDE_OPTIONS = {
    "AutoFactorizedDGP": (
        ("inner_init", "inner_init"),
        ("init_scale", "init_scale"),
        ("prefix", "prefix"),
    ),
    "AutoJointDGP": (
        ("inner_init", "inner_init"),
        ("init_scale", "init_scale"),
        ("prefix", "prefix"),
    ),
    "AutoChainDGP": (
        ("inner_init", "inner_init"),
        ("init_scale", "init_scale"),
        ("prefix", "prefix"),
    ),
    "AutoAmortizedDGP": (
        ("rule", "rule"),
        ("num_branches", "num_branches"),
        ("covariance", "covariance"),
        ("hidden_width", "hidden_width"),
        ("num_hidden", "num_hidden"),
        ("encoder_init_scale", "init_scale"),
        ("learn_points", "learn_points"),
        ("inner_init", "inner_init"),
        ("prefix", "prefix"),
    ),
}


def _check_guide(guide: Any) -> str:
    """The class name of ``guide``, checked to be a library guide that can be saved.

    :raises TypeError: a guide of another library, a wrapped guide, or an ``AutoAmortizedDGP``
        built with ``points=``.
    """
    from numpyro_dgp._compat import innermost_guide

    inner = innermost_guide(guide)
    name = type(inner).__name__
    if inner is not guide or name not in _GUIDE_OPTIONS:
        raise TypeError(
            f"save_model: guide must be one of the library's guides {sorted(_GUIDE_OPTIONS)} "
            f"(not wrapped), got {type(guide).__name__}"
        )
    if name == "AutoAmortizedDGP" and inner.initial_points is not None:
        raise TypeError(
            "save_model: an AutoAmortizedDGP built with points= cannot be saved yet; "
            "build it without points= (they are then initialized and learned)"
        )
    return name


def _guide_config(guide: Any) -> dict:
    name = _check_guide(guide)
    options = {
        key: encode_value(getattr(guide, attr), f"guide.{attr}")
        for attr, key in _GUIDE_OPTIONS[name]
    }
    if name == "AutoAmortizedDGP":
        options["weights"] = [float(w) for w in guide.initial_weights]
    return {"class": name, "options": options}


def _check_guide_class(config: Mapping[str, Any]) -> str:
    """The guide class ``config`` names.

    :raises ValueError: a class this library does not save.
    """
    name = config.get("class")
    if name not in _GUIDE_OPTIONS:
        raise ValueError(
            f"unknown guide class {name!r} (this library saves {sorted(_GUIDE_OPTIONS)})"
        )
    return name


def _make_guide(model: Callable, config: Mapping[str, Any]) -> Any:
    from numpyro_dgp import guides

    name = _check_guide_class(config)
    options = {k: decode_value(v) for k, v in dict(config.get("options") or {}).items()}
    return getattr(guides, name)(model, **options)


def _check_factory(config: Mapping[str, Any]) -> str:
    """The model factory ``config`` names.

    :raises ValueError: a factory this library does not save.
    """
    factory = config.get("factory")
    if factory not in _FACTORIES:
        raise ValueError(
            f"unknown model factory {factory!r} (this library saves {list(_FACTORIES)})"
        )
    return factory


def _make_model(config: Mapping[str, Any]) -> Callable:
    from numpyro_dgp import models

    factory = _check_factory(config)
    arguments = {k: decode_value(v) for k, v in dict(config.get("arguments") or {}).items()}
    return getattr(models, factory)(**arguments)


def _setup_rows(config: Mapping[str, Any]) -> int:
    """Rows of the placeholder data the guide's structure is read from: enough for the
    k-means initial values of every layer (never computed: the run is abstract)."""
    arguments = config.get("arguments") or {}
    counts = arguments.get("num_inducing", 1)
    counts = counts if isinstance(counts, list) else [counts]
    return max([int(c) for c in counts if isinstance(c, (int, float))] + [2])


def _params_dtype(params: Mapping[str, Any]) -> str:
    for value in params.values():
        dtype = np.dtype(getattr(value, "dtype", np.asarray(value).dtype))
        if np.issubdtype(dtype, np.floating):
            return dtype.name
    return np.dtype(jnp.zeros(()).dtype).name


def _check_save_model_arguments(
    model: Callable,
    input_dim: int,
    standardization: Standardization | None,
    feature_names: Sequence[str] | None,
) -> dict[str, Any]:
    """The model's recorded configuration (factory and arguments), checked with ``input_dim``,
    ``standardization`` and ``feature_names``.

    :raises TypeError: a model not built by a factory of :mod:`numpyro_dgp.models`.
    :raises ValueError: a bad ``input_dim``, or a ``standardization`` or ``feature_names`` of
        another size.
    """
    config = model_config(model)
    if not isinstance(config, dict) or config.get("factory") not in _FACTORIES:
        raise TypeError(
            "save_model: model must be built by numpyro_dgp.models.deep_gp_regression, diffgp or "
            "amortized_dgp (a model of your own: save its parameters with save_params)"
        )
    check_positive_int(input_dim, "input_dim", "save_model")
    if standardization is not None:
        check_standardization(standardization, input_dim, "save_model")
    if feature_names is not None and len(feature_names) != int(input_dim):
        raise ValueError(
            f"save_model: {len(feature_names)} feature_names for input_dim={input_dim}"
        )
    return config


def _check_document_json(document: dict[str, Any]) -> str:
    """``model.json``'s text.

    :raises TypeError: metadata that JSON cannot hold.
    """
    try:
        return json.dumps(document, indent=2)
    except (TypeError, ValueError) as err:
        raise TypeError(f"save_model: metadata must be JSON-serializable: {err}") from err


def save_model(
    path: os.PathLike | str,
    model: Callable,
    guide: Callable,
    params: Mapping[str, Any],
    *,
    input_dim: int,
    standardization: Standardization | None = None,
    feature_names: Sequence[str] | None = None,
    target_name: str | Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Save a fitted model as one directory (``model.json`` + ``params.npz``), atomically.

    :param path: the directory to create (its parent must exist).
    :param model: a model built by :func:`~numpyro_dgp.models.deep_gp_regression`,
        :func:`~numpyro_dgp.models.diffgp` or :func:`~numpyro_dgp.models.amortized_dgp`
        (the factory and its arguments are recorded, not the code).
    :param guide: its guide, one of :mod:`numpyro_dgp.guides` (class and options recorded).
    :param params: the fitted parameters (``FitResult.params``).
    :param input_dim: ``D``, the number of input features.
    :param standardization: the map from the data's units to the fitted ones, applied by
        :meth:`SavedModel.predict` (``None``: the data are used as they are).
    :param feature_names: ``D`` names of the input columns (written to ``model.json``).
    :param target_name: name of the target column (a list of names for several).
    :param metadata: further JSON-serializable information (e.g. training metrics).
    :param overwrite: replace an existing model directory at ``path``, one this library wrote
        (``model.json`` and ``params.npz``, nothing else); an empty folder is written into
        without it. Anything else (a file, a folder of your own) is refused, never deleted.
    :return: the directory written.
    :raises TypeError: a model not built by a factory, a guide not of this library, or
        arguments that cannot be written.
    :raises FileExistsError: ``path`` is a model directory and ``overwrite`` is false, or it is
        not empty and not a model directory this library wrote (a file, a folder of yours).
    :raises FileNotFoundError: the parent directory does not exist.
    :raises ValueError: an ``input_dim`` the parameters contradict, a ``standardization`` that is
        not finite, not positive in its scales or of another size, ``feature_names`` of another
        size.
    :raises ~numpyro_dgp.ParameterMismatchError: parameters :func:`load_model` would refuse
        (another model's, or not finite): the model is rebuilt from what is written and
        checked as loading checks it, so that a saved model always loads.
    """
    from numpyro_dgp.io import save_params

    path = Path(os.fspath(path)).expanduser()
    check_model_output(path, overwrite, "save_model: path", "overwrite=True")
    config = _check_save_model_arguments(model, input_dim, standardization, feature_names)
    arguments = {k: encode_value(v, k) for k, v in config["arguments"].items()}
    document: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "library_version": __version__,
        "model": {"factory": config["factory"], "arguments": arguments},
        "guide": _guide_config(guide),
        "input_dim": int(input_dim),
        "dtype": _params_dtype(params),
        "standardization": None if standardization is None else standardization.to_json(),
        "feature_names": None if feature_names is None else [str(n) for n in feature_names],
        "target_name": target_name
        if target_name is None or isinstance(target_name, str)
        else list(target_name),
        "metadata": dict(metadata or {}),
        "files": {},
    }
    _rebuilt(document, params, f"save_model (input_dim={int(input_dim)})")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        save_params(tmp / PARAMS_FILE, dict(params))
        document["files"][PARAMS_FILE] = {
            "sha256": sha256(tmp / PARAMS_FILE),
            "bytes": (tmp / PARAMS_FILE).stat().st_size,
        }
        text = _check_document_json(document)
        with open(tmp / CONFIG_FILE, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _check_predict_inputs(X: ArrayLike, input_dim: int) -> np.ndarray:
    """``X`` as a NumPy array, checked to have rows, ``input_dim`` columns and finite values.

    :raises ValueError: otherwise.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != input_dim or X.shape[0] == 0:
        raise ValueError(
            f"SavedModel.predict: X must have shape (N, {input_dim}) with N >= 1, got {X.shape}"
        )
    if np.issubdtype(X.dtype, np.number) and not np.all(np.isfinite(X)):
        raise ValueError(
            f"SavedModel.predict: X contains {int(np.sum(~np.isfinite(X)))} NaN or inf values"
        )
    return X


class SavedModel:
    """A model loaded by :func:`load_model`: the rebuilt model and guide (set up), the
    parameters and the standardization; :meth:`predict` works in the data's units.

    :ivar model: the model (rebuilt by its factory).
    :ivar guide: the guide, set up (ready for :func:`numpyro_dgp.predict`).
    :ivar params: the parameters (JAX arrays).
    :ivar config: the parsed ``model.json``.
    :ivar standardization: the :class:`Standardization`, or ``None``.
    :ivar feature_names: the input column names, or ``None``.
    :ivar target_name: the target column name (a list for several), or ``None``.
    :ivar likelihood: the factory's likelihood (``"gaussian"``, ``"probit"``, ``"softmax"``, ...).
    """

    def __init__(
        self,
        model: Callable,
        guide: Callable,
        params: dict,
        config: dict,
        standardization: Standardization | None,
    ) -> None:
        self.model = model
        self.guide = guide
        self.params = params
        self.config = config
        self.standardization = standardization
        self.feature_names = config.get("feature_names")
        self.target_name = config.get("target_name")
        self.likelihood = (config["model"].get("arguments") or {}).get("likelihood", "gaussian")
        self.input_dim = int(config["input_dim"])

    @property
    def target_names(self) -> list[str]:
        """The target column names as a list (empty when none was recorded)."""
        if self.target_name is None:
            return []
        return [self.target_name] if isinstance(self.target_name, str) else list(self.target_name)

    def __repr__(self) -> str:
        return (
            f"SavedModel({self.config['model']['factory']}, guide={self.config['guide']['class']}, "
            f"input_dim={self.input_dim}, likelihood={self.likelihood!r})"
        )

    def predict(
        self,
        X: ArrayLike,
        *,
        rng_key: jax.Array | None = None,
        num_samples: int = 100,
        batch_size: int | None = None,
        standardized: bool = False,
        keep_layers: bool = False,
    ) -> Any:
        """The predictive mixture at ``X`` in the data's units.

        :param X: ``(N, D)`` inputs in the data's units (standardized here with the stored
            standardization, unless ``standardized``).
        :param rng_key: PRNG key (default ``PRNGKey(0)``).
        :param num_samples: mixture components ``S``.
        :param batch_size: predict this many points at a time (bounded memory; see
            :func:`numpyro_dgp.predict`).
        :param standardized: ``X`` is already standardized, and the result is returned in
            standardized units.
        :param keep_layers: also return every layer's draws and moments (see
            :func:`numpyro_dgp.predict`; off by default to keep memory at ``S x N``).
        :return: a :class:`~numpyro_dgp.Prediction` (regression: means, variances and, for other
            likelihoods than the Gaussian, the atoms mapped back to the target's units;
            classification: class probabilities; counts: as predicted).
        :raises ValueError: ``X`` without rows or ``D`` columns, or with NaN or inf.
        """
        from numpyro_dgp._predict.prediction import predict

        X = _check_predict_inputs(X, self.input_dim)
        s = None if standardized else self.standardization
        if s is not None:
            X = s.inputs(X)
        X = jnp.asarray(X, dtype=self.config["dtype"])
        key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        prediction = predict(
            self.model,
            self.guide,
            self.params,
            key,
            X,
            num_samples=num_samples,
            batch_size=batch_size,
            keep_layers=keep_layers,
        )
        return prediction if s is None else s.to_data_units(prediction)


def _placeholder_targets(arguments: Mapping[str, Any], rows: int, dtype: Any) -> jax.Array:
    """Zero targets shaped and typed as the factory's model takes them (the guide's structure is
    read from an abstract run on them): ``(rows,)`` or ``(rows, T)``, labels and counts as
    integers."""
    from numpyro_dgp.models import Observation

    observation = Observation(
        arguments.get("likelihood", "gaussian"), int(arguments.get("num_outputs", 1))
    )
    shape = (rows,) if observation.num_outputs == 1 else (rows, observation.num_outputs)
    return jnp.zeros(shape, dtype if observation.continuous else jnp.int32)


def load_model(path: os.PathLike | str) -> SavedModel:
    """Load a model directory written by :func:`save_model` (or ``numpyro-dgp fit``).

    The model and guide are rebuilt from ``model.json`` by the library's factories, the guide
    set up abstractly (no training data needed), and the parameters checked against them.
    Float64 parameters need JAX's 64-bit mode (``jax.config.update("jax_enable_x64", True)``).

    :param path: the model directory.
    :return: a :class:`SavedModel`.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ModelFileError: a missing or corrupted file (checksum), a format version this
        library does not read, or a model this library cannot build (the message says to
        upgrade when a newer numpyro_dgp wrote it).
    :raises ~numpyro_dgp.ParameterMismatchError: parameters that do not fit the described model
        (with the same upgrade hint).
    :raises ValueError: float64 parameters while JAX's 64-bit mode is off.
    """
    from numpyro_dgp.io import load_params

    path = check_model_directory(path)
    config = read_config(path)
    params_path = path / PARAMS_FILE
    check_params_file(params_path, path, config)
    check_model_dtype(config, path)
    params = load_params(params_path)
    standardization = config.get("standardization")
    if standardization is not None:
        standardization = Standardization.from_json(standardization)
        try:
            check_standardization(standardization, int(config["input_dim"]), "load_model")
        except ValueError as err:
            raise ModelFileError(f"{str(path / CONFIG_FILE)!r} is corrupted: {err}") from err
    model, guide = _rebuilt(config, params, f"load_model({str(path)!r})", path)
    return SavedModel(model, guide, params, config, standardization)


def _rebuilt(
    config: Mapping[str, Any], params: Mapping[str, Any], where: str, path: Path | None = None
) -> tuple[Callable, Any]:
    """``(model, guide)`` rebuilt from a ``model.json`` document by the library's factories, the
    guide set up abstractly on placeholder data of ``input_dim`` columns, and ``params`` checked
    against them (names, shapes, dtypes, finiteness): what :func:`load_model` does, and what
    :func:`save_model` does before writing, so that a saved model loads.

    :raises ModelFileError: (``path`` given: loading) a model this library cannot build.
    :raises ~numpyro_dgp.ParameterMismatchError: parameters that do not fit the described model.
    """
    from numpyro_dgp._persist.params import (
        STRICT_HINT,
        check_params_against,
        param_specs,
        set_up_guide,
    )

    try:
        model = _make_model(config["model"])
        guide = _make_guide(model, config["guide"])
    except (TypeError, ValueError, KeyError) as err:
        if path is None:
            raise
        raise ModelFileError(
            f"load_model: {str(path / CONFIG_FILE)!r} describes a model this library cannot "
            f"build: {err}{newer_library_hint(config)}"
        ) from err
    dtype = np.dtype(config["dtype"])
    D, rows = int(config["input_dim"]), _setup_rows(config["model"])
    X0 = jnp.zeros((rows, D), dtype)
    y0 = _placeholder_targets(config["model"].get("arguments") or {}, rows, dtype)
    set_up_guide(guide, jax.random.PRNGKey(0), (X0, y0), {})
    hint = STRICT_HINT + (newer_library_hint(config) if path is not None else "")
    check_params_against(
        param_specs(model, guide, (X0, y0), {}), params, where, require_finite=True, hint=hint
    )
    return model, guide
