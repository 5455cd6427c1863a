"""The restructure's accuracy check: kin8nm split 0, the 2-layer DSVI recipe at 5,000 steps
(``numpyro_dgp.recipes.run_uci``, float64), an old checkout against this one, one fresh process
per run with the checkout's package first on ``PYTHONPATH``, seeds interleaved.

The new package should land within the old one's spread over seeds, and from the same key
near the old one's numbers: the restructure keeps each step's answers to round-off (see
``same_answers.py``), which 5,000 steps of optimization grow but do not turn into a different
fit.

Usage::

    git worktree add /tmp/old 3b76f63
    python benchmarks/restructure_kin8nm.py --before /tmp/old --data-dir ../shared/data/uci

writes ``benchmarks/results/restructure_kin8nm.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _harness import add_data_dir, command, header, machine, now, table, write_results

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpyro_dgp
from numpyro_dgp.recipes import run_uci
r = run_uci("kin8nm", 0, rng_key=jax.random.PRNGKey(int(sys.argv[1])), data_dir=sys.argv[2],
            num_steps=int(sys.argv[3]))
print(json.dumps({**{k: float(v) for k, v in r.metrics.items()}, "package_file": numpyro_dgp.__file__}))
"""


def run(package: Path, seed: int, data_dir: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = str(package)
    out = subprocess.run([sys.executable, "-c", CHILD, str(seed), data_dir, str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["package_file"].startswith(str(package)), result["package_file"]
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(p)
    p.add_argument("--before", type=Path, required=True, help="the old checkout's root")
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=5000)
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("--data-dir (or NUMPYRO_DGP_DATA) is required")
    packages = {"before": args.before.resolve(), "after": ROOT}
    runs = []
    for i, seed in enumerate(args.seeds):
        for which in packages if i % 2 == 0 else list(packages)[::-1]:
            runs.append({"package": which, "seed": seed, **run(packages[which], seed, args.data_dir, args.steps)})
            print(runs[-1], flush=True)
    record = {"command": command("restructure_kin8nm.py", argv), "machine": machine(), "date": now(),
              "packages": {k: str(v) for k, v in packages.items()}, "steps": args.steps, "runs": runs}
    write_results("restructure_kin8nm", record, report(record))


def report(record: dict) -> str:
    rows = [[r["package"], r["seed"], f"{r['log_likelihood']:.6f}", f"{r['rmse']:.6f}", f"{r['crps']:.6f}"]
            for r in record["runs"]]
    spread = []
    for metric in ("log_likelihood", "rmse"):
        old = [r[metric] for r in record["runs"] if r["package"] == "before"]
        new = [r[metric] for r in record["runs"] if r["package"] == "after"]
        same = [abs(a[metric] - b[metric]) for a in record["runs"] if a["package"] == "after"
                for b in record["runs"] if b["package"] == "before" and b["seed"] == a["seed"]]
        spread.append(f"{metric}: old {min(old):.4f} to {max(old):.4f} over seeds, new {min(new):.4f} to "
                      f"{max(new):.4f}; largest difference at the same seed {max(same):.1e}")
    return "\n".join([
        *header("Restructure: kin8nm split 0, DSVI at 5,000 steps, old against new", record["command"],
                record["machine"], record["date"]),
        f"Before: `{record['packages']['before']}`; after: `{record['packages']['after']}`; "
        f"{record['steps']} steps, float64, test metrics in original units.", "",
        *table(["package", "seed", "test LL", "RMSE", "CRPS"], rows), "",
        *[f"- {line}" for line in spread], "",
    ])


if __name__ == "__main__":
    main()
