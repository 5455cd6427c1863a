"""GPflux peer of benchmarks/natural_gradients.py: Adam alone and GPflow's NaturalGradient on the
last layer's q(u) with Adam on the rest, on one UCI split; one JSON line on stdout.

The DSVI DGP of ``gpflux_kin8nm.py`` (2 layers, width D, M = 100 k-means inducing inputs,
whitened q(u), inner q_sqrt = 1e-5 I, identity inner mean, Gaussian noise 0.01, minibatches
of 1,000 drawn without replacement inside a ``tf.function`` step, Adam 0.01), fitted twice
from the same start. The natural-gradient step size rises log-linearly from 1e-4 to
``--gamma`` over ``--ramp`` steps, as ours. Reports each run's loss per step (negative ELBO,
the same scale as ours), the seconds per step (the first step, compilation, excluded) and
the test log-likelihood and RMSE (original units) from 100 draws through the inner layer.

``benchmarks/natural_gradients.py --with-gpflux`` runs it on the same splits. Run alone with
the venv from setup.sh::

    $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python benchmarks/peers/gpflux_natural_gradients.py --dataset kin8nm --split 0
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="kin8nm")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--gamma", type=float, default=0.1)
    parser.add_argument("--ramp", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import tensorflow as tf

    import gpflow
    import gpflux
    from gpflow.keras import tf_keras
    from gpflux.helpers import construct_basic_inducing_variables, construct_basic_kernel
    from gpflux.layers import GPLayer, LikelihoodLayer
    from gpflux.models import DeepGP

    warnings.filterwarnings("ignore")
    gpflow.config.set_default_float(np.float64)
    gpflow.config.set_default_jitter(common.JITTER["float64"])
    tf_keras.backend.set_floatx("float64")
    data = common.load_kin8nm(args.split, args.data_dir, name=args.dataset)
    X_np, y_np = data["X_train"], data["y_train"]
    N, D = X_np.shape
    M, B = common.NUM_INDUCING, min(common.BATCH_SIZE, N)
    X_train, Y_train = tf.constant(X_np), tf.constant(y_np[:, None])
    Z = common.kmeans_init(X_np, M, seed=0)

    def build():
        tf.random.set_seed(args.seed)
        k1 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(D)), output_dim=D,
                                    share_hyperparams=True)
        z1 = construct_basic_inducing_variables(M, D, D, share_variables=True, z_init=Z.copy())
        inner = GPLayer(k1, z1, N, mean_function=gpflow.mean_functions.Identity(), num_samples=None, name="inner",
                        verbose=False)
        inner.q_sqrt.assign(inner.q_sqrt.numpy() * common.INNER_Q_SQRT_SCALE)
        k2 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(D)), output_dim=1,
                                    share_hyperparams=True)
        z2 = construct_basic_inducing_variables(M, D, 1, share_variables=True, z_init=Z.copy())
        outer = GPLayer(k2, z2, N, mean_function=gpflow.mean_functions.Zero(), num_samples=None, name="outer",
                        verbose=False)
        likelihood = gpflow.likelihoods.Gaussian(variance=common.NOISE_INIT)
        model = DeepGP([inner, outer], LikelihoodLayer(likelihood), num_data=N)
        return model, inner, outer, likelihood

    S = common.NUM_TEST_SAMPLES
    X_test = tf.constant(data["X_test"])

    def test_scores(inner, outer, likelihood) -> dict:
        """Test LL and RMSE from S draws through the inner layer (as ``gpflux_kin8nm.py``)."""
        m1, v1 = inner.predict(X_test)
        eps = tf.random.normal(tf.concat([[S], tf.shape(m1)], 0), dtype=tf.float64)
        m2, v2 = outer.predict(tf.reshape(m1[None] + tf.sqrt(v1)[None] * eps, (-1, D)))
        means = tf.reshape(m2[:, 0], (S, -1)).numpy()
        variances = tf.reshape(v2[:, 0], (S, -1)).numpy() + likelihood.variance.numpy()
        return common.mixture_metrics(means, variances, data["y_test"], data["y_std"])

    def batch():
        idx = tf.random.shuffle(tf.range(N))[:B]
        return tf.gather(X_train, idx), tf.gather(Y_train, idx)

    def fit(natural: bool) -> dict:
        model, inner, outer, likelihood = build()
        adam = tf_keras.optimizers.Adam(common.LEARNING_RATE)
        if natural:
            gpflow.set_trainable(outer.q_mu, False)
            gpflow.set_trainable(outer.q_sqrt, False)
        variables = model.trainable_variables
        natgrad = gpflow.optimizers.NaturalGradient(gamma=1.0)
        log_initial, log_final = np.log(1e-4), np.log(args.gamma)
        gamma = tf.Variable(1e-4, dtype=tf.float64)

        @tf.function
        def step():
            xb, yb = batch()

            def loss_fn():
                return -model.elbo((xb, yb))

            if natural:
                natgrad.gamma = gamma
                natgrad.minimize(loss_fn, var_list=[(outer.q_mu, outer.q_sqrt)])
            with tf.GradientTape() as tape:
                loss = loss_fn()
            adam.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        losses = np.empty(args.steps)
        start = time.perf_counter()
        for i in range(args.steps):
            if natural:
                gamma.assign(float(np.exp(log_initial + min(i / args.ramp, 1.0) * (log_final - log_initial))))
            losses[i] = step().numpy()
            if i == 0:
                start = time.perf_counter()
        seconds = (time.perf_counter() - start) / (args.steps - 1)
        common.log(f"gpflux {'natural gradients + Adam' if natural else 'Adam'}: {seconds * 1e3:.1f} ms/step, "
                   f"final loss {losses[-200:].mean():.1f}")
        return {"losses": losses.tolist(), "seconds_per_step": seconds, **test_scores(inner, outer, likelihood)}

    common.emit({"library": "gpflux", "version": f"gpflux {gpflux.__version__}, gpflow {gpflow.__version__}",
                 "dataset": args.dataset, "split": args.split, "adam": fit(False), "natural": fit(True)})


if __name__ == "__main__":
    main()
