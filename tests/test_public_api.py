"""The public surface: every name in every public ``__all__`` exists, is documented and typed.

Public modules are ``numpyro_dgp`` and its submodules whose names do not start with ``_``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
import typing

import pytest

import numpyro_dgp


def _public_modules():
    names = ["numpyro_dgp"]
    for info in pkgutil.walk_packages(numpyro_dgp.__path__, "numpyro_dgp."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


PUBLIC_MODULES = _public_modules()


def _public_objects():
    out = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            out.append((module_name, name))
    return out


def _functions_of(obj):
    """The callables whose signatures must be annotated: a function, or a class's own
    ``__init__`` and public methods (inherited ones are checked where they are defined)."""
    if inspect.isclass(obj):
        if issubclass(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple: fields are annotated
            members = {n: m for n, m in vars(obj).items() if inspect.isfunction(m) and not n.startswith("_")}
            return list(members.items())
        members = [("__init__", obj.__dict__["__init__"])] if "__init__" in obj.__dict__ else []
        for n, m in vars(obj).items():
            if n.startswith("_"):
                continue
            if isinstance(m, property):
                m = m.fget
            if inspect.isfunction(m):
                members.append((n, m))
        return members
    if inspect.isfunction(obj):
        return [(obj.__name__, obj)]
    return []


def test_public_modules_have_a_curated_all():
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert hasattr(module, "__all__"), f"{module_name} has no __all__"
        assert module.__doc__ and module.__doc__.strip(), f"{module_name} has no module docstring"


@pytest.mark.parametrize("module_name,name", _public_objects())
def test_every_public_name_exists_is_documented_and_typed(module_name, name):
    module = importlib.import_module(module_name)
    assert hasattr(module, name), f"{module_name}.__all__ lists {name!r}, which does not exist"
    obj = getattr(module, name)
    if inspect.ismodule(obj):
        assert obj.__doc__, f"module {obj.__name__} has no docstring"
        return
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # constants: documented in the module docstring or with #: comments
    assert obj.__doc__ and obj.__doc__.strip(), f"{module_name}.{name} has no docstring"
    for fname, fn in _functions_of(obj):
        hints_src = typing.get_type_hints  # resolves postponed annotations
        try:
            hints = hints_src(fn)
        except Exception:  # noqa: BLE001 - a forward reference that cannot be resolved here
            hints = dict(getattr(fn, "__annotations__", {}))
        sig = inspect.signature(fn)
        missing = [
            p.name for p in sig.parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in hints
        ]
        where = f"{module_name}.{name}" + ("" if fname == name else f".{fname}")
        assert not missing, f"{where}: parameters without annotations: {missing}"
        assert "return" in hints, f"{where}: no return annotation"
        if fname != "__init__" and inspect.isclass(obj):
            assert fn.__doc__, f"{where} has no docstring"


def test_import_loads_no_heavy_module():
    code = (
        "import sys; import numpyro; before = set(sys.modules); import numpyro_dgp; "
        "heavy = ('arviz', 'matplotlib', 'funsor', 'scipy', 'pandas', 'optax'); "
        "print([m for m in sys.modules if m not in before and (m.split('.')[0] in heavy "
        "or m.startswith(('numpyro_dgp.diagnostics', 'numpyro_dgp.plots')))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_import_and_the_command_line_s_help_and_argument_errors_load_neither_jax_nor_numpyro(tmp_path):
    """``import numpyro_dgp`` and ``numpyro-dgp --help`` answer at once, and so do a bad argument,
    a missing data directory or data set, a split the data set lacks and a bad table: no JAX,
    jaxlib or NumPyro until a name that needs them is used."""
    (tmp_path / "uci").mkdir()
    (tmp_path / "uci" / "t.csv").write_text("x,y\n0.5,2.5\n1.5,3.5\n")  # a table for `fit`
    folder = tmp_path / "uci" / "tiny"  # a data set in the standard layout with two splits
    folder.mkdir(parents=True)
    (folder / "data.txt").write_text("1 2\n3 4\n5 6\n")
    (folder / "index_features.txt").write_text("0\n")
    (folder / "index_target.txt").write_text("1\n")
    (folder / "n_splits.txt").write_text("2\n")
    code = textwrap.dedent("""
        import contextlib, io, json, sys
        loaded = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'numpyro'})
        import numpyro_dgp
        after_import = loaded()
        from numpyro_dgp import cli
        data_dir = sys.argv[1]
        codes, errors = [], []
        for argv in (['--help'], ['uci', '--help'], ['uci', '--dataset', 'x', '--splits', '3-1'],
                     ['demo', '--steps', '0'], ['uci', '--dataset', 'tiny'],
                     ['uci', '--dataset', 'tiny', '--data-dir', data_dir + '/nowhere'],
                     ['uci', '--dataset', 'nosuch', '--data-dir', data_dir],
                     ['uci', '--dataset', 'tiny', '--data-dir', data_dir, '--splits', '1,5'],
                     ['fit', data_dir + '/none.csv', '--target', 'y', '--output', data_dir + '/m'],
                     ['fit', data_dir + '/t.csv', '--target', 'z', '--output', data_dir + '/m'],
                     ['fit', data_dir + '/t.csv', '--target', 'y', '--output', data_dir + '/m',
                      '--likelihood', 'probit'],
                     ['predict', data_dir + '/m', data_dir + '/none.csv', '--output', data_dir + '/p.csv']):
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                try:
                    codes.append(cli.main(argv))
                except SystemExit as stop:
                    codes.append(stop.code)
            errors.append(err.getvalue())
        after_cli = loaded()
        numpyro_dgp.fit
        print(json.dumps({"after_import": after_import, "after_cli": after_cli, "codes": codes,
                          "errors": errors, "after_fit": loaded()}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMPYRO_DGP_DATA"}
    out = json.loads(subprocess.run([sys.executable, "-c", code, str(tmp_path / "uci")], capture_output=True,
                                    text=True, check=True, env=env).stdout.strip().splitlines()[-1])
    assert out["after_import"] == [] and out["after_cli"] == [], out
    assert out["codes"][:7] == [0, 0, 2, 2, 2, 2, 2], out
    assert "no data directory given" in out["errors"][4]
    assert "nowhere" in out["errors"][5] and "is not an existing directory" in out["errors"][5]
    assert "'nosuch' not found" in out["errors"][6] and "tiny" in out["errors"][6]  # lists what is there
    assert out["codes"][7] == "--splits: tiny has splits 0..1; got [5]", out
    assert out["codes"][8:] == [2, 2, 2, 2], out  # fit: no table, no such target, labels not 0/1; predict: no table
    assert "none.csv" in out["errors"][8] and "does not exist" in out["errors"][8]
    assert "'z'" in out["errors"][9]
    assert "0s and 1s" in out["errors"][10]
    assert "none.csv" in out["errors"][11] and "does not exist" in out["errors"][11]
    assert out["after_fit"] == ["jax", "jaxlib", "numpyro"], out


def test_public_names_load_their_defining_module_s_objects():
    from numpyro_dgp import infer, objectives
    from numpyro_dgp._predict import prediction as _prediction

    assert numpyro_dgp.fit is infer.fit and numpyro_dgp.DGPElbo is objectives.DGPElbo
    assert numpyro_dgp.predict is _prediction.predict
    assert set(numpyro_dgp.__all__) <= set(dir(numpyro_dgp))


def test_lazy_submodules_load_on_first_use():
    code = "import numpyro_dgp as dgp; print(dgp.diagnostics.__name__, dgp.plots.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["numpyro_dgp.diagnostics", "numpyro_dgp.plots"]
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        numpyro_dgp.nonexistent  # noqa: B018


def test_the_package_declares_its_types_and_one_version():
    # PEP 561 marker beside the package; the version saved files record is the distribution's
    from importlib.metadata import version
    from pathlib import Path

    assert (Path(numpyro_dgp.__file__).parent / "py.typed").is_file()
    assert numpyro_dgp.__version__ == version("numpyro-dgp")
