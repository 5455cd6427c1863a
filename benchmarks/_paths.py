"""Where the benchmarks find the UCI data (the library itself has no default data directory).

``--data-dir`` wins; else ``$NUMPYRO_DGP_DATA``; else ``../shared/data/uci`` beside this
repository, where the project's machines keep the standard splits.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_BESIDE_REPO = REPO.parent / "shared" / "data" / "uci"


def default_data_dir() -> str | None:
    """The ``--data-dir`` default: ``$NUMPYRO_DGP_DATA`` or ``../shared/data/uci`` beside the repository."""
    env = os.environ.get("NUMPYRO_DGP_DATA")
    if env:
        return env
    return str(_BESIDE_REPO) if _BESIDE_REPO.is_dir() else None


DATA_DIR_HELP = "folder holding the UCI data sets (default: $NUMPYRO_DGP_DATA, else ../shared/data/uci beside the repository)"


def shown_command(script: str, argv: list[str]) -> str:
    """The command line to record in a result file, the peers' folder written as
    ``$NUMPYRO_DGP_PEERS_DIR`` (``benchmarks/peers/setup.sh``) rather than this machine's path."""
    import shlex

    peers = os.environ.get("NUMPYRO_DGP_PEERS_DIR", str(Path.home() / ".cache" / "numpyro_dgp_peers"))
    line = f"python benchmarks/{script} " + shlex.join(argv)
    return line.replace(peers, "$NUMPYRO_DGP_PEERS_DIR")
