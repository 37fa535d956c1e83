"""One worker's model: pulls parameters, computes gradients, pushes them, evaluates.

The model lives in the worker as a plain Keras model whose variables are overwritten with
the parameter servers' values before each step. The step runs under `tf.GradientTape`,
compiled with `tf.function` unless the model cannot be traced, in which case it runs
eagerly (with a warning). As Keras's `fit` does, the loss is scaled by the optimizer's
`loss_scale_factor`; the gradients are then unscaled and clipped over the whole model
(`optimizer_contract.GradientPrep`) before they are pushed. Non-trainable variables
(BatchNormalization statistics, counters) travel as deltas: what the step changed, which
the shards add, so no minibatch's update is lost to another's.

Exactly once. A minibatch's pushes carry one sequence number, however often they are sent.
A shard that refuses a push as stale (it moved on) gets the minibatch again, recomputed
against fresh values, under the same sequence; the shards that accepted it get nothing
more, and a shard that sees the sequence again answers "duplicate". So every shard applies
each minibatch at most once; one the worker gives up on (`PushRefused`) names the shards
that never applied it, which the job summary counts as dropped.

A parameter server that stops answering (it died; the master relaunches it at the same
address) is waited for, up to `PS_RECOVERY_S`: every call to the shards is retried, a push
with its original sequence number so that shards which already applied it do not apply it
twice. A shard that comes back without a checkpoint holds no model; the worker then offers
it its own copy of the dense variables (InitModel keeps the first offer).
"""

import concurrent.futures
import json
import logging
import threading
import time

import grpc
import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.config import EMBEDDING_THRESHOLD_PARAMS
from elastic_keras.common.errors import ModelSpecError, NotReadyError, PSError, PushRefused
from elastic_keras.common.metrics import build_metrics, to_states
from elastic_keras.common.model_variables import split_trainable
from elastic_keras.common.optimizer_contract import GradientPrep, shard_config
from elastic_keras.layers.lookup_context import (
    LookupContext, lookup_context, merge_row_gradients,
)
from elastic_keras.layers.tables import ps_tables
from elastic_keras.proto import pserver_pb2

logger = logging.getLogger(__name__)

# How long a worker waits for an unreachable parameter server before failing its task.
PS_RECOVERY_S = 300.0
_RETRY_PAUSE_S = 1.0
_RECOVERABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.FAILED_PRECONDITION)  # the last: a shard without a model


