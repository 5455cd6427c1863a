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

The checks of a model directory's files (``read_config``, ``check_model_directory``,
``check_model_output``, ``check_output_place``) need NumPy only: this module imports
JAX in the functions that run a model, so the command line checks its paths and a saved
model's ``model.json`` before JAX loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from numpyro_dgp import __version__
from numpyro_dgp._saved_model._directory import (  # noqa: F401 (check_output_place: the CLI's)
    CONFIG_FILE,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    PARAMS_FILE,
    ModelFileError,
    check_model_directory,
    check_model_output,
    check_output_place,
    newer_library_hint,
    read_config,
    sha256,
)
from numpyro_dgp.io import (
    STRICT_HINT,
    check_params_against,
    load_params,
    param_specs,
    set_up_guide,
    write_atomically,
)

if TYPE_CHECKING:
    import jax
    from jax.typing import ArrayLike


#: the factories a saved model can name
_FACTORIES = ("deep_gp_regression", "diffgp", "amortized_dgp")

#: constructor options recorded per guide class (read from the attribute of the same name, but
#: the amortized guide's ``init_scale`` from ``encoder_init_scale``)
_OPTIONS = ("inner_init", "init_scale", "prefix")
_GUIDE_OPTIONS = {
    "AutoFactorizedDGP": _OPTIONS,
    "AutoJointDGP": _OPTIONS,
    "AutoChainDGP": _OPTIONS,
    "AutoAmortizedDGP": ("rule", "num_branches", "covariance", "hidden_width", "num_hidden")
    + ("init_scale", "learn_points", "inner_init", "prefix"),
}


