"""GPyTorch peer benchmark: the kin8nm DGP of benchmarks/speed.py, one JSON line on stdout.

2 layers (8 -> 8 -> 1) built from ``DeepGPLayer`` with a whitened ``VariationalStrategy`` and
a ``CholeskyVariationalDistribution`` (batch_shape = outputs for the inner layer); M = 100
k-means inducing inputs per layer, one tensor shared by the layer's outputs (GPyTorch
expands it per output inside the strategy, so kernel matrices are computed once per output);
one SE-ARD ``ScaleKernel(RBFKernel)`` per layer, no batch shape (hyperparameters shared by
the outputs); inner q_sqrt = 1e-5 I, identity inner mean, zero last mean; Gaussian noise
0.01; Adam 0.01; minibatch 1000 drawn without replacement inside the step;
``num_likelihood_samples(1)``; ``DeepApproximateMLL(VariationalELBO)`` (analytic Gaussian
expected log-likelihood). Eager PyTorch: there is no compile step, so ``compile_seconds``
is the first step's wall time.

Run with the venv from setup.sh::

    $NUMPYRO_DGP_PEERS_DIR/gpytorch/bin/python benchmarks/peers/gpytorch_kin8nm.py --precision float64

``--startup`` and ``--until-ll LL`` as in ``gpflux_kin8nm.py`` (start-up marks from process
start; wall clock until the validation LL reaches ``LL``).
"""

from __future__ import annotations

import time

_ENTRY = (time.time(), time.perf_counter())  # the script's first statement: start-up marks begin here

import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402


