"""``benchmarks/product_bound.py``: the matrix products read from a compiled program, and their replay."""

import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import product_bound  # noqa: E402
import profile_step  # noqa: E402


def _program(a, b, c, x, y):
    return a @ b, a.T @ c, jnp.einsum("pij,pjk->pik", x, y), jnp.tanh(a).sum()


_ARGS = (np.ones((30, 40), np.float32), np.ones((40, 50), np.float32), np.ones((30, 20), np.float32),
         np.ones((3, 5, 6), np.float32), np.ones((3, 6, 7), np.float32))


def test_the_products_of_a_compiled_program_are_read_with_their_shapes_and_flops():
    hlo = jax.jit(_program).lower(*_ARGS).compile().as_text()
    products = product_bound.hlo_products(hlo)
    assert len(products) == 3 and {p.dtype for p in products} == {"f32"}
    flops = sorted(product_bound.product_flops(p) for p in products)
    assert flops == sorted([2 * 30 * 50 * 40, 2 * 40 * 20 * 30, 2 * 3 * 5 * 7 * 6])
    batched = [p for p in products if p.batch != ((), ())]
    assert len(batched) == 1 and batched[0].lhs_shape[batched[0].batch[0][0]] == 3
    # the same FLOPs as profile_step's own count of the same program
    assert sum(flops) == pytest.approx(sum(profile_step.operation_counts(hlo)["flops"].values()))


def test_the_replay_computes_every_product_with_its_output_shape():
    hlo = jax.jit(_program).lower(*_ARGS).compile().as_text()
    products = product_bound.hlo_products(hlo)
    run, operands = product_bound.replay(products)
    outputs = run(*operands)
    expected = Counter(tuple(o.shape) for o in jax.eval_shape(_program, *_ARGS)[:3])
    assert Counter(tuple(sorted(o.shape)) for o in outputs) == Counter(tuple(sorted(s)) for s in expected)
    # each output is the product of its own operands
    for p, out, lhs, rhs in zip(products, outputs, operands[::2], operands[1::2]):
        np.testing.assert_allclose(out, jax.lax.dot_general(lhs, rhs, (p.contracting, p.batch)), rtol=1e-6)
    # identical products get operands of their own, so XLA cannot compute them once
    twice = product_bound.replay([products[0], products[0]])[1]
    assert not np.array_equal(twice[0], twice[2])
    assert product_bound.alone_ms(products, repeats=1) > 0
