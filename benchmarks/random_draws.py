"""The random draws of a training step: each alone, and inside the step, against JAX's plain
formulation.

Two draws of every DSVI step changed on 2026-12-01 (``benchmarks/topics/scale.md``, items 20 and
21), each giving the values it gave before:

* **the minibatch** (``handlers.fast_subsample``, applied by ``DGPElbo``): the positions of the
  ``B`` largest of ``N`` float32 uniforms, once one ``lax.top_k`` of all of them, now ``top_k``
  of the ``B + 6 sqrt(B)`` or so largest (gathered by a binary search in their running count;
  the full ``top_k`` when the candidates miss that window): the same indices in the same order;
* **a layer's Monte Carlo draw** (``core.standard_normal``): ``jax.random.normal`` of the
  ``(N, P)`` shape, now drawn as one vector and reshaped: the same random bits (JAX's threefry
  counts the draws by their flattened position), the normals equal up to the transform's last
  bit.

Alone (``--sizes N:B`` for the minibatch, ``--normals NxP`` for the layer draw): each draw
compiled on its own, in one process, both formulations alternating over ``--rounds`` rounds of
``--calls`` calls on as many keys (medians), the results compared at every call.

Inside the step (``--steps PRECISION:M:WIDTH``, at points of ``scale.py``'s grid: N = 10,000
synthetic points, D = 8, batch 1000, two layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam), in a
fresh process per point: three programs compiled as ``fit`` compiles its chunk (a ``lax.scan``
of 20 steps) from the same initial state -- ``plain`` (one ``top_k``, the 2-D normal draw:
the package before both changes), ``subsample`` (the new minibatch draw only) and ``library``
(the package as it is) -- timed alternately over ``--step-rounds`` rounds of 5 chunks (ratios:
medians of the per-round ratios to ``plain``), with the largest relative difference of their
first chunk's 20 losses from ``plain``'s. With ``--with-gpflux PYTHON``, GPflux's step at each
point right after (``peers/gpflux_scale.py``).

Usage::

    python benchmarks/random_draws.py --sizes 7373:1000 10000:1000 100000:1000 --normals 1000x8 1000x32 \\
        --steps float32:50:8 float32:100:8 float64:100:8 --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python \\
        --tag random_draws

writes ``benchmarks/results/<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _harness import base_record, header, run_fresh, table, write_results

VARIANTS = ("plain", "subsample", "library")


def parse_size(text: str) -> tuple[int, int]:
    """``"N:B"`` as ``(N, B)`` with ``0 < B <= N``.

    :raises argparse.ArgumentTypeError: naming ``--sizes`` and the bad entry.
    """
    try:
        size, batch = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes N:B entries; got {text!r}") from None
    if not 0 < batch <= size:
        raise argparse.ArgumentTypeError(f"--sizes needs 0 < B <= N; got {text!r}")
    return size, batch


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1000x8"`` as ``(1000, 8)``.

    :raises argparse.ArgumentTypeError: naming ``--normals`` and the bad entry.
    """
    parts = text.split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--normals takes shapes such as 1000x8; got {text!r}")
    return tuple(int(p) for p in parts)


