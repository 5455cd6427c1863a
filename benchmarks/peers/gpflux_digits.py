"""GPflux peer of benchmarks/digits.py: the 2-layer softmax DGP on one split, one JSON line on stdout.

64 inputs -> ``--hidden-width`` -> 10 outputs; M k-means inducing inputs per layer shared by its
outputs, one SE-ARD kernel per layer shared by its outputs, whitened q(u) with a full Cholesky
per output (inner q_sqrt = 1e-5 I), the inner mean a fixed PCA projection (numpy-dgp's
"identity" between widths), a zero last mean, GPflow's ``Softmax(10)`` likelihood (100 Monte
Carlo points), Adam (tf_keras), minibatches drawn without replacement inside a ``tf.function``
step. Prediction: ``--num-samples`` draws of the inner layer, the last layer's marginal per
draw, class probabilities by 100 Monte Carlo draws of it; accuracy, NLL and ECE of the mixture.

Run with the venv from setup.sh (the parent writes the split to ``--data``)::

    $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python benchmarks/peers/gpflux_digits.py --data split.npz
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402


def pca_projection(X: np.ndarray, width: int) -> np.ndarray:
    """``(D, W)``: the leading principal directions (numpyro-dgp's ``mean="identity"`` between widths)."""
    _, _, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    return vt[:width].T


def calibration_error(probs: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    confidence, predicted = probs.max(1), probs.argmax(1)
    index = np.clip(np.floor(confidence * bins).astype(int), 0, bins - 1)
    gap = np.zeros(bins)
    np.add.at(gap, index, (predicted == y).astype(float) - confidence)
    return float(np.abs(gap).sum() / len(y))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--hidden-width", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--num-samples", type=int, default=100)
    parser.add_argument("--precision", choices=("float32", "float64"), default="float64")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import gpflow
    import gpflux
    from gpflow.keras import tf_keras
    from gpflux.helpers import construct_basic_inducing_variables, construct_basic_kernel
    from gpflux.layers import GPLayer, LikelihoodLayer
    from gpflux.models import DeepGP

    warnings.filterwarnings("ignore")
    np_dtype = np.float64 if args.precision == "float64" else np.float32
    gpflow.config.set_default_float(np_dtype)
    gpflow.config.set_default_jitter(common.JITTER[args.precision])
    tf_keras.backend.set_floatx(args.precision)
    tf_dtype = tf.float64 if args.precision == "float64" else tf.float32
    tf.random.set_seed(args.seed)

    data = np.load(args.data)
    X_np, y_np = data["X_train"].astype(np_dtype), data["y_train"].astype(np.int64)
    N, D = X_np.shape
    W, M, B, C = args.hidden_width, args.num_inducing, min(args.batch_size, N), 10
    X_train, Y_train = tf.constant(X_np), tf.constant(y_np[:, None].astype(np_dtype))  # DeepGP takes float targets
    Z1 = common.kmeans_init(X_np, M, seed=0).astype(np_dtype)
    A = pca_projection(X_np, W).astype(np_dtype)
    Z2 = common.kmeans_init(X_np @ A, M, seed=0).astype(np_dtype)

    k1 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(D)), output_dim=W,
                                share_hyperparams=True)
    z1 = construct_basic_inducing_variables(M, D, W, share_variables=True, z_init=Z1)
    mean1 = gpflow.mean_functions.Linear(A=A, b=np.zeros(W, np_dtype))
    gpflow.set_trainable(mean1, False)
    inner = GPLayer(k1, z1, N, mean_function=mean1, num_samples=None, name="inner", verbose=False)
    inner.q_sqrt.assign(inner.q_sqrt.numpy() * common.INNER_Q_SQRT_SCALE)
    k2 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(W)), output_dim=C,
                                share_hyperparams=True)
    z2 = construct_basic_inducing_variables(M, W, C, share_variables=True, z_init=Z2)
    outer = GPLayer(k2, z2, N, mean_function=gpflow.mean_functions.Zero(), num_samples=None, name="outer",
                    verbose=False)
    class Softmax(gpflow.likelihoods.Softmax):
        """GPflow's Softmax for GPflux: its Monte Carlo expectation iterates over its inputs ``X``,
        which GPflux's LikelihoodLayer passes as ``None`` (a placeholder column stands in), and
        it takes integer labels where GPflux's DeepGP insists on float targets (cast here)."""

        def _variational_expectations(self, X, Fmu, Fvar, Y, epsilon=None):
            X = tf.zeros_like(Fmu[..., :1]) if X is None else X
            return super()._variational_expectations(X, Fmu, Fvar, tf.cast(Y, tf.int64), epsilon)

    likelihood = Softmax(C)
    model = DeepGP([inner, outer], LikelihoodLayer(likelihood), num_data=N)
    opt = tf_keras.optimizers.Adam(args.lr)
    variables = model.trainable_variables

    @tf.function
    def step():
        idx = tf.random.shuffle(tf.range(N))[:B]
        xb, yb = tf.gather(X_train, idx), tf.gather(Y_train, idx)
        with tf.GradientTape() as tape:
            loss = -model.elbo((xb, yb)) / N
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    start = time.perf_counter()
    step().numpy()
    compile_s = time.perf_counter() - start
    for _ in range(args.steps - 1):
        loss = step()
    loss.numpy()
    fit_s = time.perf_counter() - start
    common.log(f"gpflux digits seed {args.seed}: {args.steps} steps in {fit_s:.1f} s, loss {float(loss):.4f}")

    S = args.num_samples

    @tf.function
    def class_probabilities(Xt):
        m1, v1 = inner.predict(Xt)  # (N*, W) marginals of the inner layer
        eps = tf.random.normal(tf.concat([[S], tf.shape(m1)], 0), dtype=tf_dtype)
        h = tf.reshape(m1[None] + tf.sqrt(v1)[None] * eps, (-1, W))
        m2, v2 = outer.predict(h)  # (S N*, C)
        f = m2[None] + tf.sqrt(v2)[None] * tf.random.normal(tf.concat([[100], tf.shape(m2)], 0), dtype=tf_dtype)
        probs = tf.reduce_mean(tf.nn.softmax(f, axis=-1), axis=0)  # 100 draws of the last layer
        return tf.reduce_mean(tf.reshape(probs, (S, -1, C)), axis=0)

    probs = class_probabilities(tf.constant(data["X_test"].astype(np_dtype))).numpy()
    y_test = data["y_test"]
    nll = -float(np.mean(np.log(np.maximum(probs[np.arange(len(y_test)), y_test], np.finfo(np_dtype).tiny))))
    common.emit({"library": "gpflux", "version": f"gpflux {gpflux.__version__}, gpflow {gpflow.__version__}",
                 "seed": args.seed, "accuracy": float(np.mean(probs.argmax(1) == y_test)), "nll": nll,
                 "ece": calibration_error(probs, y_test), "seconds_per_step": (fit_s - compile_s) / (args.steps - 1),
                 "compile_seconds": compile_s, "fit_seconds": fit_s})


if __name__ == "__main__":
    main()
