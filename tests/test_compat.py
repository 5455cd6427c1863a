"""The NumPyro and JAX internals ``numpyro_dgp._compat`` relies on: fail loudly if a release changes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import seed, trace
from numpyro.primitives import Messenger

from numpyro_dgp import _compat


def test_handler_stack_and_active_plates():
    seen = {}

    def model():
        seen["empty_inside"] = _compat.handler_stack_is_empty()
        seen["outside_plate"] = [p.name for p in _compat.active_plates()]
        with numpyro.plate("outer", 3):
            with numpyro.plate("inner", 2, dim=-2):
                seen["inside"] = [p.name for p in _compat.active_plates()]

    assert _compat.handler_stack_is_empty()
    seed(model, 0)()
    assert seen == {"empty_inside": False, "outside_plate": [], "inside": ["outer", "inner"]}


def test_plate_subsample_messages_use_the_replaced_function():
    assert callable(_compat.numpyro_subsample_fn)

    def model():
        with numpyro.plate("data", 10, subsample_size=3):
            pass

    fns = []

    class spy(Messenger):
        def process_message(self, msg):
            if msg["type"] == "plate":
                fns.append(msg["fn"])

    seed(spy(model), 0)()
    assert fns and all(fn is _compat.numpyro_subsample_fn for fn in fns)


def test_lazy_param_initializer_is_the_callable_init_value():
    init = lambda key: jnp.ones(3)  # noqa: E731
    found = []

    class spy(Messenger):
        def process_message(self, msg):
            if msg["type"] == "param":
                found.append(_compat.lazy_param_initializer(msg))

    def model():
        numpyro.param("a", init)
        numpyro.param("b", jnp.zeros(2))

    seed(spy(model), 0)()
    assert found[0] is init and found[1] is None


def test_apply_stack_carries_messages_of_any_type():
    class answer(Messenger):
        def process_message(self, msg):
            if msg["type"] == "custom":
                msg["value"] = 42

    def model():
        msg = {"type": "custom", "name": "x", "fn": lambda: 0, "args": (), "kwargs": {}, "value": None,
               "scale": None, "is_observed": False, "intermediates": [], "cond_indep_stack": [], "infer": {}}
        return _compat.apply_stack(msg)["value"]

    assert seed(answer(model), 0)() == 42
    assert seed(model, 0)() == 0  # unhandled: its fn gives the value
    tr = trace(seed(answer(model), 0)).get_trace()
    assert tr["x"]["type"] == "custom"


def test_is_tracer():
    assert not _compat.is_tracer(jnp.ones(2))
    assert jax.jit(lambda x: jnp.asarray(_compat.is_tracer(x)))(jnp.ones(2))
    assert not _compat.is_tracer(dist.Normal(0.0, 1.0))


def test_innermost_trace_records_the_run_in_progress():
    seen = {}

    def model():
        seen["before"] = dict(_compat.innermost_trace())
        numpyro.sample("a", dist.Normal(0.0, 1.0))
        seen["after"] = list(_compat.innermost_trace())
        with trace() as inner:
            numpyro.sample("b", dist.Normal(0.0, 1.0))
            seen["inner"] = list(_compat.innermost_trace())
        seen["inner_is_innermost"] = inner is not None

    assert _compat.innermost_trace() is None
    trace(seed(model, 0)).get_trace()
    assert seen == {"before": {}, "after": ["a"], "inner": ["b"], "inner_is_innermost": True}
    seen.clear()
    seed(lambda: seen.setdefault("none", _compat.innermost_trace()), 0)()
    assert seen["none"] is None


def test_softplus_lower_cholesky_is_numpyros_constraint_with_our_transform():
    from numpyro.distributions import constraints
    from numpyro.distributions.transforms import SoftplusLowerCholeskyTransform, biject_to

    constraint = _compat.softplus_lower_cholesky
    assert isinstance(constraint, type(constraints.softplus_lower_cholesky))
    transform = biject_to(constraint)
    assert isinstance(transform, SoftplusLowerCholeskyTransform)
    assert type(transform) is not SoftplusLowerCholeskyTransform
    # NumPyro's own constraint keeps NumPyro's transform
    assert type(biject_to(constraints.softplus_lower_cholesky)) is SoftplusLowerCholeskyTransform
    assert bool(constraint(jnp.array([[1.0, 0.0], [0.5, 2.0]])))


