"""The training step's matrix products alone: how fast the step can be while it computes them.

At points of ``scale.py``'s grid (N = 10,000 synthetic points with D inputs, batch 1000, two
layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam), in a fresh process per point:

* **step**: the compiled training step (``jit(svi.update)``), ms per step;
* **products alone**: every ``dot`` of the compiled step's optimized HLO (inside fusions too:
  each matrix product the step runs) on random operands of the same shapes, dtype and dimension
  numbers, and nothing else, timed two ways: all of them in one compiled program (XLA may run
  independent ones side by side, as in the step), and each distinct one compiled alone and
  repeated on the same operands (warm in the cache, as a fusion's fresh output can be in the
  step), summed with its count. The smaller of the two, with its GFLOP and GFLOP/s, is the time
  the step's products take at the speed XLA runs them: the step runs them and more, so it takes
  at least about that long (a lower bound on the step *with these products*, up to how XLA
  schedules them beside the rest);
* **floor at the products' speed**: the math's minimum of FLOPs (``scale.step_flops``, the grid's
  floor) at the speed those products ran: what a step would take that did no more products than
  the math needs, at the speed XLA reaches on products of these shapes, with nothing else;
* the 2000^3 product's speed in the same process (``scale.matmul_peak``, the grid's peak);
* with ``--with-gpflux``, GPflux's step right after (``peers/gpflux_scale.py``, the grid's peer).

The step and the one-program replay are timed in alternation (``--rounds`` rounds of 10 steps
and 10 replays; medians). The table says, for issue 38's targets, whether the products alone already
take longer than twice GPflux's speed allows (``GPflux / 2``) and than 50% of the peak allows
(``floor / (peak / 2)``).

Usage::

    python benchmarks/product_bound.py --precisions float32 --dims 8 --m 100 500 --widths 1 8 32 \\
        --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag product_bound

writes ``benchmarks/results/<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from _harness import command, header, machine, now, run_fresh, table, write_results


class Product(NamedTuple):
    """One ``dot`` of an optimized HLO module: operand dtype and shapes, dimension numbers as
    ``lax.dot_general`` takes them."""

    dtype: str
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    contracting: tuple[tuple[int, ...], tuple[int, ...]]
    batch: tuple[tuple[int, ...], tuple[int, ...]]


_SHAPE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]", flags=re.M)
_DOT = re.compile(r"= \w+\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)")


def hlo_products(hlo: str) -> list[Product]:
    """Every ``dot`` instruction of an optimized HLO module's text."""
    shapes = hlo_shapes(hlo)
    return [p for p in (line_product(line, shapes) for line in hlo.splitlines()) if p is not None]