def parse_point(text: str) -> tuple[str, int, int]:
    """``"PRECISION:M:WIDTH"`` as ``(precision, M, width)``.

    :raises argparse.ArgumentTypeError: naming ``--steps`` and the bad entry.
    """
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("float32", "float64") or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(f"--steps takes PRECISION:M:WIDTH entries (float32 or float64); got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def _alternate(compiled: dict, keys: list, rounds: int) -> tuple[dict, list[dict]]:
    """Microseconds per call of each compiled draw (medians over rounds, the order alternating)
    and every round's outputs by name."""
    import jax

    times: dict[str, list[float]] = {name: [] for name in compiled}
    outputs = []
    for r in range(rounds):
        out = {}
        for name in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
            fn = compiled[name]
            jax.block_until_ready(fn(keys[0]))
            start = time.perf_counter()
            out[name] = [fn(key) for key in keys]
            jax.block_until_ready(out[name])
            times[name].append((time.perf_counter() - start) / len(keys) * 1e6)
        outputs.append(out)
    return {name: statistics.median(t) for name, t in times.items()}, outputs


def _keys(seed: int, calls: int) -> list:
    import jax

    return list(jax.random.split(jax.random.PRNGKey(seed), calls))  # sliced before the clock starts


def measure_subsample(size: int, batch: int, rounds: int, calls: int) -> dict:
    """The minibatch draw: one ``top_k`` against the library's, and whether every call's indices
    agreed."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from numpyro_dgp.handlers._training import _top_k_subsample

    compiled = {
        "plain": jax.jit(lambda key: jax.lax.top_k(jax.random.uniform(key, (size,), jnp.float32), batch)[1]),
        "library": jax.jit(lambda key: _top_k_subsample(size, batch, key)),
    }
    us, outputs = _alternate(compiled, _keys(size, calls), rounds)
    same = all(np.array_equal(a, b) for out in outputs for a, b in zip(out["plain"], out["library"]))
    return {"N": size, "B": batch, "us": us, "ratio": us["library"] / us["plain"], "same": bool(same)}


def measure_normal(shape: tuple[int, ...], rounds: int, calls: int) -> dict:
    """The layer draw (float32): ``jax.random.normal`` of ``shape`` against
    ``core.standard_normal``, and the largest difference in units of the last place."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from numpyro_dgp.core import standard_normal

    compiled = {"plain": jax.jit(lambda key: jax.random.normal(key, shape, jnp.float32)),
                "library": jax.jit(lambda key: standard_normal(key, shape, jnp.float32))}
    us, outputs = _alternate(compiled, _keys(len(shape), calls), rounds)
    ulps = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.spacing(np.abs(np.asarray(a)))))
               for out in outputs for a, b in zip(out["plain"], out["library"]))
    return {"shape": list(shape), "us": us, "ratio": us["library"] / us["plain"], "max_ulps": ulps}


_STEP_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[5])
precision, M, width, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import jax
if precision == "float64":
    jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp
import numpyro_dgp._engine.marginal as marginal
import numpyro_dgp.handlers._training as training
import numpyro_dgp.layers as layers
import scale

X, y = scale.synthetic(10_000, np.float32 if precision == "float32" else np.float64, dim=8)
X, y = jnp.asarray(X), jnp.asarray(y)
library = {"subsample": training._top_k_subsample, "normal": layers.standard_normal}

def top_k_draw(size, subsample_size, rng_key=None):
    uniforms = jax.random.uniform(rng_key, (size,), jnp.float32)
    return jax.lax.top_k(uniforms, subsample_size)[1].astype(jnp.arange(0).dtype)

def use(subsample, normal):  # the functions the step's plates and layer draws call when traced
    training._top_k_subsample = subsample
    layers.standard_normal = marginal.standard_normal = normal

def compiled(subsample, normal):
    use(subsample, normal)
    model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
    def chunk(s):
        return jax.lax.scan(lambda s, _: svi.update(s, X, y, batch_size=1000), s, None, length=20)
    program = jax.jit(chunk).lower(state).compile()
    use(library["subsample"], library["normal"])
    return program, state

programs = {"plain": compiled(top_k_draw, jax.random.normal),
            "subsample": compiled(library["subsample"], jax.random.normal),
            "library": compiled(library["subsample"], library["normal"])}
losses = {name: np.asarray(program(state)[1]) for name, (program, state) in programs.items()}
states = {name: state for name, (_, state) in programs.items()}
times = {name: [] for name in programs}
order = list(programs)
for r in range(rounds):
    for name in (order if r % 2 == 0 else order[::-1]):
        program = programs[name][0]
        jax.block_until_ready(program(states[name]))
        start = time.perf_counter()
        for _ in range(5):
            states[name], loss = program(states[name])
        jax.block_until_ready(loss)
        times[name].append((time.perf_counter() - start) / 100 * 1e3)
ratios = {name: [a / b for a, b in zip(times[name], times["plain"])] for name in programs}
print(json.dumps({"precision": precision, "M": M, "width": width,
                  "ms": {name: statistics.median(t) for name, t in times.items()},
                  "ratio": {name: statistics.median(r) for name, r in ratios.items()},
                  "ratio_range": {name: [min(r), max(r)] for name, r in ratios.items()},
                  "loss_rel_diff": {name: float(np.max(np.abs(losses[name] - losses["plain"]) / np.abs(losses["plain"])))
                                    for name in programs}}))