class Trainer:
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
        sync: synchronous training: after a push, wait for the round it joined before the
            next pull, so every step computes against a new version.
        max_stale_retries: recomputations of a minibatch rejected as stale before failing.
        overlap: asynchronous training without a staleness bound only: push a step's
            gradients and pull fresh values in the background while the next step computes.
            That step then misses this worker's previous update (staleness 1), which
            asynchronous training allows; a rejected push could not be recomputed.
    """

    def __init__(self, spec, ps_client, worker_id, embedding_threshold_params=EMBEDDING_THRESHOLD_PARAMS,
                 sync=False, max_stale_retries=20, overlap=False, stop=None):
        self._spec = spec
        self._stop = stop or threading.Event()  # set: stop waiting for parameter servers
        self._init_args = None  # (optimizer config, table specs, variable options) of InitModel
        self._needs_init = False
        self._ps = ps_client
        self._worker_id = worker_id
        self._threshold = embedding_threshold_params
        self._sync = sync
        self._max_stale_retries = max_stale_retries
        self._min_versions = None
        self._prep = GradientPrep()
        self.stale_pushes = 0
        self._overlap = overlap and not sync
        self._background = (concurrent.futures.ThreadPoolExecutor(1, "push-pull")
                            if self._overlap else None)
        self._pending = None  # the background push and pull of the previous step
        self._after = []      # futures of `after_landed` calls not yet known to be done
        self._model = None
        self._trainable = {}
        self._fixed = {}
        self._tables = []
        self._looked_up = []  # (table, ...) of each lookup of the traced step, in order
        self._versions = None
        self._incarnations = None  # of the shards the assigned values came from
        # Sequence numbers (one per minibatch) only grow, across restarts too: a relaunched
        # worker with the same id must not have its pushes taken for its predecessor's.
        self._sequence = time.time_ns()
        self._train_step = None
        self._forward = None

    @property
    def model_version(self):
        return max(self._versions) if self._versions else 0

    # -- model set-up ----------------------------------------------------------------------

    def _ensure_model(self, features):
        if self._model is not None:
            return
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
            )
            for t in self._tables
        ], _variable_options(optimizer, self._trainable, self._fixed))
        answers = self._through_outages("InitModel", lambda: self._ps.init_model(
            initial, *self._init_args, worker_id=self._worker_id))
        # Above any sequence a predecessor with this id had applied, whatever the clocks say.
        self._sequence = max(self._sequence, *(a.applied_sequence for a in answers))
        self._train_step = _compile(self._train_step_fn, "training step")
        self._forward = _compile(self._forward_fn, "forward pass")
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

    def _lookup_rows(self, table, ids):
        """Rows of `table` for unique `ids`, from the shards (called inside the step)."""
        return self._through_outages(
            "an embedding lookup", lambda: self._ps.pull_embeddings({table: ids})[table]
        )

    def _pull(self):
        def pull():
            pulled = self._ps.pull_dense(self._versions, self._min_versions)
            if not pulled[0] and self._init_args is not None:  # a shard without its model
                self._reinitialize()
                pulled = self._ps.pull_dense(self._versions, self._min_versions)
            return (*pulled, self._ps.incarnations)

        self._assign(*self._through_outages("a pull", pull))

    def _assign(self, initialized, versions, values, incarnations):
        """Takes pulled values, of `versions` of the shards' `incarnations`."""
        if not initialized:
            raise NotReadyError("the parameter servers hold no model yet")
        variables = {**self._trainable, **self._fixed}
        for name, value in values.items():
            variable = variables.get(name)
            if variable is None:
                raise PSError(f"The parameter servers sent an unknown variable {name!r}.")
            # Floats sent in a reduced transfer dtype come as float32: cast to the variable's.
            variable.assign(np.asarray(value, dtype=variable.dtype))
        self._versions, self._incarnations = versions, incarnations

    # -- steps -----------------------------------------------------------------------------

    def _train_step_fn(self, features, labels):
        with tf.GradientTape() as tape:
            context = LookupContext(self._lookup_rows, tape)
            with lookup_context(context):
                predictions = self._model(features, training=True)
                loss = tf.reduce_mean(self._spec.loss(labels, predictions))
                if self._model.losses:
                    loss += tf.add_n(self._model.losses)
            scaled = self._prep.scale_loss(loss)
        dense = list(self._trainable.values())
        grads = tape.gradient(scaled, dense + [r.rows for r in context.records])
        self._looked_up = [r.table for r in context.records]  # at trace time: static
        return (loss, grads[:len(dense)], [r.unique_ids for r in context.records],
                grads[len(dense):])

    def _forward_fn(self, features):
        with lookup_context(LookupContext(self._lookup_rows)):
            return self._model(features, training=False)

    def train_minibatch(self, features, labels):
        """Pulls, computes gradients, pushes; returns the minibatch's loss.

        A push that shards refuse as stale is recomputed against freshly pulled values and
        sent to those shards alone, under the minibatch's sequence number, up to
        `max_stale_retries` times in a row.

        Raises:
            PushRefused: a shard refused the push for another reason, or kept finding it
                stale; it names the shards that never applied the minibatch.
        """
        self._ensure_model(features)
        self._sequence += 1  # the minibatch's, for every push of it
        if self._overlap:
            return self._train_overlapped(features, labels)
        loss, applied_at = self._settle(features, labels, self._sequence,
                                        range(self._ps.num_ps))
        if self._sync:  # wait for the rounds this minibatch joined
            self._min_versions = [applied_at[i] + 1 for i in range(self._ps.num_ps)]
        return loss

    def _settle(self, features, labels, sequence, shards):
        """Pulls, computes and pushes minibatch `sequence` to `shards` until each has
        applied it, recomputing for those that refuse it as stale.

        Returns:
            (the loss of the last computation, {shard: the version its push was computed
            against}).

        Raises:
            PushRefused: see `train_minibatch`.
        """
        waiting = list(shards)  # the shards that have not applied it
        applied_at = {}
        for _ in range(self._max_stale_retries + 1):
            self._pull()
            versions, incarnations = list(self._versions), list(self._incarnations)
            loss, *payload = self._step(features, labels)
            responses = self._through_outages("a push", lambda: self._ps.push_gradients(
                self._worker_id, sequence, versions, *payload, shards=waiting,
                incarnations=incarnations))
            applied_at.update({i: versions[i] for i in waiting if responses[i].accepted})
            stale = [i for i in waiting if responses[i].stale]
            refused = {i: responses[i].reason for i in waiting
                       if not responses[i].accepted and not responses[i].stale}
            if refused:
                raise PushRefused(
                    f"A parameter server rejected the gradients: {next(iter(refused.values()))}",
                    {i: _why(responses[i]) for i in [*stale, *refused]},
                )
            if not stale:
                return loss, applied_at
            self.stale_pushes += 1
            waiting = stale
            self._min_versions = [responses[i].model_version if i in stale else 0
                                  for i in range(self._ps.num_ps)]
        raise PushRefused(
            f"The parameter servers rejected this worker's gradients as stale "
            f"{self._max_stale_retries + 1} times in a row: {responses[waiting[0]].reason}",
            {i: _why(responses[i]) for i in waiting},
        )

    def _step(self, features, labels):
        """Runs the step; returns (loss, dense gradients, deltas of the non-trainable
        variables, embedding rows), the gradients unscaled and clipped."""
        before = {name: v.numpy() for name, v in self._fixed.items()}
        loss, grads, ids, row_grads = self._train_step(features, labels)
        gradients = {
            name: grad.numpy() if isinstance(grad, tf.Tensor) else grad
            for name, grad in zip(self._trainable, grads) if grad is not None
        }
        embedding_grads = merge_row_gradients(
            [(table, i.numpy()) for table, i in zip(self._looked_up, ids)], row_grads
        )
        gradients, embedding_grads = self._prep.apply(gradients, embedding_grads)
        return float(loss), gradients, _deltas(before, self._fixed), embedding_grads

    def _train_overlapped(self, features, labels):
        if self._versions is None:
            self._pull()
        # What this step computes against: the pull `_land` assigned last.
        computed_against = (list(self._versions), list(self._incarnations))
        loss, *payload = self._step(features, labels)
        self._land()  # the previous push is in and its pull assigned, after this step ran
        future = self._background.submit(
            self._push_and_pull, self._sequence, computed_against, *payload
        )
        self._pending = _Pending(future, features, labels, self._sequence)
        return loss

    def _push_and_pull(self, sequence, computed_against, gradients, deltas, embedding_grads):
        versions, incarnations = computed_against
        responses = self._through_outages("a push", lambda: self._ps.push_gradients(
            self._worker_id, sequence, versions, gradients, deltas, embedding_grads,
            incarnations=incarnations,
        ))
        pulled = self._through_outages("a pull", self._ps.pull_dense)
        return responses, (*pulled, self._ps.incarnations)

    def after_landed(self, call):
        """Runs `call()` once every push made so far has landed, without waiting for that:
        in overlapped training, on the background thread after the pending push (or, if a
        shard refused it as stale, on this thread once `_land` has sent it again), and not
        at all if that push failed (its exception, or `call`'s, is raised by a later `flush`
        or step); else at once."""
        pending = self._pending
        if pending is None:
            call()
            return

        def when_landed():
            _accepted(pending)  # done by now (one background thread, first come first run)
            if not pending.defer(call):
                call()

        self._after.append(self._background.submit(when_landed))

    def flush(self):
        """Waits for the background push of the last step (overlapped training) to land, and
        for the `after_landed` calls made since.

        Raises:
            PSError: a shard refused it. Whatever an `after_landed` call raised.
        """
        self._land()
        after, self._after = self._after, []
        for future in after:
            future.result()

    def _land(self):
        """Waits for the pending push and assigns its pull; sends the minibatch again, as
        recomputed, to shards that refused it as stale (they restarted); raises what a
        finished `after_landed` call raised."""
        finished = [f for f in self._after if f.done()]
        self._after = [f for f in self._after if not f.done()]
        for future in finished:
            future.result()
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            pulled = _accepted(pending)
            self._assign(*pulled)
            stale = pending.stale_shards()
            if stale:
                self.stale_pushes += 1
                self._settle(pending.features, pending.labels, pending.sequence, stale)
        except BaseException:
            self._after = []  # they wait on this push: they fail with it, and are dropped
            pending.settle(failed=True)
            raise
        for call in pending.settle():
            call()

    def evaluate(self, batches):
        """Evaluates the current model on `(features, labels)` batches.

        Returns:
            The metrics' states as `MetricState` messages, for the master to add up.
        """
        self.flush()
        metrics, labels, predictions = None, None, None
        for features, labels in batches:
            self._ensure_model(features)
            if metrics is None:
                self._pull()
                metrics = build_metrics(self._spec.eval_metrics_fn)
            predictions = self._forward(features)
            for metric in metrics.values():
                metric.update_state(labels, predictions)
        # One batch's shapes let the master build metrics whose state is made lazily.
        return to_states(metrics or {}, labels, predictions)


