"""GPflux peer of ``benchmarks/scale.py --grid``: time per training step of a 2-layer DGP on
synthetic year-like data (N = 10,000, D = 90 or ``--dim``, batch 1000) at one M and inner width; one JSON
line on stdout.

The model is that of ``gpflux_kin8nm.py`` (shared SE-ARD kernel and shared k-means inducing
inputs per layer, whitened full-Cholesky q(u), identity inner mean, Adam 0.01, minibatch drawn
inside a ``tf.function`` step, one sample through the inner layer), with D = 90 inputs; the
inner mean is a fixed linear map to the width (the first W coordinates; ours: a fixed PCA
projection), the same cost.

Run with the venv from setup.sh::

    $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python benchmarks/peers/gpflux_scale.py --num-inducing 100 --width 8
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402


def main(argv=None):
    args = common.parse_scale_args(__doc__.splitlines()[0], argv)
    if args.device != "cpu":
        raise SystemExit(f"gpflux_scale.py: --device {args.device}: this peer runs on the CPU only")
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

    N, D, W, M, B = args.num_data, args.dim, args.width, args.num_inducing, args.batch_size
    X_np, y_np = common.scale_data(N, D, np_dtype)
    X_train, Y_train = tf.constant(X_np, tf_dtype), tf.constant(y_np[:, None], tf_dtype)
    Z = common.kmeans_init(X_np[:B], M, seed=0)
    Z_inner = Z @ np.eye(D, W) if W != D else Z  # the outer layer's inputs: the first W coordinates

    tf.random.set_seed(0)
    k1 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(D)), output_dim=W,
                                share_hyperparams=True)
    z1 = construct_basic_inducing_variables(M, D, W, share_variables=True, z_init=Z.astype(np_dtype))
    mean = gpflow.mean_functions.Linear(A=np.eye(D, W, dtype=np_dtype)) if W != D else gpflow.mean_functions.Identity()
    gpflow.set_trainable(mean, False)  # fixed, as our inner mean (a fixed projection when W != D)
    inner = GPLayer(k1, z1, N, mean_function=mean, num_samples=None, name="inner", verbose=False)
    inner.q_sqrt.assign(inner.q_sqrt.numpy() * common.INNER_Q_SQRT_SCALE)
    k2 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(W)), output_dim=1,
                                share_hyperparams=True)
    z2 = construct_basic_inducing_variables(M, W, 1, share_variables=True, z_init=Z_inner.astype(np_dtype))
    outer = GPLayer(k2, z2, N, mean_function=gpflow.mean_functions.Zero(), num_samples=None, name="outer",
                    verbose=False)
    model = DeepGP([inner, outer], LikelihoodLayer(gpflow.likelihoods.Gaussian(variance=common.NOISE_INIT)),
                   num_data=N)
    opt = tf_keras.optimizers.Adam(common.LEARNING_RATE)
    variables = model.trainable_variables

    @tf.function
    def step():
        idx = tf.random.shuffle(tf.range(N))[:B]
        xb, yb = tf.gather(X_train, idx), tf.gather(Y_train, idx)
        with tf.GradientTape() as tape:
            loss = -model.elbo((xb, yb)) / N
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    t0 = time.perf_counter()
    step().numpy()
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        loss = step()
    loss.numpy()
    blocks = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.numpy()
        blocks.append(time.perf_counter() - t0)
    print(json.dumps({"library": "gpflux", "version": f"gpflux {gpflux.__version__}, tensorflow {tf.__version__}",
                      "N": N, "D": D, "M": M, "width": W, "batch_size": B, "precision": args.precision,
                      "ms_per_step": 1e3 * float(np.median(blocks)) / args.steps, "compile_seconds": compile_s,
                      "finite": bool(np.isfinite(float(loss)))}))


if __name__ == "__main__":
    main()
