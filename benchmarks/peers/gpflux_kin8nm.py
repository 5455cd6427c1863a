"""GPflux peer benchmark: the kin8nm DGP of benchmarks/speed.py, one JSON line on stdout.

2 layers (8 -> 8 -> 1), M = 100 k-means inducing inputs per layer shared by its outputs
(SharedIndependentInducingVariables), one SE-ARD kernel per layer shared by its outputs
(SharedIndependent), whitened q(u) with a full Cholesky per output, inner q_sqrt = 1e-5 I,
identity inner mean, zero last mean, Gaussian noise 0.01, Adam 0.01 (tf_keras), minibatch
1000 drawn without replacement inside a ``tf.function`` step, 1 sample through the inner
layer, analytic Gaussian expectation at the output (gpflux's LikelihoodLayer).

Run with the venv from setup.sh::

    $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python benchmarks/peers/gpflux_kin8nm.py --precision float64

``--startup`` reports only the start-up marks (seconds from process start: imports, data,
model built, first step finished); ``--until-ll LL`` trains on split 0 less a held-back
validation part until the validation LL reaches ``LL`` (checked every ``--check-every`` steps)
and reports the wall clock from process start (both used by ``benchmarks/startup.py``).
"""

from __future__ import annotations

import time

_ENTRY = (time.time(), time.perf_counter())  # the script's first statement: start-up marks begin here

import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402


