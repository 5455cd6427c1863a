"""The minibatch draw of a training step alone: ``lax.top_k`` of all the uniforms against
``fast_subsample``'s draw, which runs ``top_k`` on the candidates above a threshold.

``numpyro_dgp.handlers.fast_subsample`` (applied by ``DGPElbo``) draws a plate's ``B`` indices
as the positions of the ``B`` largest of ``N`` float32 uniforms. At small M that ``top_k`` was
the largest single operation of the step (0.3-0.4 ms for 1,000 of 10,000 on a 2-core CPU,
``profile_step.py --num-inducing 50 --hidden-width 1``); since 2026-12-01 it runs on the
``B + 6 sqrt(B)`` or so largest uniforms (gathered by a binary search in their running count),
with the full ``top_k`` only when the candidates miss that window. Both draws give the same
indices in the same order; this script checks that on every timed key and times both, each
compiled alone (the uniforms drawn inside, as in the step), in one process, alternating over
``--rounds`` rounds of ``--calls`` calls (medians).

With ``--steps PRECISION:M:WIDTH ...``, the same two draws inside the training step, at points of
``scale.py``'s grid (N = 10,000 synthetic points, D = 8, batch 1000, two layers,
``AutoFactorizedDGP`` + ``DGPElbo``, Adam), in a fresh process per point: the library's step
and the same step with the plain ``top_k`` draw patched in, each compiled as ``fit`` compiles
it (a ``lax.scan`` of 20 steps), from the same initial state, timed alternately
(``--step-rounds`` rounds of 5 chunks; the ratio is the median of the per-round ratios), and
whether their losses over the first chunk are identical. With ``--with-gpflux PYTHON``,
GPflux's step at each point right after (``peers/gpflux_scale.py``).

Usage::

    python benchmarks/subsample_draw.py --sizes 7373:1000 10000:1000 100000:1000 \
        --steps float32:50:1 float32:100:8 float64:50:1 --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python \
        --tag subsample_draw

writes ``benchmarks/results/<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _harness import base_record, header, run_fresh, table, write_results


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


def parse_point(text: str) -> tuple[str, int, int]:
    """``"PRECISION:M:WIDTH"`` as ``(precision, M, width)``.

    :raises argparse.ArgumentTypeError: naming ``--steps`` and the bad entry.
    """
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("float32", "float64") or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(f"--steps takes PRECISION:M:WIDTH entries (float32 or float64); got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def draws(size: int, batch: int):
    """``{"top_k": ..., "fast_subsample": ...}``: the two draws compiled, each from a key."""
    import jax
    import jax.numpy as jnp

    from numpyro_dgp.handlers._training import _top_k_subsample

    def full(key):
        return jax.lax.top_k(jax.random.uniform(key, (size,), jnp.float32), batch)[1]

    return {"top_k": jax.jit(full), "fast_subsample": jax.jit(lambda key: _top_k_subsample(size, batch, key))}


def measure(size: int, batch: int, rounds: int, calls: int) -> dict:
    """Microseconds per call of each draw (medians over rounds), and whether every call's
    indices agreed."""
    import jax
    import numpy as np

    compiled = draws(size, batch)
    keys = list(jax.random.split(jax.random.PRNGKey(size), calls))  # sliced before the clock starts
    same = True
    times: dict[str, list[float]] = {name: [] for name in compiled}
    for r in range(rounds):
        outputs = {}
        for name in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
            fn = compiled[name]
            jax.block_until_ready(fn(keys[0]))
            start = time.perf_counter()
            outputs[name] = [fn(key) for key in keys]
            jax.block_until_ready(outputs[name])
            times[name].append((time.perf_counter() - start) / calls * 1e6)
        same &= all(np.array_equal(a, b) for a, b in zip(outputs["top_k"], outputs["fast_subsample"]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"N": size, "B": batch, "us": medians, "ratio": medians["fast_subsample"] / medians["top_k"],
            "same_indices": bool(same)}


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
import numpyro_dgp.handlers._training as training
import scale

X, y = scale.synthetic(10_000, np.float32 if precision == "float32" else np.float64, dim=8)
X, y = jnp.asarray(X), jnp.asarray(y)
library = training._top_k_subsample

def plain(size, subsample_size, rng_key=None):
    uniforms = jax.random.uniform(rng_key, (size,), jnp.float32)
    return jax.lax.top_k(uniforms, subsample_size)[1].astype(jnp.arange(0).dtype)

def compiled(draw):
    training._top_k_subsample = draw  # what fast_subsample's plates call, read when traced
    model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
    def chunk(s):
        return jax.lax.scan(lambda s, _: svi.update(s, X, y, batch_size=1000), s, None, length=20)
    program = jax.jit(chunk).lower(state).compile()
    training._top_k_subsample = library
    return program, state

programs = {"fast_subsample": compiled(library), "top_k": compiled(plain)}
losses = {name: np.asarray(program(state)[1]) for name, (program, state) in programs.items()}
states = {name: state for name, (_, state) in programs.items()}
times = {name: [] for name in programs}
for r in range(rounds):
    for name in (list(programs) if r % 2 == 0 else list(programs)[::-1]):
        program = programs[name][0]
        jax.block_until_ready(program(states[name]))
        start = time.perf_counter()
        for _ in range(5):
            states[name], loss = program(states[name])
        jax.block_until_ready(loss)
        times[name].append((time.perf_counter() - start) / 100 * 1e3)
ratios = [a / b for a, b in zip(times["fast_subsample"], times["top_k"])]
print(json.dumps({"precision": precision, "M": M, "width": width,
                  "ms": {name: statistics.median(t) for name, t in times.items()},
                  "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                  "same_losses": bool(np.array_equal(losses["fast_subsample"], losses["top_k"]))}))
"""


