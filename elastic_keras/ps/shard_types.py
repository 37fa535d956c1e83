"""The data a parameter-server shard takes and gives: pushes, answers, configs, snapshots.

Plain frozen dataclasses with no behaviour, shared by `Parameters` (the shard), its gRPC
servicer, which translates them to and from protobuf messages, and `ps/checkpoint.py`, which
writes a `Snapshot` to a shard file and reads it back. `DUPLICATE`, `STALE`, `HELD` and
`SKIPPED` start the `reason` of a `PushResult`.

Example:

    >>> import numpy as np
    >>> Push(worker_id=0, sequence=1, gradients=(("w", np.ones(2, "float32")),)).model_version
    0
"""

import dataclasses

DUPLICATE = "duplicate"
STALE = "stale"
HELD = "held"
SKIPPED = "skipped"  # acknowledged, none of it applied: it held NaN or Inf


@dataclasses.dataclass(frozen=True)
class Push:
    """Gradients from one worker step.

    `gradients` holds `(name, value)` pairs, each value a numpy array (dense) or a
    `tensor_codec.Slices` (rows); `deltas` holds `(name, array)` pairs: what the step added
    to non-trainable variables. `(worker_id, sequence)` names the minibatch: a shard applies
    a sequence at most once, so a resent push is a no-op where it was applied. Sequences of
    one `launch` of a worker never shadow another launch's: a later launch starts afresh,
    and an earlier one, replaced, may push no more.
    """

    worker_id: int
    sequence: int
    model_version: int = 0
    gradients: tuple = ()
    deltas: tuple = ()
    incarnation: int = 0  # of the shard the gradients were computed against; 0: not known
    launch: int | None = None  # the pushing worker's launch (its credential's); None: unknown


@dataclasses.dataclass(frozen=True)
class PushResult:
    """`reason` is `DUPLICATE` for a push already applied, `SKIPPED` for one acknowledged but
    not applied (it held NaN or Inf), explains a rejection, else empty.

    `stale` marks a push rejected for the version it was computed against: pull and retry.
    `held` marks one held back while the shard takes a checkpoint: send it again.
    """

    accepted: bool
    model_version: int
    reason: str = ""
    stale: bool = False
    held: bool = False


@dataclasses.dataclass(frozen=True)
class InitResult:
    """`initialized_now` is False when the shard already held a model and kept it."""

    initialized_now: bool
    model_version: int


@dataclasses.dataclass(frozen=True)
class PullResult:
    """`dense` maps names to arrays; empty before init and when the caller's version is current.

    `incarnation` names this run of the shard (see `Parameters.incarnation`)."""

    initialized: bool
    model_version: int
    dense: dict
    incarnation: int = 0


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """An embedding table this shard holds part of (rows whose ids hash to it)."""

    name: str
    dim: int
    input_dim: int = 0
    initializer: str = "uniform"
    dtype: str = "float32"
    # The layer's own admission and eviction; None: the shard's flags (`ShardLifecycle`).
    admit_after: int = None
    admit_probability: float = None
    idle_steps: int = None
    max_rows: int = None
    idle_seconds: float = None


@dataclasses.dataclass(frozen=True)
class VariableOptions:
    """How the optimizer treats one dense variable (see `pserver.proto`)."""

    name: str
    trainable: bool = True
    constraint: str = ""
    exclude_from_weight_decay: bool = False


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A shard's whole state as plain data: what `Parameters.snapshot` copies and `restore` takes.

    Attributes:
        version: the model version.
        optimizer_config: the JSON of `keras.optimizers.serialize(optimizer)`.
        tables: the `TableConfig`s the shard was initialised with.
        dense: `{name: array}` of the dense variables, in their own dtypes.
        optimizer_iterations: the dense optimizer's step count.
        optimizer_slots: `{variable name: {slot name: array}}` (see `OptimizerApplier.state`).
        optimizer_others: `{key: array}`: the dense optimizer's other variables.
        table_states: `{table name: TableState}`, rows with their optimizer slots.
        applied_sequences: `{worker id: the highest push sequence applied}`.
        variable_options: `{name: VariableOptions}` of the dense variables.
        applied_pushes: `{worker id: pushes whose updates the shard holds}`.
        table_steps: the updates the shard has applied: the step count of the tables'
            sparse optimizer, which keeps no other state (None: the version, as files
            written before versions could jump on a relaunch).
        table_counters: `{table name: TableCounters fields}`: what admission and eviction
            did (files written before tables had lifecycles have none).
        table_sketches: `{table name: its admission's sighting counts}` (tables that count
            sightings only).
    """

    version: int
    optimizer_config: str
    tables: tuple
    dense: dict
    optimizer_iterations: int
    optimizer_slots: dict
    optimizer_others: dict
    table_states: dict
    applied_sequences: dict
    variable_options: dict = dataclasses.field(default_factory=dict)
    applied_pushes: dict = dataclasses.field(default_factory=dict)
    table_steps: int = None
    table_counters: dict = dataclasses.field(default_factory=dict)
    table_sketches: dict = dataclasses.field(default_factory=dict)