def main(argv=None):
    args = common.parse_args("GPflux kin8nm DGP speed and budget accuracy", argv)
    clock = common.StartupClock(_ENTRY)
    import tensorflow as tf

    if args.threads:  # default: TensorFlow's own choice, all cores for intra- and inter-op pools
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import gpflow
    import gpflux
    from gpflow.keras import tf_keras
    from gpflux.helpers import construct_basic_inducing_variables, construct_basic_kernel
    from gpflux.layers import GPLayer, LikelihoodLayer
    from gpflux.models import DeepGP

    clock.mark("import")
    warnings.filterwarnings("ignore")
    np_dtype = np.float64 if args.precision == "float64" else np.float32
    gpflow.config.set_default_float(np_dtype)
    gpflow.config.set_default_jitter(common.JITTER[args.precision])
    tf_keras.backend.set_floatx(args.precision)
    tf_dtype = tf.float64 if args.precision == "float64" else tf.float32

    if args.until_ll is not None:  # the training split less its held-back validation part
        data = common.load_kin8nm_validation(args.split, args.data_dir)
    else:
        data = common.load_kin8nm(args.split, args.data_dir)
    X_np, y_np = data["X_train"], data["y_train"]
    N, D = X_np.shape
    W, M, B = common.HIDDEN_WIDTH, common.NUM_INDUCING, min(common.BATCH_SIZE, N)
    X_train = tf.constant(X_np, tf_dtype)
    Y_train = tf.constant(y_np[:, None], tf_dtype)
    clock.mark("data")
    Z = common.kmeans_init(X_np, M, seed=0)

    def build():
        """A fresh model (deterministic init) and its compiled training step."""
        tf.random.set_seed(args.seed)
        k1 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(D)), output_dim=W, share_hyperparams=True)
        z1 = construct_basic_inducing_variables(M, D, W, share_variables=True, z_init=Z.astype(np_dtype))
        inner = GPLayer(k1, z1, N, mean_function=gpflow.mean_functions.Identity(), num_samples=None, name="inner", verbose=False)
        inner.q_sqrt.assign(inner.q_sqrt.numpy() * common.INNER_Q_SQRT_SCALE)
        k2 = construct_basic_kernel(gpflow.kernels.SquaredExponential(lengthscales=np.ones(W)), output_dim=1, share_hyperparams=True)
        z2 = construct_basic_inducing_variables(M, W, 1, share_variables=True, z_init=Z.astype(np_dtype))
        outer = GPLayer(k2, z2, N, mean_function=gpflow.mean_functions.Zero(), num_samples=None, name="outer", verbose=False)
        likelihood = gpflow.likelihoods.Gaussian(variance=common.NOISE_INIT)
        model = DeepGP([inner, outer], LikelihoodLayer(likelihood), num_data=N)
        opt = tf_keras.optimizers.Adam(common.LEARNING_RATE)
        variables = model.trainable_variables

        @tf.function
        def step():
            idx = tf.random.shuffle(tf.range(N))[:B]
            xb, yb = tf.gather(X_train, idx), tf.gather(Y_train, idx)
            with tf.GradientTape() as tape:
                loss = -model.elbo((xb, yb)) / N  # negative ELBO per training point
            grads = tape.gradient(loss, variables)
            opt.apply_gradients(zip(grads, variables))
            return loss

        return model, inner, outer, likelihood, step

    S = common.NUM_TEST_SAMPLES

    def make_components(inner, outer, likelihood):
        """``(S, N*)`` per-sample predictive means and variances (noise included) at inputs ``Xt``."""

        @tf.function
        def components(Xt):
            m1, v1 = inner.predict(Xt)  # (N*, W) marginals of the inner layer
            eps = tf.random.normal(tf.concat([[S], tf.shape(m1)], 0), dtype=tf_dtype)
            h = tf.reshape(m1[None] + tf.sqrt(v1)[None] * eps, (-1, W))  # one draw per sample
            m2, v2 = outer.predict(h)
            m2 = tf.reshape(m2[:, 0], (S, -1))
            v2 = tf.reshape(v2[:, 0], (S, -1)) + likelihood.variance
            return m2, v2

        return components

    def version():
        return f"gpflux {gpflux.__version__}, gpflow {gpflow.__version__}, tensorflow {tf.__version__}"

    def threads():
        return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()  # 0 = all cores

    # ---- speed: first step (tracing + graph build), warm-up, timed blocks ----------------
    model, inner, outer, likelihood, step = build()
    clock.mark("init")
    t0 = time.perf_counter()
    loss = step()
    loss.numpy()
    compile_s = time.perf_counter() - t0
    clock.mark("first_step")
    common.log(f"gpflux {args.precision}: first step {compile_s:.2f} s")
    if args.startup:
        common.emit(common.startup_result("gpflux", version(), args, clock, threads()))
        return
    if args.until_ll is not None:
        # the model above, its first step done, trained on until the validation LL reaches the target
        components = make_components(inner, outer, likelihood)
        X_valid = tf.constant(data["X_valid"], tf_dtype)

        def validation_ll():
            m, v = components(X_valid)
            return common.mixture_metrics(m.numpy(), v.numpy(), data["y_valid"], data["y_std"])["test_ll"]

        outcome = common.train_until(step, validation_ll, clock, args.until_ll, args.check_every, args.max_steps,
                                     steps_done=1, sync=lambda loss: loss.numpy())
        m, v = components(tf.constant(data["X_test"], tf_dtype))  # after the clock stopped: not in `seconds`
        test = common.mixture_metrics(m.numpy(), v.numpy(), data["y_test"], data["y_std"])
        common.emit(common.until_ll_result("gpflux", version(), args, clock, outcome, test, threads(), data))
        return
    for _ in range(args.warmup_steps):
        loss = step()
    loss.numpy()
    blocks = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.timed_steps):
            loss = step()
        loss.numpy()  # synchronize
        blocks.append(time.perf_counter() - t0)
        common.log(f"  block {r}: {args.timed_steps / blocks[-1]:.1f} steps/s, loss {float(loss):.4f}")
    result = common.speed_result("gpflux", version(), args, compile_s, blocks, threads())

    # ---- budget: fresh model, train for a wall-clock budget, evaluate -------------------
    if args.budget_seconds > 0:
        del model, step
        model, inner, outer, likelihood, step = build()
        steps, elapsed, loss = common.train_for(step, args.budget_seconds)
        loss.numpy()
        common.log(f"gpflux budget: {steps} steps in {elapsed:.1f} s")

        X_test = tf.constant(data["X_test"], tf_dtype)
        components = make_components(inner, outer, likelihood)

        @tf.function
        def full_elbo():
            return model.elbo((X_train, Y_train)) / N

        tf.random.set_seed(args.seed + 1)
        m, v = components(X_test)
        metrics = common.mixture_metrics(m.numpy(), v.numpy(), data["y_test"], data["y_std"])
        elbo = float(np.mean([full_elbo().numpy() for _ in range(5)]))
        result.update(budget_steps=steps, final_elbo=elbo, **metrics)
        common.log(f"gpflux test LL {metrics['test_ll']:.4f}, RMSE {metrics['test_rmse']:.4f}, ELBO/N {elbo:.4f}")

    common.emit(result)


if __name__ == "__main__":
    main()