def main(argv=None):
    args = common.parse_args("GPyTorch kin8nm DGP speed and budget accuracy", argv)
    clock = common.StartupClock(_ENTRY)
    import torch
    import gpytorch
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
    from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

    clock.mark("import")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads or os.cpu_count())
    # denormal floats flushed to zero, as XLA and TensorFlow do on the CPU (why: gpytorch_scale.py)
    torch.set_flush_denormal(True)
    dtype = torch.float64 if args.precision == "float64" else torch.float32
    torch.set_default_dtype(dtype)
    jitter = common.JITTER[args.precision]

    if args.until_ll is not None:  # the training split less its held-back validation part
        data = common.load_kin8nm_validation(args.split, args.data_dir)
    else:
        data = common.load_kin8nm(args.split, args.data_dir)
    X_train = torch.as_tensor(data["X_train"], dtype=dtype)
    y_train = torch.as_tensor(data["y_train"], dtype=dtype)
    clock.mark("data")
    N, D = X_train.shape
    W, M, B = common.HIDDEN_WIDTH, common.NUM_INDUCING, min(common.BATCH_SIZE, N)
    Z = torch.as_tensor(common.kmeans_init(data["X_train"], M, seed=0), dtype=dtype)

    class IdentityMean(gpytorch.means.Mean):
        """Output d of the layer gets input dimension d (inputs arrive as ``(..., W, n, W)``)."""

        def forward(self, x):
            return x.diagonal(dim1=-3, dim2=-1).transpose(-1, -2)

    class Layer(DeepGPLayer):
        def __init__(self, input_dims, output_dims, inner):
            batch = torch.Size([output_dims]) if output_dims is not None else torch.Size([])
            q = CholeskyVariationalDistribution(M, batch_shape=batch, mean_init_std=0.0)
            strategy = VariationalStrategy(self, Z.clone(), q, learn_inducing_locations=True, jitter_val=jitter)
            super().__init__(strategy, input_dims, output_dims)
            self.mean_module = IdentityMean() if inner else gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=input_dims))
            self.covar_module.outputscale = 1.0
            self.covar_module.base_kernel.lengthscale = torch.ones(input_dims)
            # Initialize q(u) now (whitened: mean 0, Cholesky scale * I) and mark it done, so
            # the strategy's lazy first-call initialization does not overwrite it.
            scale = common.INNER_Q_SQRT_SCALE if inner else 1.0
            with torch.no_grad():
                q.variational_mean.zero_()
                q.chol_variational_covar.copy_(scale * torch.eye(M).expand(*batch, M, M))
                strategy.variational_params_initialized.fill_(1)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    class DGP(DeepGP):
        def __init__(self):
            super().__init__()
            self.inner = Layer(D, W, inner=True)
            self.outer = Layer(W, None, inner=False)
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
            self.likelihood.noise = common.NOISE_INIT

        def forward(self, x):
            return self.outer(self.inner(x))

    def build():
        torch.manual_seed(args.seed)
        model = DGP()
        mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=N))
        opt = torch.optim.Adam(model.parameters(), lr=common.LEARNING_RATE)

        def step():
            idx = torch.randperm(N)[:B]
            opt.zero_grad(set_to_none=True)
            loss = -mll(model(X_train[idx]), y_train[idx])  # negative ELBO per training point
            loss.backward()
            opt.step()
            return loss.detach()

        model.train()
        return model, mll, step

    settings = (
        gpytorch.settings.num_likelihood_samples(1),
        gpytorch.settings.cholesky_jitter(float_value=1e-4, double_value=1e-6),
    )
    for s in settings:
        s.__enter__()

    def mixture(model, X):
        """Test-time mixture of ``S`` samples: per-sample means and variances (noise included)."""
        model.eval()
        with torch.no_grad(), gpytorch.settings.num_likelihood_samples(common.NUM_TEST_SAMPLES):
            out = model(X)  # MultivariateNormal, batch (S,), event (N*,)
            m = out.mean.numpy()
            v = (out.variance + model.likelihood.noise).numpy()
        model.train()
        return m, v

    def version():
        return f"gpytorch {gpytorch.__version__}, linear_operator {_version('linear_operator')}, torch {torch.__version__}"

    # ---- speed: first step, warm-up, timed blocks (eager: synchronous) -------------------
    model, mll, step = build()
    clock.mark("init")
    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    clock.mark("first_step")
    common.log(f"gpytorch {args.precision}: first step {compile_s:.2f} s, {torch.get_num_threads()} threads")
    if args.startup:
        common.emit(common.startup_result("gpytorch", version(), args, clock, torch.get_num_threads()))
        return
    if args.until_ll is not None:
        # the model above, its first step done, trained on until the validation LL reaches the target
        X_valid = torch.as_tensor(data["X_valid"], dtype=dtype)

        def validation_ll():
            m, v = mixture(model, X_valid)
            return common.mixture_metrics(m, v, data["y_valid"], data["y_std"])["test_ll"]

        outcome = common.train_until(step, validation_ll, clock, args.until_ll, args.check_every, args.max_steps,
                                     steps_done=1)
        m, v = mixture(model, torch.as_tensor(data["X_test"], dtype=dtype))  # after the clock stopped
        test = common.mixture_metrics(m, v, data["y_test"], data["y_std"])
        common.emit(common.until_ll_result("gpytorch", version(), args, clock, outcome, test,
                                           torch.get_num_threads(), data))
        return
    for _ in range(args.warmup_steps):
        loss = step()
    blocks = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.timed_steps):
            loss = step()
        float(loss)
        blocks.append(time.perf_counter() - t0)
        common.log(f"  block {r}: {args.timed_steps / blocks[-1]:.1f} steps/s, loss {float(loss):.4f}")
    result = common.speed_result("gpytorch", version(), args, compile_s, blocks, torch.get_num_threads())

    # ---- budget: fresh model, train for a wall-clock budget, evaluate -------------------
    if args.budget_seconds > 0:
        del model, mll, step
        model, mll, step = build()
        steps, elapsed, _ = common.train_for(step, args.budget_seconds)
        common.log(f"gpytorch budget: {steps} steps in {elapsed:.1f} s")

        model.eval()
        torch.manual_seed(args.seed + 1)
        X_test = torch.as_tensor(data["X_test"], dtype=dtype)
        with torch.no_grad(), gpytorch.settings.num_likelihood_samples(common.NUM_TEST_SAMPLES):
            out = model(X_test)  # MultivariateNormal, batch (S,), event (N*,)
            m = out.mean.numpy()
            v = (out.variance + model.likelihood.noise).numpy()
        metrics = common.mixture_metrics(m, v, data["y_test"], data["y_std"])
        model.train()
        with torch.no_grad():
            elbo = float(np.mean([float(mll(model(X_train), y_train)) for _ in range(5)]))
        result.update(budget_steps=steps, final_elbo=elbo, **metrics)
        common.log(f"gpytorch test LL {metrics['test_ll']:.4f}, RMSE {metrics['test_rmse']:.4f}, ELBO/N {elbo:.4f}")

    common.emit(result)


def _version(dist):
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
