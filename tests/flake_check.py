"""Rerun the stochastic tests over many seeds and report any that fail.

Usage::

    python tests/flake_check.py [--seeds 10] [-n 2] [-- extra pytest args]

Every test marked ``stochastic`` compares random draws against a tolerance derived from its own
Monte Carlo standard error, chosen so that a correct implementation fails with probability below
1e-4. At the written seeds such a test passes by construction; this script checks the tolerances
honestly by running ``pytest -m stochastic --seed-offset K`` for K = 1..seeds (the option, defined
in tests/conftest.py, derives every seed a test uses from (seed, K)). It prints each failing test
with the offsets it failed at and exits nonzero if any failed. ``-n`` is passed to pytest-xdist;
arguments after ``--`` go to pytest unchanged (e.g. a file to check only that file's tests).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _failures(junit_xml: Path) -> tuple[list[str], int]:
    """The failed or errored test ids in a junit XML report, and the number of tests run."""
    root = ET.parse(junit_xml).getroot()
    failed, total = [], 0
    for case in root.iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed, total


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seed offsets 1..SEEDS (default 10)")
    parser.add_argument("-n", dest="workers", default=None, help="pytest-xdist workers (default: none)")
    args = parser.parse_args(argv)

    failed_at: dict[str, list[int]] = defaultdict(list)
    broken_runs = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, args.seeds + 1):
            xml = Path(tmp) / f"seed{k}.xml"
            cmd = [sys.executable, "-m", "pytest", "-m", "stochastic", f"--seed-offset={k}", "-q",
                   "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit2"]
            if args.workers:
                cmd += ["-n", str(args.workers)]
            t0 = time.monotonic()
            proc = subprocess.run(cmd + extra, cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True)
            took = time.monotonic() - t0
            # pytest exit codes: 0 all passed, 1 some failed; anything else is a broken run.
            if proc.returncode not in (0, 1) or not xml.exists():
                broken_runs.append(k)
                print(f"seed offset {k}: pytest exited {proc.returncode} ({took:.0f} s)\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}",
                      flush=True)
                continue
            failed, total = _failures(xml)
            for test in failed:
                failed_at[test].append(k)
            print(f"seed offset {k}: {total - len(failed)}/{total} passed ({took:.0f} s)"
                  + "".join(f"\n  FAILED {t}" for t in failed), flush=True)

    print(f"\n{args.seeds} seed offsets in {time.monotonic() - start:.0f} s")
    if failed_at:
        width = max(len(t) for t in failed_at)
        print(f"{'test'.ljust(width)}  seed offsets failed")
        for test, ks in sorted(failed_at.items()):
            print(f"{test.ljust(width)}  {', '.join(map(str, ks))}")
    else:
        print("no stochastic test failed")
    if broken_runs:
        print(f"pytest did not complete at seed offsets {broken_runs}")
    return 1 if failed_at or broken_runs else 0


if __name__ == "__main__":
    sys.exit(main())
