"""One worker's model: pulls parameters and computes gradients (its update strategy pushes
them), or outputs for evaluation and prediction (`worker.inference`).

The model lives in the worker as a plain Keras model whose variables are overwritten with
the parameter servers' values before each step. The step runs under `tf.GradientTape`,
compiled with `tf.function` unless the model cannot be traced, in which case it runs
eagerly (with a warning). As Keras's `fit` does, the loss is scaled by the optimizer's
`loss_scale_factor`; the gradients are then unscaled and clipped over the whole model
(`optimizer_contract.GradientPrep`) before they are pushed. Non-trainable variables
(BatchNormalization statistics, counters) travel as deltas: what the step changed, which
the shards add, so no minibatch's update is lost to another's. The loss must be a scalar
(checked at the first step); a step whose loss, gradients or non-trainable changes hold
NaN or Inf raises `NonFiniteLossError` before anything of it is pushed, so no shard applies
part of a minibatch that others refuse.

Each minibatch gets one sequence number, which every push of it carries. When and how it is
pushed, and what happens to a push a shard refuses, is the update strategy's part
(`elastic_keras.worker.strategies`: synchronous rounds, asynchronous, asynchronous with
communication overlapped), which works on the model through the `Replica` methods here.

A parameter server that stops answering (it died; the master relaunches it at the same
address) is waited for, up to `PS_RECOVERY_S`: every call to the shards is retried, a push
with its original sequence number so that shards which already applied it do not apply it
twice. A shard that comes back without a checkpoint holds no model; the worker then offers
it its own copy of the dense variables (InitModel keeps the first offer).
"""

import json
import logging
import math
import threading
import time

import grpc
import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.config import EMBEDDING_THRESHOLD_PARAMS
from elastic_keras.common.errors import NonFiniteLossError, NotReadyError, PSError
from elastic_keras.common.model_variables import split_trainable
from elastic_keras.common.optimizer_contract import GradientPrep, shard_config
from elastic_keras.layers.lookup_context import (
    LookupContext, lookup_context, merge_row_gradients,
)
from elastic_keras.layers.tables import ps_tables
from elastic_keras.proto import pserver_pb2
from elastic_keras.worker import steps, strategies
from elastic_keras.worker.row_pulls import RowPulls
from elastic_keras.worker.strategies import Computed, Minibatch, Pulled, Replica
from elastic_keras.worker.variables import non_trainable_deltas, variable_options

logger = logging.getLogger(__name__)

# How long a worker waits for an unreachable parameter server before failing its task.
PS_RECOVERY_S = 300.0
_RETRY_PAUSE_S = 1.0
_RECOVERABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.FAILED_PRECONDITION)  # the last: a shard without a model