class _Pending:
    """A minibatch's background push and pull, with what it takes to compute it again.

    `after_landed` calls that come due while a shard's stale refusal is being resent wait
    here (`defer`) until `_land` has settled the minibatch (`settle`)."""

    def __init__(self, future, features, labels, sequence):
        self.future, self.features, self.labels, self.sequence = (future, features, labels,
                                                                  sequence)
        self._lock = threading.Lock()
        self._deferred = []
        self._settled = False
        self._failed = False

    def stale_shards(self):
        responses, _ = self.future.result()
        return [i for i, r in enumerate(responses) if r.stale]

    def defer(self, call):
        """Whether `call` must wait for the minibatch to be resent (it then runs then)."""
        with self._lock:
            if self._failed:
                raise PSError("A push this call waited for was refused.")
            if self._settled or not self.stale_shards():
                return False
            self._deferred.append(call)
            return True

    def settle(self, failed=False):
        """Marks the minibatch landed everywhere (or given up); returns the deferred calls
        to run now."""
        with self._lock:
            self._settled, self._failed = True, failed
            deferred, self._deferred = self._deferred, []
        return [] if failed else deferred


def _accepted(pending):
    """The pull of a finished background push and pull, if no shard refused the push but
    as stale (which `_land` sends again).

    Raises:
        PushRefused: a shard refused it for another reason. Whatever the push or the pull
            raised.
    """
    responses, pulled = pending.future.result()
    refused = {i: r for i, r in enumerate(responses) if not r.accepted and not r.stale}
    if refused:
        raise PushRefused(
            f"A parameter server rejected the gradients: {next(iter(refused.values())).reason}",
            {i: _why(r) for i, r in enumerate(responses) if not r.accepted})
    return pulled