def hlo_shapes(hlo: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each instruction's dtype and shape by name (names are unique in an HLO module)."""
    return {name: (dtype, tuple(int(d) for d in dims.split(",") if d)) for name, dtype, dims in _SHAPE.findall(hlo)}


def line_product(line: str, shapes: dict) -> Product | None:
    """The ``dot`` of one line of HLO text (its operands' shapes from :func:`hlo_shapes`), or
    None for any other instruction."""
    m = _DOT.search(line)
    if m is None:
        return None
    (dtype, lhs), (_, rhs) = shapes[m.group(1)], shapes[m.group(2)]
    dims = {key: _dims(line, key) for key in ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")}
    return Product(dtype, lhs, rhs, (dims["lhs_contracting"], dims["rhs_contracting"]),
                   (dims["lhs_batch"], dims["rhs_batch"]))


def _dims(line: str, key: str) -> tuple[int, ...]:
    m = re.search(key + r"_dims=\{([\d,]*)\}", line)
    return tuple(int(i) for i in m.group(1).split(",") if i) if m else ()


def product_flops(p: Product) -> float:
    """``2 * prod(output) * prod(contracted)``: two FLOPs per multiply-add."""
    (lc, rc), (lb, rb) = p.contracting, p.batch
    free_lhs = [d for i, d in enumerate(p.lhs_shape) if i not in lc and i not in lb]
    free_rhs = [d for i, d in enumerate(p.rhs_shape) if i not in rc and i not in rb]
    batch = [p.lhs_shape[i] for i in lb]
    return 2.0 * math.prod(batch + free_lhs + free_rhs) * math.prod(p.lhs_shape[i] for i in lc)


def replay(products: list[Product], seed: int = 0):
    """A compiled program computing each product on its own operands, and those operands: the
    step's products with nothing else. Every product gets operands of its own (identical
    products on shared operands would be computed once)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)
    operands = [
        jax.numpy.asarray(rng.standard_normal(shape).astype({"f32": np.float32, "f64": np.float64}[p.dtype]))
        for p in products for shape in (p.lhs_shape, p.rhs_shape)
    ]

    @jax.jit
    def run(*arrays):
        return [jax.lax.dot_general(arrays[2 * i], arrays[2 * i + 1], (p.contracting, p.batch))
                for i, p in enumerate(products)]

    return run, operands


_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[6])
M, width, precision, dim, rounds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
import jax
if precision == "float64":
    jax.config.update("jax_enable_x64", True)
import numpy as np, numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp
import product_bound, scale

X, y = scale.synthetic(10_000, np.float32 if precision == "float32" else np.float64, dim=dim)
X, y = jax.numpy.asarray(X), jax.numpy.asarray(y)
model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
step = jax.jit(lambda s: svi.update(s, X, y, batch_size=1000)).lower(state).compile()
products = product_bound.hlo_products(step.as_text())
run, operands = product_bound.replay(products)
jax.block_until_ready(run(*operands))
holder = [state]

def ten_steps():
    for _ in range(10):
        holder[0], loss = step(holder[0])
    return loss

def ten_replays():
    for _ in range(10):
        out = run(*operands)
    return out

jax.block_until_ready(ten_steps())
step_times, replay_times = [], []
for _ in range(rounds):
    for fn, times in ((ten_steps, step_times), (ten_replays, replay_times)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) / 10 * 1e3)
single_ms = product_bound.alone_ms(products)
print(json.dumps({"M": M, "width": width, "precision": precision, "D": dim,
                  "step_ms": float(np.median(step_times)), "replay_ms": float(np.median(replay_times)),
                  "single_ms": single_ms,
                  "products": len(products), "products_gflop": sum(map(product_bound.product_flops, products)) / 1e9,
                  "floor_gflop": scale.step_flops(M, width, dim) / 1e9, "peak_gflops": scale.matmul_peak(precision),
                  "jax": jax.__version__}))
"""


def alone_ms(products: list[Product], repeats: int = 20) -> float:
    """The sum over the distinct products of each one's time alone, times its count: each
    compiled on its own and repeated on the same operands (warm in the cache, as operands a
    fusion has just written can be in the step); the median of 5 rounds of ``repeats``."""
    import collections
    import time

    import jax
    import numpy as np

    total = 0.0
    for p, count in collections.Counter(products).items():
        run, operands = replay([p])
        jax.block_until_ready(run(*operands))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(repeats):
                out = run(*operands)
            jax.block_until_ready(out)
            times.append((time.perf_counter() - t0) / repeats)
        total += count * float(np.median(times)) * 1e3
    return total


def measure(M: int, width: int, precision: str, dim: int, rounds: int) -> dict:
    """Ours at one point in a fresh process (see the module's docstring)."""
    r = run_fresh(_CHILD, str(M), str(width), precision, str(dim), str(rounds), str(Path(__file__).parent),
                  what=f"M={M} width={width} {precision} D={dim}", timeout=1800)
    r["products_ms"] = min(r["replay_ms"], r["single_ms"])
    r["products_gflops"] = r["products_gflop"] / r["products_ms"] * 1e3
    r["floor_at_products_ms"] = r["floor_gflop"] / r["products_gflops"] * 1e3
    r["half_peak_ms"] = r["floor_gflop"] / (r["peak_gflops"] / 2) * 1e3
    return r


def gpflux_ms(python: str, M: int, width: int, precision: str, dim: int, env: dict | None = None) -> float:
    """GPflux's ms per step at the point (``peers/gpflux_scale.py``, 30 steps a block), in ``env``
    (default: this process's environment)."""
    proc = subprocess.run([python, str(Path(__file__).parent / "peers" / "gpflux_scale.py"), "--num-inducing", str(M),
                           "--width", str(width), "--precision", precision, "--dim", str(dim), "--steps", "30"],
                          capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"GPflux M={M} width={width} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ms_per_step"]


def markdown(record: dict) -> str:
    rows = []
    for r in record["points"]:
        g = r.get("gpflux_ms")
        rows.append([r["precision"], r["D"], r["M"], r["width"], f"{r['step_ms']:.1f}", r["products"],
                     f"{r['products_gflop']:.2f}", f"{r['replay_ms']:.1f}", f"{r['single_ms']:.1f}",
                     f"{100 * r['products_ms'] / r['step_ms']:.0f}", f"{r['products_gflops']:.0f}",
                     f"{r['peak_gflops']:.0f}", f"{r['floor_gflop']:.2f}", f"{r['floor_at_products_ms']:.1f}",
                     f"{r['half_peak_ms']:.1f}", "yes" if r["products_ms"] > r["half_peak_ms"] else "no",
                     "-" if g is None else f"{g:.1f}", "-" if g is None else f"{g / r['step_ms']:.2f}",
                     "-" if g is None else ("yes" if r["products_ms"] > g / 2 else "no")])
    lines = header("The training step's matrix products alone", record["command"], record["machine"], record["date"])
    lines += ["", "Each point in a fresh process: the compiled step, and every matrix product of its optimized "
              "program alone (same shapes, dtype, dimension numbers): all in one program, timed in alternation with "
              "the step (medians of the rounds), and each distinct one alone on warm operands, summed; products "
              "alone: the smaller of the two. Floor: the math's minimum FLOPs (`scale.step_flops`); at the products' speed: "
              "those FLOPs at the GFLOP/s the step's products reached; 50% of peak: the time the issue's 50% "
              "roofline allows (floor at half the 2000^3 product's speed). `> 50% time` / `> GPflux / 2`: the "
              "products alone take longer than that time (so the step, which runs them, does too).", "",
              *table(["precision", "D", "M", "width", "step ms", "products", "products GFLOP", "in one program ms", "one by one ms",
                      "products alone, % of step", "products GFLOP/s", "peak GFLOP/s", "floor GFLOP", "floor at products' speed ms",
                      "50% of peak ms", "products > 50% time", "GPflux ms", "GPflux / ours", "products > GPflux / 2"],
                     rows)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", choices=("float32", "float64"), default=["float32"])
    parser.add_argument("--dims", type=int, nargs="+", default=[8])
    parser.add_argument("--m", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--widths", type=int, nargs="+", default=[8])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None, help="GPflux's venv python (peers/setup.sh)")
    parser.add_argument("--tag", default="product_bound")
    args = parser.parse_args(argv)
    record = {"command": command("product_bound.py", argv), "machine": machine(with_jax=False), "date": now(),
              "points": []}
    for precision in args.precisions:
        for dim in args.dims:
            for M in args.m:
                for width in args.widths:
                    r = measure(M, width, precision, dim, args.rounds)
                    if args.with_gpflux:
                        r["gpflux_ms"] = gpflux_ms(args.with_gpflux, M, width, precision, dim)
                    print(json.dumps(r), flush=True)
                    record["points"].append(r)
    paths = write_results(args.tag, record, markdown(record))
    print(markdown(record))
    print("wrote", *paths)


if __name__ == "__main__":
    main(sys.argv[1:])
