from elastic_keras.proto import tensor_pb2 as _tensor_pb2
from elastic_keras.proto import transfer_pb2 as _transfer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EmbeddingTableSpec(_message.Message):
    __slots__ = ("name", "dim", "input_dim", "initializer", "dtype", "admit_after", "admit_probability", "idle_steps", "max_rows", "idle_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIM_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ADMIT_AFTER_FIELD_NUMBER: _ClassVar[int]
    ADMIT_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    IDLE_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    input_dim: int
    initializer: str
    dtype: str
    admit_after: int
    admit_probability: float
    idle_steps: int
    max_rows: int
    idle_seconds: float
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., input_dim: _Optional[int] = ..., initializer: _Optional[str] = ..., dtype: _Optional[str] = ..., admit_after: _Optional[int] = ..., admit_probability: _Optional[float] = ..., idle_steps: _Optional[int] = ..., max_rows: _Optional[int] = ..., idle_seconds: _Optional[float] = ...) -> None: ...

class VariableOptions(_message.Message):
    __slots__ = ("name", "trainable", "constraint", "exclude_from_weight_decay")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FROM_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    name: str
    trainable: bool
    constraint: str
    exclude_from_weight_decay: bool
    def __init__(self, name: _Optional[str] = ..., trainable: _Optional[bool] = ..., constraint: _Optional[str] = ..., exclude_from_weight_decay: _Optional[bool] = ...) -> None: ...

class InitModelRequest(_message.Message):
    __slots__ = ("dense", "optimizer_config", "embedding_tables", "variables", "worker_id")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TABLES_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    optimizer_config: str
    embedding_tables: _containers.RepeatedCompositeFieldContainer[EmbeddingTableSpec]
    variables: _containers.RepeatedCompositeFieldContainer[VariableOptions]
    worker_id: int
    def __init__(self, dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., optimizer_config: _Optional[str] = ..., embedding_tables: _Optional[_Iterable[_Union[EmbeddingTableSpec, _Mapping]]] = ..., variables: _Optional[_Iterable[_Union[VariableOptions, _Mapping]]] = ..., worker_id: _Optional[int] = ...) -> None: ...

