"""Training on minibatches drawn outside the model: from host memory, from memory-mapped
``.npy`` files, and across processes (``jax.distributed``).

:func:`numpyro_dgp.fit` keeps the data on the device and the model draws each minibatch there.
When the data do not fit on the device, or are spread over several processes or machines,
:func:`fit_minibatches` takes the minibatches from an iterator instead (e.g.
:class:`HostMinibatches`, which gathers ``batch_size`` rows of NumPy or memory-mapped arrays per
step, ``O(batch_size)`` work and memory, never a copy of the whole set) and calls the model as
``model(X_batch, y_batch, num_data=N)`` (the models of :mod:`numpyro_dgp.models` scale the
likelihood by ``N / batch_size``).

**Several processes.** With ``mesh=`` (a ``jax.sharding.Mesh`` over the devices of every
process, after ``jax.distributed.initialize``), each process passes the minibatches of *its
own* shard of the data; they are joined into one global minibatch sharded over the mesh
(``jax.make_array_from_process_local_data``), the parameters are replicated, and the compiled
update reduces the loss and the gradients across processes (XLA's all-reduce; on CPU, JAX's
collectives, e.g. gloo). Every process ends with the same parameters: those one process would
reach on the joined minibatches.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._validation import check_positive_int
from numpyro_dgp.infer._checks import check_start
from numpyro_dgp.infer._fit import (
    FitResult,
    TrainingLog,
    guarded_update,
    initial_state,
    timed_compile,
)

#: steps between host synchronizations of :func:`fit_minibatches` (loss fetch, progress bar)
SYNC_EVERY = 100


class HostMinibatches:
    """An endless stream of minibatches ``(X[idx], y[idx])`` gathered on the host.

    ``X`` and ``y`` may be NumPy arrays or memory maps (``np.load(path, mmap_mode="r")``):
    each batch reads only its ``batch_size`` rows (indices sorted, so a memory map is read
    front to back). Indices are drawn without replacement within a batch, independently
    between batches, from a NumPy generator seeded with ``seed``.

    :param X: ``(N, D)`` inputs.
    :param y: ``(N,)`` targets (or ``None``).
    :param batch_size: rows per batch (``<= N``).
    :param seed: seed of the index stream (give each process of a distributed fit its own).
    :raises ValueError: for mismatched lengths or a bad ``batch_size``.
    """

    def __init__(
        self,
        X: np.ndarray | jax.Array,
        y: np.ndarray | jax.Array | None,
        batch_size: int,
        *,
        seed: int = 0,
    ) -> None:
        check_positive_int(batch_size, "batch_size", "HostMinibatches")
        if np.ndim(X) != 2:
            raise ValueError(f"HostMinibatches: X must be (N, D), got shape {np.shape(X)}")
        N = np.shape(X)[0]
        if y is not None and np.shape(y)[0] != N:
            raise ValueError(f"HostMinibatches: y has {np.shape(y)[0]} rows, X has {N}")
        if batch_size > N:
            raise ValueError(f"HostMinibatches: batch_size={batch_size} exceeds the {N} rows")
        self.X, self.y, self.batch_size, self.num_data = X, y, int(batch_size), int(N)
        self._rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        return self

    def __next__(self) -> tuple[np.ndarray, ...]:
        # sorted row indices: a memory map is read front to back
        idx = np.sort(
            self._rng.choice(self.num_data, self.batch_size, replace=False, shuffle=False)
        )
        X = np.asarray(self.X[idx])
        return (X,) if self.y is None else (X, np.asarray(self.y[idx]))


def _to_device(batch, mesh):
    arrays = tuple(np.asarray(a) for a in batch)
    if mesh is None:
        return tuple(jnp.asarray(a) for a in arrays)
    from jax.sharding import NamedSharding, PartitionSpec

    # rows sharded over the mesh's first axis, the other axes whole
    rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return tuple(jax.make_array_from_process_local_data(rows, a) for a in arrays)


def fit_minibatches(
    svi: SVI,
    rng_key: jax.Array | None,
    batches: Iterable[tuple[ArrayLike, ...]],
    *,
    num_steps: int,
    num_data: int,
    mesh: Any = None,
    init_state: SVIState | None = None,
    progress_bar: bool = True,
) -> FitResult:
    """Run ``num_steps`` SVI updates, each on the next minibatch of ``batches``.

    Step ``t`` calls ``svi.update(state, *batch_t, num_data=num_data)`` (compiled once); an
    update whose loss or new parameters are not finite is not applied and is counted, as in
    :func:`numpyro_dgp.fit` (the same loop: a warning, or an error when every update was skipped,
    names the layer whose ``K(Z, Z)`` fails at the final parameters, if one does; not with
    ``mesh``). The host gathers the next batch while the device runs the step
    (dispatch is asynchronous); the losses are fetched every ``SYNC_EVERY`` (100) steps.

    :param svi: a ``numpyro.infer.SVI`` whose model takes ``num_data=`` (the models of
        :mod:`numpyro_dgp.models` do).
    :param rng_key: PRNG key of the initialization (the first batch initializes, e.g. the
        k-means of the inducing inputs); may be ``None`` with ``init_state``.
    :param batches: an iterator of tuples of arrays, e.g. :class:`HostMinibatches`; with
        ``mesh``, this process's part of each global minibatch.
    :param num_steps: updates.
    :param num_data: ``N``, the number of points in the whole data set (all processes).
    :param mesh: a ``jax.sharding.Mesh`` over the devices of all processes, whose first axis
        shards the batch (data parallelism across processes); ``None``: one process.
    :param init_state: continue from a previous ``FitResult.state``.
    :param progress_bar: show a tqdm progress bar (on process 0 only).
    :return: :class:`~numpyro_dgp.FitResult` (``chunk_seconds`` per synchronization interval,
        ``chunk_size = SYNC_EVERY``).
    :raises ValueError: for invalid arguments or an exhausted ``batches``.
    :raises FloatingPointError: every update skipped.
    """
    check_positive_int(num_steps, "num_steps", "fit_minibatches")
    check_positive_int(num_data, "num_data", "fit_minibatches")
    check_start("fit_minibatches", rng_key, init_state)
    iterator = iter(batches)

    def next_batch():
        try:
            batch = next(iterator)
        except StopIteration:
            raise ValueError("fit_minibatches: batches ran out before num_steps updates") from None
        return _to_device(batch, mesh)

    batch = next_batch()
    kwargs = {"num_data": int(num_data)}
    state = initial_state(svi, rng_key, batch, kwargs) if init_state is None else init_state

    @jax.jit
    def update(state, batch):
        # one step per program: no scan whose compile the barrier bounds, and without it the
        # results are those of fit_minibatches before it shared fit's loop, bit for bit
        return guarded_update(svi, state, batch, kwargs, barrier=False)

    compiled, compile_seconds = timed_compile(update, state, batch)

    def run(done, n):
        # dispatch is asynchronous: the host gathers the next batch while the device runs a step
        nonlocal state, batch
        steps = []
        for step in range(done, done + n):
            if step:
                batch = next_batch()
            state, loss, skip = compiled(state, batch)
            steps.append((loss, skip))
        return np.asarray([float(x) for x, _ in steps]), np.asarray([bool(x) for _, x in steps])

    log = TrainingLog(
        "fit_minibatches", num_steps, progress_bar=progress_bar and jax.process_index() == 0
    )
    log.run(run, lambda done: min(SYNC_EVERY, num_steps - done))
    # the diagnostic's eager run would need every process of a distributed fit: only without a mesh
    params = svi.get_params(state)
    return log.result(
        svi, params, state, batch, kwargs, SYNC_EVERY, compile_seconds, diagnose=mesh is None
    )