def measure_step(precision: str, M: int, width: int, rounds: int) -> dict:
    """Both draws inside the step at one point, in a fresh process (see the module's docstring)."""
    from pathlib import Path

    return run_fresh(_STEP_CHILD, precision, str(M), str(width), str(rounds), str(Path(__file__).parent),
                     what=f"step {precision} M={M} width={width}", timeout=3600)


def step_markdown(record: dict) -> list[str]:
    rows = []
    for p in record["step_points"]:
        g = p.get("gpflux_ms")
        rows.append([p["precision"], p["M"], p["width"], f"{p['ms']['top_k']:.2f}", f"{p['ms']['fast_subsample']:.2f}",
                     f"{p['ratio']:.3f} ({p['ratio_range'][0]:.3f}-{p['ratio_range'][1]:.3f})",
                     "yes" if p["same_losses"] else "**no**", "-" if g is None else f"{g:.2f}",
                     "-" if g is None else f"{g / p['ms']['top_k']:.2f} / {g / p['ms']['fast_subsample']:.2f}"])
    return ["", f"Inside the training step (N = 10,000, D = 8, batch 1000; `fit`'s chunks of 20 steps, "
            f"{record['step_rounds']} rounds of 5 chunks, the two programs alternating; the ratio is the median "
            "of the per-round ratios, with their range; same losses: the first chunk's 20 losses bit-identical):", "",
            *table(["precision", "M", "width", "top_k ms/step", "fast_subsample ms/step", "fast / top_k (range)",
                    "same losses", "GPflux ms/step", "GPflux / ours, top_k / fast_subsample"], rows)]


def markdown(record: dict) -> str:
    rows = [[p["N"], p["B"], f"{p['us']['top_k']:.1f}", f"{p['us']['fast_subsample']:.1f}", f"{p['ratio']:.2f}",
             "yes" if p["same_indices"] else "**no**"] for p in record["points"]]
    lines = header("The minibatch draw alone: top_k of all uniforms against fast_subsample's", record["command"],
                   record["machine"], record["date"])
    lines += ["", f"Each draw compiled alone (the float32 uniforms drawn inside), {record['calls']} calls a round "
              f"on as many keys, {record['rounds']} rounds alternating; medians. Same indices: every call of "
              "both draws gave the same indices in the same order.", "",
              *table(["N", "B", "top_k us", "fast_subsample us", "fast / top_k", "same indices"], rows)]
    if record.get("step_points"):
        lines += step_markdown(record)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(7373, 1000), (10000, 1000), (100000, 1000)])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--steps", type=parse_point, nargs="*", default=[])
    parser.add_argument("--step-rounds", type=int, default=8)
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None,
                        help="GPflux's venv python (benchmarks/peers/setup.sh): its step at each --steps point")
    parser.add_argument("--tag", default="subsample_draw")
    args = parser.parse_args(argv)
    record = {**base_record("subsample_draw.py", argv), "rounds": args.rounds, "calls": args.calls,
              "points": [measure(n, b, args.rounds, args.calls) for n, b in args.sizes],
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