class Trainer(Replica):
    """Trains the module's model against the parameter servers.

    Embedding tables (see `elastic_keras.layers.tables.ps_tables`) never live in the worker:
    their layers look up the rows a minibatch touches through a `LookupContext` whose lookup
    function pulls them from the shards, and the gradients of those rows go back as rows.

    Args:
        spec: the loaded `ModelSpec`.
        ps_client: a `PSClient` for every shard.
        worker_id: this worker's id, sent with each push.
        embedding_threshold_params: plain Keras Embeddings larger than this are served from
            the parameter servers.
        strategy: the name of the update strategy (a key of `strategies.STRATEGIES`; for a
            worker's config, `strategies.name_for(config)`).
        max_stale_retries: recomputations of a minibatch rejected as stale before failing.
        stop: a `threading.Event`; once set, waits for parameter servers are cut short.
        fresh_names: clear Keras's session before building the model, so that its variables
            get the names of a fresh process (an ensemble's members after the first).

    Raises:
        ValueError: no update strategy is called `strategy`.
    """

    def __init__(self, spec, ps_client, worker_id,
                 embedding_threshold_params=EMBEDDING_THRESHOLD_PARAMS, strategy="async",
                 max_stale_retries=20, stop=None, fresh_names=False):
        self._spec = spec
        self._fresh_names = fresh_names
        self._stop = stop or threading.Event()  # set: stop waiting for parameter servers
        self._init_args = None  # (optimizer config, table specs, variable options) of InitModel
        self._needs_init = False
        self._ps = ps_client
        self._worker_id = worker_id
        self._threshold = embedding_threshold_params
        self._strategy = strategies.create(strategy, self, max_stale_retries)
        self._min_versions = None
        self._prep = GradientPrep()
        self._model = None
        self._trainable = {}
        self._fixed = {}
        self._tables = []
        self._looked_up = []  # (table, ...) of each lookup of the traced step, in order
        self._row_pulls = RowPulls(lambda ids_by_table: self._through_outages(
            "an embedding lookup", lambda: self._ps.pull_embeddings(ids_by_table)))
        self._versions = None
        self._incarnations = None  # of the shards the assigned values came from
        self._fetched = None  # the `Pulled` the last push brought back, not yet taken
        # Sequence numbers (one per minibatch) only grow, across restarts too: a relaunched
        # worker with the same id must not have its pushes taken for its predecessor's.
        self._sequence = time.time_ns()
        self._train_step = None
        self._forward = None
        self._loss_spec = None  # what `loss(labels, predictions)` returned, when traced

    @property
    def model_version(self):
        return max(self._versions) if self._versions else 0

    # -- model set-up ----------------------------------------------------------------------

    def _ensure_model(self, features):
        if self._model is not None:
            return
        if self._fresh_names:  # an ensemble's later members: the names a fresh process gives
            keras.utils.clear_session()
        model = self._spec.custom_model()
        model(features, training=False)  # builds every variable
        self._model = model
        self._tables = ps_tables(model, self._threshold)
        replaced = {id(v) for table in self._tables for v in table.replaced_variables}
        trainable, fixed = split_trainable(model)
        self._trainable = {n: v for n, v in trainable.items() if id(v) not in replaced}
        self._fixed = {n: v for n, v in fixed.items() if id(v) not in replaced}
        initial = {n: v.numpy() for n, v in {**self._trainable, **self._fixed}.items()}
        optimizer = self._spec.optimizer()
        self._prep = GradientPrep.of(optimizer)
        optimizer_config = shard_config(keras.optimizers.serialize(optimizer))
        self._init_args = (optimizer_config, [
            pserver_pb2.EmbeddingTableSpec(
                name=t.name, dim=t.dim, input_dim=t.input_dim, dtype=t.dtype,
                initializer=json.dumps(t.initializer_config),
                **{k: v for k, v in t.lifecycle.items() if v is not None},
            )
            for t in self._tables
        ], variable_options(optimizer, self._trainable, self._fixed))
        answers = self._through_outages("InitModel", lambda: self._ps.init_model(
            initial, *self._init_args, worker_id=self._worker_id))
        # Above any sequence a predecessor with this id had applied, whatever the clocks say.
        self._sequence = max(self._sequence, *(a.applied_sequence for a in answers))
        self._loss = steps.converted(self._spec.loss)
        self._train_step = steps.compile_step(self._train_step_fn, "training step")
        self._forward = steps.compile_step(self._forward_fn, "forward pass")
        logger.info(
            "Model built: %d trainable and %d other dense variables (%d parameters); "
            "embedding tables on the parameter servers: %s",
            len(self._trainable), len(self._fixed),
            sum(int(np.prod(v.shape)) for v in {**self._trainable, **self._fixed}.values()),
            ", ".join(f"{t.name} (dim {t.dim})" for t in self._tables) or "none",
        )

    def _through_outages(self, what, call):
        """`call()`, retried while a parameter server is unreachable or lacks its model,
        for up to `PS_RECOVERY_S`.

        Raises:
            PSError: the shard did not come back in time, or the worker was told to stop.
        """
        lost_at = None
        while True:
            try:
                if self._needs_init:
                    self._reinitialize()
                result = call()
            except grpc.RpcError as exc:
                if exc.code() not in _RECOVERABLE:
                    raise
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    logger.warning("A parameter server failed %s (%s: %s); retrying for up to "
                                   "%.0f s", what, exc.code().name, exc.details(),
                                   PS_RECOVERY_S)
                if now - lost_at > PS_RECOVERY_S or self._stop.is_set():
                    raise PSError(f"A parameter server failed {what} for "
                                  f"{now - lost_at:.0f} s: {exc.code().name}: "
                                  f"{exc.details()}") from exc
                self._needs_init = (exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                                    and self._init_args is not None)
                self._stop.wait(_RETRY_PAUSE_S)
                continue
            if lost_at is not None:
                logger.warning("The parameter servers answer %s again after %.1f s", what,
                               time.monotonic() - lost_at)
            return result

    def _reinitialize(self):
        """Offers this worker's dense values to shards that came back without a model."""
        values = {n: v.numpy() for n, v in {**self._trainable, **self._fixed}.items()}
        self._ps.init_model(values, *self._init_args)
        self._needs_init = False
        logger.warning("Offered this worker's copy of the dense variables to a parameter "
                       "server that came back without a checkpoint")

    def _read_rows(self, table, ids):
        """Rows of `table` for unique `ids`, for inference: creates no row and counts no
        sighting."""
        return self._through_outages("an embedding lookup", lambda: self._ps.pull_embeddings(
            {table: ids}, read_only=True)[table])

    # -- the Replica an update strategy works on -------------------------------------------

    @property
    def num_ps(self):
        return self._ps.num_ps

    @property
    def has_values(self):
        return self._versions is not None

    def pull(self):
        fetched = self._take_fetched()
        if fetched is not None:
            self.assign(fetched)
            return

        def pull():
            pulled = self._ps.pull_dense(self._versions, self._min_versions)
            if not pulled[0] and self._init_args is not None:  # a shard without its model
                self._reinitialize()
                pulled = self._ps.pull_dense(self._versions, self._min_versions)
            return Pulled(*pulled, self._ps.incarnations)

        self.assign(self._through_outages("a pull", pull))

    def wait_for(self, min_versions):
        self._min_versions = list(min_versions)

    def fetch(self):
        fetched = self._take_fetched()
        if fetched is not None:
            return fetched
        return Pulled(*self._through_outages("a pull", self._ps.pull_dense),
                      self._ps.incarnations)

    def _take_fetched(self):
        """What the last push brought back (once), if it is of the versions `wait_for`
        asked and every shard holds a model."""
        fetched, self._fetched = self._fetched, None
        least = self._min_versions or [0] * self.num_ps
        if fetched is None or not fetched.initialized or any(
                v < m for v, m in zip(fetched.versions, least)):
            return None
        return fetched

    def assign(self, pulled):
        """Takes pulled values, of `pulled.versions` of the shards' `pulled.incarnations`.

        Raises:
            NotReadyError: a shard holds no model yet.
            PSError: a shard sent a variable this model does not have, or of another shape
                (nothing is assigned then).
        """
        if not pulled.initialized:
            raise NotReadyError("the parameter servers hold no model yet")
        variables = {**self._trainable, **self._fixed}
        pairs = []  # all checked before any is assigned
        for name, value in pulled.values.items():
            variable = variables.get(name)
            if variable is None:
                raise PSError(f"The parameter servers sent an unknown variable {name!r}.")
            # Floats sent in a reduced transfer dtype come as float32: cast to the variable's.
            value = np.asarray(value, dtype=variable.dtype)
            if value.shape != tuple(variable.shape):
                raise PSError(f"The parameter servers sent variable {name!r} with shape "
                              f"{list(value.shape)}; the model's is {list(variable.shape)}.")
            pairs.append((variable, value))
        steps.assign_all(pairs)
        self._versions, self._incarnations = pulled.versions, pulled.incarnations

    def compute(self, features, labels):
        """Runs the step; its gradients come unscaled and clipped.

        Raises:
            NonFiniteLossError: the loss, a gradient or a non-trainable change is NaN or Inf
                (the model's non-trainable variables are left as they were before the step).
            ModelSpecError: `loss(labels, predictions)` returned no scalar (the first step).
        """
        versions, incarnations = list(self._versions), list(self._incarnations)
        before = {name: v.numpy() for name, v in self._fixed.items()}
        try:
            loss, grads, ids, row_grads = self._train_step(features, labels)
        finally:
            self._row_pulls.end_step()
        self._spec.check_loss(self._loss_spec)  # as traced
        loss = float(loss)  # the one fetch of the loss, needed for the report anyway
        if not math.isfinite(loss):
            for name, variable in self._fixed.items():  # the step's updates are not kept
                variable.assign(before[name])
            raise NonFiniteLossError(f"The training loss is {loss}")
        gradients = {
            name: grad.numpy() if isinstance(grad, tf.Tensor) else grad
            for name, grad in zip(self._trainable, grads) if grad is not None
        }
        embedding_grads = merge_row_gradients(
            [(table, i.numpy()) for table, i in zip(self._looked_up, ids)], row_grads
        )
        gradients, embedding_grads = self._prep.apply(gradients, embedding_grads)
        deltas = non_trainable_deltas(before, self._fixed)
        bad = steps.not_finite(
            {**gradients, **{t: g for t, (_, g) in embedding_grads.items()}}, deltas)
        if bad:  # a finite loss whose gradients overflowed: nothing of it may reach a shard
            for name, variable in self._fixed.items():
                variable.assign(before[name])
            raise NonFiniteLossError(f"The training loss is {loss}, but {bad} holds NaN or Inf")
        return Computed(loss, gradients, deltas, embedding_grads, versions, incarnations)

    def push(self, sequence, computed, shards=None, then_pull=False):
        # One round trip for the push and the next pull (see `PSClient.push_gradients`).
        fused = then_pull and (shards is None or len(set(shards)) == self.num_ps)
        self._fetched = None
        responses = self._through_outages("a push", lambda: self._ps.push_gradients(
            self._worker_id, sequence, computed.versions, computed.gradients, computed.deltas,
            computed.embedding_grads, shards=shards, incarnations=computed.incarnations,
            then_pull=fused))
        pulled = self._ps.pulled(responses) if fused else None
        if pulled is not None:
            self._fetched = Pulled(*pulled, self._ps.incarnations)
        return responses

    # -- steps -----------------------------------------------------------------------------

    def _train_step_fn(self, features, labels):
        with tf.GradientTape() as tape:
            context = LookupContext(self._row_pulls.rows, tape)
            with lookup_context(context):
                predictions = self._model(features, training=True)
                loss = self._loss(labels, predictions)
                # Checked by `compute`: autograph would turn an error raised here into its own.
                self._loss_spec = tf.TensorSpec(getattr(loss, "shape", ()))
                loss = tf.reduce_mean(loss)
                if self._model.losses:
                    loss += tf.add_n(self._model.losses)
            scaled = self._prep.scale_loss(loss)
        dense = list(self._trainable.values())
        grads = tape.gradient(scaled, dense + [r.rows for r in context.records])
        self._looked_up = [r.table for r in context.records]  # at trace time: static
        return (loss, grads[:len(dense)], [r.unique_ids for r in context.records],
                [steps.row_sums(g, r.rows) for g, r in zip(grads[len(dense):], context.records)])

    def _forward_fn(self, features):
        with lookup_context(LookupContext(self._read_rows)):
            return self._model(features, training=False)

    # -- training and evaluation -----------------------------------------------------------

    def train_minibatch(self, features, labels):
        """Computes the minibatch's gradients and has the update strategy push them under
        one sequence number; returns the minibatch's loss.

        Raises:
            PushRefused: a shard refused the minibatch for good (a strategy that pushes in
                the background raises it from a later call); it names the shards that never
                applied it.
        """
        self._ensure_model(features)
        self._sequence += 1  # the minibatch's, for every push of it
        return self._strategy.train(Minibatch(features, labels, self._sequence))

    def after_landed(self, call):
        """Runs `call()` once every push made so far has landed (see the strategy's
        `after_landed`)."""
        self._strategy.after_landed(call)

    def flush(self):
        """Waits until every push made so far has landed.

        Raises:
            PSError: a shard refused one. Whatever an `after_landed` call raised.
        """
        self._strategy.flush()

    @property
    def stale_pushes(self):
        """How many pushes some shard refused as stale (each was recomputed and resent)."""
        return self._strategy.stale_pushes

    def prepare(self, features):
        """Before evaluating or predicting: builds the model (from `features`) and takes the
        parameter servers' current values, once every push made so far has landed."""
        self.flush()
        self._ensure_model(features)
        self._fetched = None  # the shards' values now, not as the last push left them
        self.pull()

    def forward(self, features):
        """The model's outputs for `features` (inference: `training=False`), as taken by
        the last `prepare` or pull."""
        return self._forward(features)
