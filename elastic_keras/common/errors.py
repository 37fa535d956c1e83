"""The exception hierarchy: each name says what went wrong and how a caller recovers."""


class ElasticKerasError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(ElasticKerasError, ValueError):
    """A flag or configuration value breaks its rule. Fix the command line."""


class ModelSpecError(ElasticKerasError, ValueError):
    """The model-zoo module is missing a required name or returns the wrong kind of object."""


class DataError(ElasticKerasError, ValueError):
    """A data path matches nothing, or a record file is malformed or corrupt."""


class CheckpointError(ElasticKerasError, ValueError):
    """A checkpoint is missing, incomplete or corrupt (the message names the file and why).

    Readers skip it for an older checkpoint, or report it and stop when told to use this one.
    """


class PayloadError(ElasticKerasError, ValueError):
    """An RPC payload is malformed: wrong size for its dtype and shape, unknown dtype, ...

    Servers answer it with INVALID_ARGUMENT and leave their state unchanged.
    """


class NonFiniteError(PayloadError):
    """A push holds NaN or Inf values (the message names the tensor and counts them).

    With `--non-finite-gradients fail` a shard answers it with INVALID_ARGUMENT and applies
    nothing of the push, whose sequence stays unused; the shard counts it.
    """


class NonFiniteLossError(ElasticKerasError, ArithmeticError):
    """A worker's training loss for a minibatch is NaN or Inf (the message names the value,
    the minibatch, the task and the worker). Its gradients are not pushed.

    With `--on-non-finite-loss fail` (the default) the job fails at once; with `skip` the
    worker drops the minibatch, counts it and goes on.
    """


class PSError(ElasticKerasError):
    """A parameter server refused a request (e.g. gradients for an unknown variable)."""


class ApplyError(PSError):
    """A parameter server could not apply a push it had checked (TensorFlow failed).

    The shard answers INTERNAL; the push's sequence stays unused, so it may be sent again.
    """


class ReplacedLaunchError(PSError):
    """A push from a launch of a worker that a later launch has replaced (the master gave
    its task to others): the shard answers PERMISSION_DENIED and applies nothing."""


class PushRefused(PSError):
    """A worker gave up on a minibatch: `dropped` maps each shard that never applied it (by
    index) to why; the other shards applied it once."""

    def __init__(self, message, dropped):
        super().__init__(message)
        self.dropped = dict(dropped)


class NotReadyError(ElasticKerasError):
    """The peer is not ready yet (e.g. the model is not initialised): wait and retry."""


# Why a failed task cannot be retried, as a worker reports it and the master reads it
# (`ReportTaskResultRequest.fatal`); NON_FINITE_LOSS also names minibatches skipped for it.
MODEL_MODULE = "model_module"
NON_FINITE_LOSS = "non_finite_loss"
