from elastic_keras.proto import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_NONE: _ClassVar[TaskType]
    TASK_WAIT: _ClassVar[TaskType]
    TASK_TRAINING: _ClassVar[TaskType]
    TASK_EVALUATION: _ClassVar[TaskType]
    TASK_PREDICTION: _ClassVar[TaskType]
TASK_NONE: TaskType
TASK_WAIT: TaskType
TASK_TRAINING: TaskType
TASK_EVALUATION: TaskType
TASK_PREDICTION: TaskType

class Task(_message.Message):
    __slots__ = ("task_id", "type", "path", "start", "end", "epoch", "model_version")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    type: TaskType
    path: str
    start: int
    end: int
    epoch: int
    model_version: int
    def __init__(self, task_id: _Optional[int] = ..., type: _Optional[_Union[TaskType, str]] = ..., path: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., epoch: _Optional[int] = ..., model_version: _Optional[int] = ...) -> None: ...

class RegisterPSRequest(_message.Message):
    __slots__ = ("ps_id", "address")
    PS_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ps_id: int
    address: str
    def __init__(self, ps_id: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class RegisterPSResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ("ready", "ps_addresses")
    READY_FIELD_NUMBER: _ClassVar[int]
    PS_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    ps_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ready: _Optional[bool] = ..., ps_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("role", "id", "round_size")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_SIZE_FIELD_NUMBER: _ClassVar[int]
    role: str
    id: int
    round_size: int
    def __init__(self, role: _Optional[str] = ..., id: _Optional[int] = ..., round_size: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("job_finished", "sync_round_size", "register_again", "ps_addresses", "next_heartbeat_s")
    JOB_FINISHED_FIELD_NUMBER: _ClassVar[int]
    SYNC_ROUND_SIZE_FIELD_NUMBER: _ClassVar[int]
    REGISTER_AGAIN_FIELD_NUMBER: _ClassVar[int]
    PS_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    NEXT_HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    job_finished: bool
    sync_round_size: int
    register_again: bool
    ps_addresses: _containers.RepeatedScalarFieldContainer[str]
    next_heartbeat_s: float
    def __init__(self, job_finished: _Optional[bool] = ..., sync_round_size: _Optional[int] = ..., register_again: _Optional[bool] = ..., ps_addresses: _Optional[_Iterable[str]] = ..., next_heartbeat_s: _Optional[float] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("worker_id", "landing_task_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LANDING_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    landing_task_id: int
    def __init__(self, worker_id: _Optional[int] = ..., landing_task_id: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "records_done", "loss", "model_version", "minibatches", "skipped_minibatches")
    class SkippedMinibatchesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DONE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    task_id: int
    records_done: int
    loss: float
    model_version: int
    minibatches: int
    skipped_minibatches: _containers.ScalarMap[str, int]
    def __init__(self, worker_id: _Optional[int] = ..., task_id: _Optional[int] = ..., records_done: _Optional[int] = ..., loss: _Optional[float] = ..., model_version: _Optional[int] = ..., minibatches: _Optional[int] = ..., skipped_minibatches: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricState(_message.Message):
    __slots__ = ("name", "variables", "aggregations", "labels", "predictions")
    class InputSpec(_message.Message):
        __slots__ = ("shape", "dtype")
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        DTYPE_FIELD_NUMBER: _ClassVar[int]
        shape: _containers.RepeatedScalarFieldContainer[int]
        dtype: str
        def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    AGGREGATIONS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    variables: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    aggregations: _containers.RepeatedScalarFieldContainer[str]
    labels: MetricState.InputSpec
    predictions: MetricState.InputSpec
    def __init__(self, name: _Optional[str] = ..., variables: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., aggregations: _Optional[_Iterable[str]] = ..., labels: _Optional[_Union[MetricState.InputSpec, _Mapping]] = ..., predictions: _Optional[_Union[MetricState.InputSpec, _Mapping]] = ...) -> None: ...

class ReportTaskResultRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "error", "records_done", "loss", "model_version", "metric_states", "abandoned", "minibatches", "dropped", "fatal", "skipped_minibatches", "predictions")
    class SkippedMinibatchesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DONE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRIC_STATES_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    task_id: int
    error: str
    records_done: int
    loss: float
    model_version: int
    metric_states: _containers.RepeatedCompositeFieldContainer[MetricState]
    abandoned: bool
    minibatches: int
    dropped: _containers.RepeatedCompositeFieldContainer[DroppedPushes]
    fatal: str
    skipped_minibatches: _containers.ScalarMap[str, int]
    predictions: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, worker_id: _Optional[int] = ..., task_id: _Optional[int] = ..., error: _Optional[str] = ..., records_done: _Optional[int] = ..., loss: _Optional[float] = ..., model_version: _Optional[int] = ..., metric_states: _Optional[_Iterable[_Union[MetricState, _Mapping]]] = ..., abandoned: _Optional[bool] = ..., minibatches: _Optional[int] = ..., dropped: _Optional[_Iterable[_Union[DroppedPushes, _Mapping]]] = ..., fatal: _Optional[str] = ..., skipped_minibatches: _Optional[_Mapping[str, int]] = ..., predictions: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class ReportTaskResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DroppedPushes(_message.Message):
    __slots__ = ("ps_id", "reason", "count")
    PS_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ps_id: int
    reason: str
    count: int
    def __init__(self, ps_id: _Optional[int] = ..., reason: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class ReportVersionRequest(_message.Message):
    __slots__ = ("ps_id", "model_version", "staleness_counts", "stale_rejections", "pending_pushes", "applied_pushes", "non_finite_pushes", "memory_bytes", "bytes_received", "bytes_sent", "table_stats")
    class AppliedPushesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class TableStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TableLifecycleStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TableLifecycleStats, _Mapping]] = ...) -> None: ...
    PS_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STALENESS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    STALE_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    PENDING_PUSHES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_PUSHES_FIELD_NUMBER: _ClassVar[int]
    NON_FINITE_PUSHES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    TABLE_STATS_FIELD_NUMBER: _ClassVar[int]
    ps_id: int
    model_version: int
    staleness_counts: _containers.RepeatedScalarFieldContainer[int]
    stale_rejections: int
    pending_pushes: int
    applied_pushes: _containers.ScalarMap[int, int]
    non_finite_pushes: int
    memory_bytes: int
    bytes_received: int
    bytes_sent: int
    table_stats: _containers.MessageMap[str, TableLifecycleStats]
    def __init__(self, ps_id: _Optional[int] = ..., model_version: _Optional[int] = ..., staleness_counts: _Optional[_Iterable[int]] = ..., stale_rejections: _Optional[int] = ..., pending_pushes: _Optional[int] = ..., applied_pushes: _Optional[_Mapping[int, int]] = ..., non_finite_pushes: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., table_stats: _Optional[_Mapping[str, TableLifecycleStats]] = ...) -> None: ...

class TableLifecycleStats(_message.Message):
    __slots__ = ("rows", "admitted", "evicted", "not_admitted_lookups", "dropped_gradients", "bytes")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    NOT_ADMITTED_LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    rows: int
    admitted: int
    evicted: int
    not_admitted_lookups: int
    dropped_gradients: int
    bytes: int
    def __init__(self, rows: _Optional[int] = ..., admitted: _Optional[int] = ..., evicted: _Optional[int] = ..., not_admitted_lookups: _Optional[int] = ..., dropped_gradients: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ReportVersionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("num_workers", "job_name")
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    job_name: str
    def __init__(self, num_workers: _Optional[int] = ..., job_name: _Optional[str] = ...) -> None: ...

class ScaleResponse(_message.Message):
    __slots__ = ("job_name", "previous_num_workers", "num_workers", "running_workers")
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_WORKERS_FIELD_NUMBER: _ClassVar[int]
    job_name: str
    previous_num_workers: int
    num_workers: int
    running_workers: int
    def __init__(self, job_name: _Optional[str] = ..., previous_num_workers: _Optional[int] = ..., num_workers: _Optional[int] = ..., running_workers: _Optional[int] = ...) -> None: ...