"""


def measure_step(precision: str, M: int, width: int, rounds: int) -> dict:
    """The three programs at one point, in a fresh process (see the module's docstring)."""
    return run_fresh(_STEP_CHILD, precision, str(M), str(width), str(rounds), str(Path(__file__).parent),
                     what=f"step {precision} M={M} width={width}", timeout=3600)


def step_markdown(record: dict) -> list[str]:
    rows = []
    for p in record["step_points"]:
        g = p.get("gpflux_ms")
        cells = [p["precision"], p["M"], p["width"], *(f"{p['ms'][v]:.2f}" for v in VARIANTS)]
        for v in VARIANTS[1:]:
            low, high = p["ratio_range"][v]
            cells += [f"{p['ratio'][v]:.3f} ({low:.3f}-{high:.3f})", f"{p['loss_rel_diff'][v]:.1e}"]
        cells += ["-" if g is None else f"{g:.2f}",
                  "-" if g is None else f"{g / p['ms']['plain']:.2f} / {g / p['ms']['library']:.2f}"]
        rows.append(cells)
    return ["", f"Inside the training step (N = 10,000, D = 8, batch 1000; `fit`'s chunks of 20 steps, "
            f"{record['step_rounds']} rounds of 5 chunks, the three programs alternating; ratios to `plain`: the "
            "median of the per-round ratios, with their range; loss difference: the largest relative difference "
            "of the first chunk's 20 losses from `plain`'s):", "",
            *table(["precision", "M", "width", "plain ms/step", "subsample ms/step", "library ms/step",
                    "subsample / plain", "its loss difference", "library / plain", "its loss difference",
                    "GPflux ms/step", "GPflux / ours, plain / library"], rows)]


def markdown(record: dict) -> str:
    lines = header("The random draws of a training step, alone and inside the step", record["command"],
                   record["machine"], record["date"])
    lines += ["", f"Alone: each draw compiled on its own, {record['calls']} calls a round on as many keys, "
              f"{record['rounds']} rounds alternating; medians.", ""]
    if record["points"]:
        lines += ["The minibatch: `plain` one `top_k` of N float32 uniforms, `library` `fast_subsample`'s draw; "
                  "same: every call gave the same indices in the same order.", "",
                  *table(["N", "B", "plain us", "library us", "library / plain", "same"],
                         [[p["N"], p["B"], f"{p['us']['plain']:.1f}", f"{p['us']['library']:.1f}", f"{p['ratio']:.2f}",
                           "yes" if p["same"] else "**no**"] for p in record["points"]]), ""]
    if record["normal_points"]:
        lines += ["A layer's draw (float32): `plain` `jax.random.normal` of the shape, `library` "
                  "`core.standard_normal`; the largest difference in units of the last place over every call.", "",
                  *table(["shape", "plain us", "library us", "library / plain", "max ulps"],
                         [["x".join(map(str, p["shape"])), f"{p['us']['plain']:.1f}", f"{p['us']['library']:.1f}",
                           f"{p['ratio']:.2f}", f"{p['max_ulps']:.0f}"] for p in record["normal_points"]])]
    if record.get("step_points"):
        lines += step_markdown(record)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_size, nargs="*", default=[(7373, 1000), (10000, 1000), (100000, 1000)])
    parser.add_argument("--normals", type=parse_shape, nargs="*", default=[(1000, 8), (1000, 32)])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--steps", type=parse_point, nargs="*", default=[])
    parser.add_argument("--step-rounds", type=int, default=8)
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None,
                        help="GPflux's venv python (benchmarks/peers/setup.sh): its step at each --steps point")
    parser.add_argument("--tag", default="random_draws")
    args = parser.parse_args(argv)
    record = {**base_record("random_draws.py", argv), "rounds": args.rounds, "calls": args.calls,
              "points": [measure_subsample(n, b, args.rounds, args.calls) for n, b in args.sizes],
              "normal_points": [measure_normal(s, args.rounds, args.calls) for s in args.normals],
              "step_rounds": args.step_rounds, "step_points": []}
    for precision, M, width in args.steps:
        point = measure_step(precision, M, width, args.step_rounds)
        if args.with_gpflux:
            from product_bound import gpflux_ms

            point["gpflux_ms"] = gpflux_ms(args.with_gpflux, M, width, precision, 8)
        record["step_points"].append(point)
        print(point, flush=True)
    text = markdown(record)
    write_results(args.tag, record, text)
    print(text)


if __name__ == "__main__":
    main()
