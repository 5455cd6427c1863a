"""GPyTorch peer of ``benchmarks/scale.py --grid``: time per training step of a 2-layer DGP on
synthetic year-like data (N = 10,000, D = 90 or ``--dim``, batch 1000) at one M and inner width;
one JSON line on stdout.

The model is that of ``gpytorch_kin8nm.py`` (``DeepGPLayer`` with a whitened
``VariationalStrategy`` and a ``CholeskyVariationalDistribution``, one SE-ARD kernel and one set
of k-means inducing inputs per layer shared by its outputs, Adam 0.01, minibatch drawn inside
the step, one sample through the inner layer, analytic Gaussian expected log-likelihood) on the
data of ``gpflux_scale.py``; the inner mean is the fixed map to the first W input coordinates
(as GPflux's peer). Eager PyTorch: ``compile_seconds`` is the first step's wall time.
``--device cuda`` runs it on the GPU (data, model and the minibatch draw on the device).

Run with the venv from setup.sh::

    $NUMPYRO_DGP_PEERS_DIR/gpytorch/bin/python benchmarks/peers/gpytorch_scale.py --num-inducing 100 --width 8
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402


def main(argv=None):
    args = common.parse_scale_args(__doc__.splitlines()[0], argv)
    import gpytorch
    import torch
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
    from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

    warnings.filterwarnings("ignore")
    torch.set_num_threads(os.cpu_count())
    # denormal floats flushed to zero, as XLA and TensorFlow do on the CPU: in float32 at D = 90 the
    # SE kernel's underflowing exponentials made the step 9x slower without it (M = 100, width 8:
    # 336 against 38 ms, 2026-11-29)
    torch.set_flush_denormal(True)
    dtype = torch.float64 if args.precision == "float64" else torch.float32
    np_dtype = np.float64 if args.precision == "float64" else np.float32
    torch.set_default_dtype(dtype)
    jitter = common.JITTER[args.precision]

    N, D, W, M, B = args.num_data, args.dim, args.width, args.num_inducing, args.batch_size
    X_np, y_np = common.scale_data(N, D, np_dtype)
    device = torch.device(args.device)
    X_train, y_train = torch.as_tensor(X_np, device=device), torch.as_tensor(y_np, device=device)
    Z = common.kmeans_init(X_np[:B], M, seed=0)
    Z_inner = Z[:, :W] if W <= D else Z @ np.eye(D, W)

    class FirstCoordinates(gpytorch.means.Mean):
        """Output d of the inner layer gets input coordinate d, zero past D (inputs arrive as ``(W, n, D)``)."""

        def __init__(self):
            super().__init__()
            self.register_buffer("map", torch.eye(D, W))  # zero columns past D when W > D

        def forward(self, x):
            return (x[0] @ self.map).transpose(-1, -2)

    class Layer(DeepGPLayer):
        def __init__(self, input_dims, output_dims, inducing, inner):
            batch = torch.Size([output_dims]) if output_dims is not None else torch.Size([])
            q = CholeskyVariationalDistribution(M, batch_shape=batch, mean_init_std=0.0)
            strategy = VariationalStrategy(self, torch.as_tensor(inducing, dtype=dtype), q, learn_inducing_locations=True,
                                           jitter_val=jitter)
            super().__init__(strategy, input_dims, output_dims)
            self.mean_module = FirstCoordinates() if inner else gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=input_dims))
            self.covar_module.outputscale = 1.0
            self.covar_module.base_kernel.lengthscale = torch.ones(input_dims)
            scale = common.INNER_Q_SQRT_SCALE if inner else 1.0
            with torch.no_grad():  # initialized here, so the strategy's lazy initialization keeps it
                q.variational_mean.zero_()
                q.chol_variational_covar.copy_(scale * torch.eye(M).expand(*batch, M, M))
                strategy.variational_params_initialized.fill_(1)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    class DGP(DeepGP):
        def __init__(self):
            super().__init__()
            self.inner = Layer(D, W, Z, inner=True)
            self.outer = Layer(W, None, Z_inner, inner=False)
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
            self.likelihood.noise = common.NOISE_INIT

        def forward(self, x):
            return self.outer(self.inner(x))

    torch.manual_seed(0)
    model = DGP().to(device)
    mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=N))
    opt = torch.optim.Adam(model.parameters(), lr=common.LEARNING_RATE)
    model.train()

    def step():
        idx = torch.randperm(N, device=device)[:B]
        opt.zero_grad(set_to_none=True)
        loss = -mll(model(X_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        return loss.detach()

    with gpytorch.settings.num_likelihood_samples(1), \
            gpytorch.settings.cholesky_jitter(float_value=1e-4, double_value=1e-6):
        t0 = time.perf_counter()
        float(step())
        compile_s = time.perf_counter() - t0
        for _ in range(3):
            loss = step()
        blocks = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                loss = step()
            float(loss)  # waits for the device
            blocks.append(time.perf_counter() - t0)
    print(json.dumps({"library": "gpytorch", "version": f"gpytorch {gpytorch.__version__}, torch {torch.__version__}",
                      "N": N, "D": D, "M": M, "width": W, "batch_size": B, "precision": args.precision,
                      "ms_per_step": 1e3 * float(np.median(blocks)) / args.steps, "compile_seconds": compile_s,
                      "device": str(device), "finite": bool(np.isfinite(float(loss)))}))


if __name__ == "__main__":
    main()
