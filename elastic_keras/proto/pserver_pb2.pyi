from elastic_keras.proto import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InitModelRequest(_message.Message):
    __slots__ = ("dense", "optimizer_config")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    optimizer_config: str
    def __init__(self, dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., optimizer_config: _Optional[str] = ...) -> None: ...

class InitModelResponse(_message.Message):
    __slots__ = ("initialized_now", "model_version")
    INITIALIZED_NOW_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    initialized_now: bool
    model_version: int
    def __init__(self, initialized_now: _Optional[bool] = ..., model_version: _Optional[int] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class PullDenseResponse(_message.Message):
    __slots__ = ("initialized", "model_version", "dense")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    model_version: int
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class PushGradientsRequest(_message.Message):
    __slots__ = ("worker_id", "sequence", "model_version", "gradients", "assign")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    sequence: int
    model_version: int
    gradients: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    assign: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, worker_id: _Optional[int] = ..., sequence: _Optional[int] = ..., model_version: _Optional[int] = ..., gradients: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., assign: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class PushGradientsResponse(_message.Message):
    __slots__ = ("accepted", "model_version", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    model_version: int
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., model_version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