class InitModelResponse(_message.Message):
    __slots__ = ("initialized_now", "model_version", "applied_sequence")
    INITIALIZED_NOW_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    initialized_now: bool
    model_version: int
    applied_sequence: int
    def __init__(self, initialized_now: _Optional[bool] = ..., model_version: _Optional[int] = ..., applied_sequence: _Optional[int] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("known_version", "min_version", "full_precision", "averaged", "known_incarnation")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    FULL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    AVERAGED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    min_version: int
    full_precision: bool
    averaged: bool
    known_incarnation: int
    def __init__(self, known_version: _Optional[int] = ..., min_version: _Optional[int] = ..., full_precision: _Optional[bool] = ..., averaged: _Optional[bool] = ..., known_incarnation: _Optional[int] = ...) -> None: ...

class PullDenseResponse(_message.Message):
    __slots__ = ("initialized", "model_version", "incarnation", "dense")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    model_version: int
    incarnation: int
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., incarnation: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class PullDensePart(_message.Message):
    __slots__ = ("initialized", "model_version", "pieces", "incarnation", "pushed")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PUSHED_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    model_version: int
    pieces: _containers.RepeatedCompositeFieldContainer[_transfer_pb2.TransferPiece]
    incarnation: int
    pushed: PushGradientsResponse
    def __init__(self, initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., pieces: _Optional[_Iterable[_Union[_transfer_pb2.TransferPiece, _Mapping]]] = ..., incarnation: _Optional[int] = ..., pushed: _Optional[_Union[PushGradientsResponse, _Mapping]] = ...) -> None: ...

class PullEmbeddingRequest(_message.Message):
    __slots__ = ("ids", "read_only", "full_precision")
    IDS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FULL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    read_only: bool
    full_precision: bool
    def __init__(self, ids: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., read_only: _Optional[bool] = ..., full_precision: _Optional[bool] = ...) -> None: ...

class PullEmbeddingResponse(_message.Message):
    __slots__ = ("model_version", "pieces")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    pieces: _containers.RepeatedCompositeFieldContainer[_transfer_pb2.TransferPiece]
    def __init__(self, model_version: _Optional[int] = ..., pieces: _Optional[_Iterable[_Union[_transfer_pb2.TransferPiece, _Mapping]]] = ...) -> None: ...

class PullTableRequest(_message.Message):
    __slots__ = ("table", "rows_per_chunk")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    table: str
    rows_per_chunk: int
    def __init__(self, table: _Optional[str] = ..., rows_per_chunk: _Optional[int] = ...) -> None: ...

class PullTableResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _tensor_pb2.Tensor
    def __init__(self, rows: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PushGradientsRequest(_message.Message):
    __slots__ = ("worker_id", "sequence", "model_version", "gradients", "incarnation", "deltas", "then_pull")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    THEN_PULL_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    sequence: int
    model_version: int
    gradients: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    incarnation: int
    deltas: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    then_pull: PullDenseRequest
    def __init__(self, worker_id: _Optional[int] = ..., sequence: _Optional[int] = ..., model_version: _Optional[int] = ..., gradients: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., incarnation: _Optional[int] = ..., deltas: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., then_pull: _Optional[_Union[PullDenseRequest, _Mapping]] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("worker_id", "sequence", "model_version", "incarnation", "deltas", "then_pull")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    THEN_PULL_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    sequence: int
    model_version: int
    incarnation: int
    deltas: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    then_pull: PullDenseRequest
    def __init__(self, worker_id: _Optional[int] = ..., sequence: _Optional[int] = ..., model_version: _Optional[int] = ..., incarnation: _Optional[int] = ..., deltas: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., then_pull: _Optional[_Union[PullDenseRequest, _Mapping]] = ...) -> None: ...

class PushGradientsPart(_message.Message):
    __slots__ = ("header", "pieces")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    pieces: _containers.RepeatedCompositeFieldContainer[_transfer_pb2.TransferPiece]
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., pieces: _Optional[_Iterable[_Union[_transfer_pb2.TransferPiece, _Mapping]]] = ...) -> None: ...

class PushGradientsResponse(_message.Message):
    __slots__ = ("accepted", "model_version", "reason", "stale", "held", "pulled")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PULLED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    model_version: int
    reason: str
    stale: bool
    held: bool
    pulled: PullDenseResponse
    def __init__(self, accepted: _Optional[bool] = ..., model_version: _Optional[int] = ..., reason: _Optional[str] = ..., stale: _Optional[bool] = ..., held: _Optional[bool] = ..., pulled: _Optional[_Union[PullDenseResponse, _Mapping]] = ...) -> None: ...

class PrepareCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id", "hold_s")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_S_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    hold_s: float
    def __init__(self, checkpoint_id: _Optional[int] = ..., hold_s: _Optional[float] = ...) -> None: ...

class PrepareCheckpointResponse(_message.Message):
    __slots__ = ("applied_sequences", "model_version")
    class AppliedSequencesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    APPLIED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    applied_sequences: _containers.ScalarMap[int, int]
    model_version: int
    def __init__(self, applied_sequences: _Optional[_Mapping[int, int]] = ..., model_version: _Optional[int] = ...) -> None: ...

class ReleaseCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    def __init__(self, checkpoint_id: _Optional[int] = ...) -> None: ...

class ReleaseCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearningRateRequest(_message.Message):
    __slots__ = ("learning_rate",)
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    def __init__(self, learning_rate: _Optional[float] = ...) -> None: ...

class LearningRateResponse(_message.Message):
    __slots__ = ("initialized", "learning_rate", "schedule")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    learning_rate: float
    schedule: bool
    def __init__(self, initialized: _Optional[bool] = ..., learning_rate: _Optional[float] = ..., schedule: _Optional[bool] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("num_ps", "checkpoint_id", "cut", "without_cut")
    class CutEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_PS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_CUT_FIELD_NUMBER: _ClassVar[int]
    num_ps: int
    checkpoint_id: int
    cut: _containers.ScalarMap[int, int]
    without_cut: bool
    def __init__(self, num_ps: _Optional[int] = ..., checkpoint_id: _Optional[int] = ..., cut: _Optional[_Mapping[int, int]] = ..., without_cut: _Optional[bool] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("file", "bytes", "crc32c", "model_version")
    FILE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    file: str
    bytes: int
    crc32c: int
    model_version: int
    def __init__(self, file: _Optional[str] = ..., bytes: _Optional[int] = ..., crc32c: _Optional[int] = ..., model_version: _Optional[int] = ...) -> None: ...