class Standardization(NamedTuple):
    """The affine maps between the data's units and the standardized units a model is fitted in:
    ``X_std = (X - x_mean) / x_scale`` and, for regression, ``y_std = (y - y_mean) / y_scale``.

    :ivar x_mean: ``(D,)`` feature means of the training part.
    :ivar x_scale: ``(D,)`` feature standard deviations (1 where a feature is constant).
    :ivar y_mean: target mean (0 for classification and counts; ``(T,)`` for ``T`` columns).
    :ivar y_scale: target standard deviation (1 for classification and counts; ``(T,)``).
    """

    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float | np.ndarray = 0.0
    y_scale: float | np.ndarray = 1.0

    @classmethod
    def fit(cls, X: ArrayLike, y: ArrayLike | None = None) -> Standardization:
        """The standardization of training data: per-feature mean and standard deviation of
        ``X`` and, if ``y`` is given, of each column of ``y`` (constant columns get scale 1;
        missing targets, NaN, are left out).

        :param X: ``(N, D)`` training inputs.
        :param y: ``(N,)`` or ``(N, T)`` regression targets, or ``None`` (classification and
            counts: targets untouched).
        :return: the :class:`Standardization`.
        :raises ValueError: ``X`` is not a non-empty ``(N, D)`` array.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1:
            raise ValueError(
                f"Standardization.fit: X must be a non-empty (N, D) array, got shape {X.shape}"
            )
        x_scale = X.std(axis=0)
        x_scale = np.where(x_scale > 0, x_scale, 1.0)
        if y is None:
            return cls(X.mean(axis=0), x_scale)
        y = np.asarray(y, dtype=np.float64)
        columns = y.reshape(y.shape[0], -1)
        y_mean, y_scale = np.nanmean(columns, axis=0), np.nanstd(columns, axis=0)
        y_scale = np.where(y_scale > 0, y_scale, 1.0)
        if y.ndim == 1:
            return cls(X.mean(axis=0), x_scale, float(y_mean[0]), float(y_scale[0]))
        return cls(X.mean(axis=0), x_scale, y_mean, y_scale)

    def inputs(self, X: ArrayLike) -> np.ndarray:
        """``(X - x_mean) / x_scale``.

        :param X: ``(N, D)`` inputs in the data's units.
        :return: the standardized inputs (float64).
        """
        return (np.asarray(X, dtype=np.float64) - self.x_mean) / self.x_scale

    def targets(self, y: ArrayLike) -> np.ndarray:
        """``(y - y_mean) / y_scale``.

        :param y: ``(N,)`` targets in the data's units, or ``(N, T)`` for ``T`` columns (each with
            its own mean and scale).
        :return: the standardized targets (float64).
        """
        return (np.asarray(y, dtype=np.float64) - self.y_mean) / self.y_scale

    def to_data_units(self, prediction: Any) -> Any:
        """A prediction of standardized targets in the data's units: ``y = y_mean + y_scale y_std``
        (each column by its own mean and scale) for the means, variances, components and, for a
        location-scale likelihood kept as atoms (Student-t, heteroscedastic Gaussian), the atoms.
        Classification predictions, and any prediction when the targets were not standardized
        (``y_mean = 0``, ``y_scale = 1``), are returned as they are.

        :param prediction: a :class:`~numpyro_dgp.Prediction` of standardized targets.
        :return: the :class:`~numpyro_dgp.Prediction` in the data's units.
        :raises ValueError: a prediction kept as atoms of a family without location and scale
            (counts) whose targets were standardized.
        """
        import jax.numpy as jnp

        identity = np.all(np.equal(self.y_mean, 0.0)) and np.all(np.equal(self.y_scale, 1.0))
        if identity or prediction.likelihood in ("bernoulli", "categorical"):
            return prediction
        m = jnp.asarray(self.y_mean, prediction.mean.dtype)
        sc = jnp.asarray(self.y_scale, prediction.mean.dtype)
        atoms = prediction.atoms
        if atoms is not None:
            if not {"loc", "scale"} <= set(atoms.arg_constraints):
                raise ValueError(
                    f"Standardization.to_data_units: a {type(atoms).__name__} prediction has no "
                    "location and scale to map to the data's units (its targets should not have "
                    "been standardized)"
                )
            params = {name: getattr(atoms, name) for name in atoms.arg_constraints}
            params["loc"], params["scale"] = params["loc"] * sc + m, params["scale"] * sc
            atoms = type(atoms)(**params, validate_args=False)
        return prediction._replace(
            mean=prediction.mean * sc + m,
            variance=prediction.variance * sc**2,
            component_means=prediction.component_means * sc + m,
            component_variances=prediction.component_variances * sc**2,
            atoms=atoms,
        )


def _check_standardization(s: Standardization, input_dim: int, caller: str) -> None:
    """Raise unless ``s`` maps ``input_dim`` features and its targets by finite means and finite,
    positive scales, ``y_mean`` and ``y_scale`` of one shape (a number, or one per column).

    :raises ValueError: naming the field.
    """
    for name, value in s._asdict().items():
        array = np.asarray(value, dtype=np.float64)
        if name.startswith("x") and array.shape != (input_dim,):
            raise ValueError(
                f"{caller}: standardization.{name} has shape {array.shape}, expected {(input_dim,)}"
            )
        scale = name.endswith("scale")
        bad = np.atleast_1d(~np.isfinite(array) | ((array <= 0) if scale else False))
        if np.any(bad):
            where = np.argwhere(bad)[0].tolist()
            raise ValueError(
                f"{caller}: standardization.{name} must be "
                f"{'finite and positive' if scale else 'finite'}; "
                f"entry {where} is {np.atleast_1d(array)[tuple(where)]!r}"
            )
    y_shapes = np.shape(s.y_mean), np.shape(s.y_scale)
    if y_shapes[0] != y_shapes[1] or len(y_shapes[0]) > 1:
        raise ValueError(
            f"{caller}: standardization.y_mean and y_scale must be numbers or one per target "
            f"column, of one shape; got shapes {y_shapes[0]} and {y_shapes[1]}"
        )


def _encode(value: Any, where: str) -> Any:
    """``value`` (a factory or guide argument, named ``where`` in messages) as JSON: numbers and
    strings as they are, arrays and kernels as tagged dicts, lists entry by entry.

    :raises TypeError: a value of another type.
    """
    import jax

    from numpyro_dgp.kernels import Kernel

    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, Kernel):
        return {"__kernel__": _encode_kernel(value, where)}
    if isinstance(value, (jax.Array, np.ndarray)):
        arr = np.asarray(value)
        return {"__array__": arr.tolist(), "dtype": arr.dtype.name}
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"save_model: the model argument {where} = {value!r} cannot be saved (a "
        f"{type(value).__name__}; only numbers, strings, arrays, kernels and lists of them)"
    )


def _encode_kernel(kernel: Any, where: str) -> dict:
    from numpyro_dgp.kernels import Product, Sum

    name = type(kernel).__name__
    if isinstance(kernel, (Sum, Product)):
        return {"type": name, "kernels": [_encode_kernel(k, where) for k in kernel.kernels]}
    fields = {
        f.name: _encode(getattr(kernel, f.name), f"{where}.{f.name}")
        for f in dataclasses.fields(kernel)
    }
    return {"type": name, "fields": fields}


def _decode(value: Any) -> Any:
    """The inverse of :func:`_encode`."""
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "__array__" in value:
        return np.asarray(value["__array__"], dtype=np.dtype(value["dtype"]))
    if isinstance(value, dict) and "__kernel__" in value:
        return _decode_kernel(value["__kernel__"])
    if isinstance(value, dict):
        raise ValueError(f"unknown encoded value {value!r}")
    return value


def _decode_kernel(data: dict) -> Any:
    from numpyro_dgp import kernels

    cls = getattr(kernels, data.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, kernels.Kernel)):
        raise ValueError(f"unknown kernel type {data.get('type')!r}")
    if "kernels" in data:
        return cls(*[_decode_kernel(k) for k in data["kernels"]])
    return cls(**{k: _decode(v) for k, v in data["fields"].items()})


def _guide_config(guide: Any) -> dict:
    """The guide's class and options, as JSON.

    :raises TypeError: a guide of another library, a wrapped guide, or an ``AutoAmortizedDGP``
        built with ``points=``.
    """
    name = type(guide).__name__  # a wrapped guide (a handler's) has its handler's class
    if name not in _GUIDE_OPTIONS:
        raise TypeError(
            f"save_model: guide must be one of the library's guides {sorted(_GUIDE_OPTIONS)} "
            f"(not wrapped), got {type(guide).__name__}"
        )
    amortized = name == "AutoAmortizedDGP"
    if amortized and guide.initial_points is not None:
        raise TypeError(
            "save_model: an AutoAmortizedDGP built with points= cannot be saved yet; "
            "build it without points= (they are then initialized and learned)"
        )
    options = {}
    for key in _GUIDE_OPTIONS[name]:
        attribute = "encoder_init_scale" if amortized and key == "init_scale" else key
        options[key] = _encode(getattr(guide, attribute), f"guide.{attribute}")
    if amortized:
        options["weights"] = [float(w) for w in guide.initial_weights]
    return {"class": name, "options": options}


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
    import jax.numpy as jnp

    from numpyro_dgp._protocol import model_config
    from numpyro_dgp._validation import check_positive_int
    from numpyro_dgp.io import save_params  # looked up here: tests replace it to see it unreached

    path = Path(os.fspath(path)).expanduser()
    check_model_output(path, overwrite, "save_model: path", "overwrite=True")
    config = model_config(model)
    if not isinstance(config, dict) or config.get("factory") not in _FACTORIES:
        raise TypeError(
            "save_model: model must be built by numpyro_dgp.models.deep_gp_regression, diffgp or "
            "amortized_dgp (a model of your own: save its parameters with save_params)"
        )
    check_positive_int(input_dim, "input_dim", "save_model")
    if standardization is not None:
        _check_standardization(standardization, int(input_dim), "save_model")
    if feature_names is not None and len(feature_names) != int(input_dim):
        raise ValueError(
            f"save_model: {len(feature_names)} feature_names for input_dim={input_dim}"
        )
    # the fitted dtype: that of the floating parameters (the default one if there are none)
    dtypes = [np.asarray(value).dtype for value in params.values()]
    dtype = next((d for d in dtypes if np.issubdtype(d, np.floating)), jnp.zeros(()).dtype)
    document: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "library_version": __version__,
        "model": {
            "factory": config["factory"],
            "arguments": {k: _encode(v, k) for k, v in config["arguments"].items()},
        },
        "guide": _guide_config(guide),
        "input_dim": int(input_dim),
        "dtype": np.dtype(dtype).name,
        "standardization": None
        if standardization is None
        else {k: np.asarray(v, np.float64).tolist() for k, v in standardization._asdict().items()},
        "feature_names": None if feature_names is None else [str(n) for n in feature_names],
        "target_name": target_name
        if target_name is None or isinstance(target_name, str)
        else list(target_name),
        "metadata": dict(metadata or {}),
        "files": {},
    }
    try:
        json.dumps(document)
    except (TypeError, ValueError) as err:
        raise TypeError(f"save_model: metadata must be JSON-serializable: {err}") from err
    _rebuilt(document, params, f"save_model (input_dim={int(input_dim)})")
    # written under a temporary name next to path and renamed onto it (a previous model
    # directory there is moved aside first, then deleted)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        npz = tmp / PARAMS_FILE
        save_params(npz, dict(params))
        document["files"][PARAMS_FILE] = {"sha256": sha256(npz), "bytes": npz.stat().st_size}
        write_atomically(
            tmp / CONFIG_FILE, lambda f: f.write(json.dumps(document, indent=2) + "\n")
        )
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


@dataclasses.dataclass(eq=False, repr=False)
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

    model: Callable
    guide: Callable
    params: dict
    config: dict
    standardization: Standardization | None

    def __post_init__(self) -> None:
        arguments = self.config["model"].get("arguments") or {}
        self.feature_names = self.config.get("feature_names")
        self.target_name = self.config.get("target_name")
        self.likelihood = arguments.get("likelihood", "gaussian")
        self.input_dim = int(self.config["input_dim"])

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
    ) -> Any:
        """The predictive mixture at ``X`` in the data's units (without every layer's draws and
        moments, to keep memory at ``S x N``: :func:`numpyro_dgp.predict` of :attr:`model`,
        :attr:`guide` and :attr:`params` on standardized inputs gives them).

        :param X: ``(N, D)`` inputs in the data's units (standardized here with the stored
            standardization).
        :param rng_key: PRNG key (default ``PRNGKey(0)``).
        :param num_samples: mixture components ``S``.
        :param batch_size: predict this many points at a time (bounded memory; see
            :func:`numpyro_dgp.predict`).
        :return: a :class:`~numpyro_dgp.Prediction` (regression: means, variances and, for other
            likelihoods than the Gaussian, the atoms mapped back to the target's units;
            classification: class probabilities; counts: as predicted).
        :raises ValueError: ``X`` without rows or ``D`` columns, or with NaN or inf.
        """
        import jax
        import jax.numpy as jnp

        from numpyro_dgp._predict.prediction import predict

        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.input_dim or X.shape[0] == 0:
            raise ValueError(
                f"SavedModel.predict: X must have shape (N, {self.input_dim}) with N >= 1, "
                f"got {X.shape}"
            )
        if np.issubdtype(X.dtype, np.number) and not np.all(np.isfinite(X)):
            raise ValueError(
                f"SavedModel.predict: X contains {int(np.sum(~np.isfinite(X)))} NaN or inf values"
            )
        s = self.standardization
        X = jnp.asarray(X if s is None else s.inputs(X), dtype=self.config["dtype"])
        key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        options: dict[str, Any] = dict(num_samples=num_samples, batch_size=batch_size)
        prediction = predict(
            self.model, self.guide, self.params, key, X, keep_layers=False, **options
        )
        return prediction if s is None else s.to_data_units(prediction)


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
    import jax

    path = check_model_directory(path)
    config = read_config(path)
    params_path = path / PARAMS_FILE
    if not params_path.is_file():
        raise ModelFileError(
            f"load_model: {str(path)!r} has no {PARAMS_FILE} (an incomplete copy?)"
        )
    recorded = (config.get("files") or {}).get(PARAMS_FILE) or {}
    digest = sha256(params_path)
    if recorded.get("sha256") != digest:
        raise ModelFileError(
            f"load_model: {str(params_path)!r} is corrupted or was replaced: its sha256 is "
            f"{digest}, {CONFIG_FILE} records {recorded.get('sha256')!r}"
        )
    if np.dtype(config["dtype"]) == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError(
            f"load_model: {str(path)!r} holds a float64 model; call "
            'jax.config.update("jax_enable_x64", True) before loading it'
        )
    params = load_params(params_path)
    standardization = config.get("standardization")
    if standardization is not None:
        standardization = Standardization._make(
            np.asarray(v, np.float64) if isinstance(v, list) else float(v)
            for v in (standardization[name] for name in Standardization._fields)
        )
        try:
            _check_standardization(standardization, int(config["input_dim"]), "load_model")
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
    import jax
    import jax.numpy as jnp

    from numpyro_dgp import guides, models

    try:
        arguments = config["model"].get("arguments") or {}
        factory, guide_class = config["model"].get("factory"), config["guide"].get("class")
        if factory not in _FACTORIES or guide_class not in _GUIDE_OPTIONS:
            raise ValueError(f"unknown model factory {factory!r} or guide class {guide_class!r}")
        model = getattr(models, factory)(**{k: _decode(v) for k, v in arguments.items()})
        options = {k: _decode(v) for k, v in (config["guide"].get("options") or {}).items()}
        guide = getattr(guides, guide_class)(model, **options)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        if path is None:
            raise
        raise ModelFileError(
            f"load_model: {str(path / CONFIG_FILE)!r} describes a model this library cannot "
            f"build: {err}{newer_library_hint(config)}"
        ) from err
    # placeholder data: enough rows for the k-means initial values of every layer (never
    # computed: the run is abstract), targets shaped and typed as the factory's model takes them
    counts = arguments.get("num_inducing", 1)
    counts = counts if isinstance(counts, list) else [counts]
    rows = max([int(c) for c in counts if isinstance(c, (int, float))] + [2])
    dtype = np.dtype(config["dtype"])
    observation = models.Observation(
        arguments.get("likelihood", "gaussian"), int(arguments.get("num_outputs", 1))
    )
    shape = (rows,) if observation.num_outputs == 1 else (rows, observation.num_outputs)
    X0 = jnp.zeros((rows, int(config["input_dim"])), dtype)
    y0 = jnp.zeros(shape, dtype if observation.continuous else jnp.int32)
    set_up_guide(guide, jax.random.PRNGKey(0), (X0, y0), {})
    hint = STRICT_HINT + (newer_library_hint(config) if path is not None else "")
    check_params_against(
        param_specs(model, guide, (X0, y0), {}), params, where, require_finite=True, hint=hint
    )
    return model, guide