def _why(response):
    """A refused push's reason as the job summary groups it."""
    return "stale" if response.stale else response.reason[:200]


def _deltas(before, variables):
    """`{name: change}` of the numeric `variables` that changed since `before`.

    Raises:
        ModelSpecError: a variable that is not a number changed (it cannot be merged).
    """
    deltas = {}
    for name, variable in variables.items():
        old, new = before[name], variable.numpy()
        if old.dtype.kind in "iuf":
            delta = new - old
            if delta.any():
                deltas[name] = delta
        elif not np.array_equal(old, new):
            raise ModelSpecError(
                f"The model's non-trainable variable {name!r} changed in a training step, "
                "but only numeric ones can be merged across workers (as deltas). Received: "
                f"dtype {old.dtype.name}"
            )
    return deltas


def _variable_options(optimizer, trainable, fixed):
    """The `VariableOptions` messages of the dense variables, for InitModel.

    Raises:
        ModelSpecError: a variable has a constraint that is not one of Keras's built-in
            constraints (the parameter servers apply it and cannot import the module).
    """
    options = []
    decays = bool(optimizer.weight_decay)
    for name, variable in {**trainable, **fixed}.items():
        constraint = getattr(variable, "constraint", None)
        if constraint is not None and not type(constraint).__module__.startswith("keras."):
            raise ModelSpecError(
                f"Variable {name!r} has a constraint the parameter servers cannot rebuild: "
                "only Keras's built-in constraints (keras.constraints.*) are supported. "
                f"Received: {type(constraint).__module__}.{type(constraint).__qualname__}"
            )
        options.append(pserver_pb2.VariableOptions(
            name=name, trainable=name in trainable,
            constraint=(json.dumps(keras.constraints.serialize(constraint))
                        if constraint is not None and name in trainable else ""),
            exclude_from_weight_decay=(decays and name in trainable
                                       and not optimizer._use_weight_decay(variable)),
        ))
    return options


def _compile(fn, what):
    """`fn` as a tf.function, falling back to eager execution if it cannot be traced."""
    compiled = tf.function(fn, reduce_retracing=True)
    state = {"fn": compiled}

    def call(*args):
        try:
            return state["fn"](*args)
        except (TypeError, NotImplementedError, tf.errors.OperatorNotAllowedInGraphError) as exc:
            if state["fn"] is not compiled:
                raise
            logger.warning("The %s cannot run as a tf.function (%s); running eagerly.",
                           what, exc)
            state["fn"] = fn
            return fn(*args)

    return call
