#!/usr/bin/env bash
# Create (if missing) the two virtualenvs the peer benchmarks run in:
#   ${NUMPYRO_DGP_PEERS_DIR:-$HOME/.cache/numpyro_dgp_peers}/gpflux    GPflux 0.4.5 on TensorFlow 2.21 (CPU)
#   ${NUMPYRO_DGP_PEERS_DIR:-$HOME/.cache/numpyro_dgp_peers}/gpytorch  GPyTorch 1.15.2 on torch 2.13.0+cpu
# Idempotent: a venv whose pinned packages already import at the pinned versions is left
# alone. Prints the two venv pythons at the end (also as PEERS_*_PYTHON=... lines).
#
# Versions are exact and were verified together (2026-11, Python 3.11.7, x86_64 Linux).
# GPflux/GPflow declare a dependency on the `tensorflow` distribution; we install the
# identical CPU-only build `tensorflow-cpu` instead and add gpflow, gpflux,
# tensorflow-probability, tf-keras and check-shapes with --no-deps (then their own
# dependencies explicitly), so `pip check` complains that `tensorflow` is missing: harmless.
# torch is pinned to the +cpu build and installed FIRST; pip must find that wheel (a local
# wheel folder via PIP_FIND_LINKS, or PyTorch's CPU-only index via PIP_EXTRA_INDEX_URL):
# plain `torch` from PyPI pulls several GB of CUDA libraries and is never installed here.
set -euo pipefail

PEERS_DIR="${NUMPYRO_DGP_PEERS_DIR:-$HOME/.cache/numpyro_dgp_peers}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$PEERS_DIR"

# ---- pins --------------------------------------------------------------------------------
TF_PINS=(tensorflow-cpu==2.21.0 numpy==1.26.4 scipy==1.17.1)
GPFLUX_NODEPS=(gpflux==0.4.5 gpflow==2.11.2 tensorflow-probability==0.25.0 tf-keras==2.21.0 check-shapes==1.1.1)
GPFLUX_DEPS=(deprecated==1.3.1 multipledispatch==1.0.0 tabulate==0.10.0 decorator==5.3.1 cloudpickle==3.1.2
             dm-tree==0.1.10 dropstackframe==0.1.1 lark==1.3.1)
# transitive pins of the TF stack (constraints: pin versions, install nothing by themselves)
TF_CONSTRAINTS="absl-py==2.5.1 astunparse==1.6.3 attrs==26.1.0 flatbuffers==25.12.19 gast==0.7.0
google-pasta==0.2.0 grpcio==1.85.1 h5py==3.14.0 keras==3.15.1 libclang==18.1.1 ml_dtypes==0.5.4
namex==0.1.0 opt_einsum==3.4.0 optree==0.20.0 packaging==26.3 protobuf==7.36.2 requests==2.34.2
rich==15.0.0 six==1.17.0 termcolor==3.3.0 typing_extensions==4.16.0 wrapt==2.5.2 Pygments==2.21.0
markdown-it-py==4.3.0 mdurl==0.1.2 certifi==2026.10.18 charset-normalizer==3.5.2 idna==3.20 urllib3==2.8.0"

TORCH_PIN=torch==2.13.0+cpu
GPYTORCH_PINS=(gpytorch==1.15.2 linear-operator==0.6.1 numpy==2.4.6 scipy==1.17.1)
TORCH_CONSTRAINTS="scikit-learn==1.9.1 joblib==1.6.0 threadpoolctl==3.8.0 narwhals==2.29.0 mpmath==1.3.0
sympy==1.14.0 networkx==3.6.1 filelock==4.2.11 fsspec==2026.9.0 Jinja2==3.1.6 MarkupSafe==3.0.4
typing_extensions==4.16.0"

log() { echo "[peers/setup] $*" >&2; }

constraints_file() {  # $1: whitespace-separated pins -> path of a constraints file
    local f
    f="$(mktemp)"
    tr -s ' \n' '\n\n' <<<"$1" | sed '/^$/d' >"$f"
    echo "$f"
}

pins_ok() {  # $1: venv, then name==version ...: true if every package has exactly that version
    local venv="$1"; shift
    [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$@" <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(any(md.version(name) != version for name, version in (a.split("==") for a in sys.argv[1:])))
EOF
}

make_venv() {  # $1: path
    if [ ! -x "$1/bin/python" ]; then
        log "creating venv $1 with $("$PYTHON" --version 2>&1)"
        "$PYTHON" -m venv "$1"
    fi
}

# ---- GPflux ------------------------------------------------------------------------------
GPFLUX_VENV="$PEERS_DIR/gpflux"
gpflux_ok() {
    pins_ok "$GPFLUX_VENV" gpflux==0.4.5 gpflow==2.11.2 tensorflow-cpu==2.21.0 tensorflow-probability==0.25.0 \
        tf-keras==2.21.0 numpy==1.26.4 scipy==1.17.1
}
if gpflux_ok; then
    log "gpflux venv up to date: $GPFLUX_VENV"
else
    make_venv "$GPFLUX_VENV"
    C="$(constraints_file "$TF_CONSTRAINTS")"
    "$GPFLUX_VENV/bin/pip" install -q -c "$C" "${TF_PINS[@]}"
    "$GPFLUX_VENV/bin/pip" install -q --no-deps "${GPFLUX_NODEPS[@]}"
    "$GPFLUX_VENV/bin/pip" install -q -c "$C" "${GPFLUX_DEPS[@]}" "${TF_PINS[@]}"
    rm -f "$C"
    TF_CPP_MIN_LOG_LEVEL=3 "$GPFLUX_VENV/bin/python" -c \
        "import tensorflow as tf, gpflow, gpflux; print('tensorflow', tf.__version__, 'gpflow', gpflow.__version__, 'gpflux', gpflux.__version__)" >&2
    gpflux_ok || { log "gpflux venv: pinned versions not in place"; exit 1; }
fi

# ---- GPyTorch ----------------------------------------------------------------------------
GPYTORCH_VENV="$PEERS_DIR/gpytorch"
gpytorch_ok() {
    pins_ok "$GPYTORCH_VENV" torch==2.13.0+cpu gpytorch==1.15.2 linear_operator==0.6.1 numpy==2.4.6 scipy==1.17.1
}
if gpytorch_ok; then
    log "gpytorch venv up to date: $GPYTORCH_VENV"
else
    make_venv "$GPYTORCH_VENV"
    # torch first, CPU build only; fail rather than fall back to a CUDA build.
    if ! "$GPYTORCH_VENV/bin/pip" install -q "$TORCH_PIN"; then
        log "could not find $TORCH_PIN: point PIP_FIND_LINKS at a folder holding the wheel, or"
        log "PIP_EXTRA_INDEX_URL at PyTorch's CPU-only wheel index, and run again"
        exit 1
    fi
    C="$(constraints_file "$TORCH_CONSTRAINTS")"
    "$GPYTORCH_VENV/bin/pip" install -q -c "$C" "$TORCH_PIN" "${GPYTORCH_PINS[@]}"
    rm -f "$C"
    "$GPYTORCH_VENV/bin/python" -c \
        "import torch, gpytorch; print('torch', torch.__version__, 'gpytorch', gpytorch.__version__)" >&2
    gpytorch_ok || { log "gpytorch venv: pinned versions not in place"; exit 1; }
fi

echo "PEERS_GPFLUX_PYTHON=$GPFLUX_VENV/bin/python"
echo "PEERS_GPYTORCH_PYTHON=$GPYTORCH_VENV/bin/python"
