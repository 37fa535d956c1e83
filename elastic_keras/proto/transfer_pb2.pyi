from elastic_keras.proto import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_CONTENT: _ClassVar[ChunkField]
    CHUNK_IDS: _ClassVar[ChunkField]
CHUNK_CONTENT: ChunkField
CHUNK_IDS: ChunkField

class TensorHeader(_message.Message):
    __slots__ = ("name", "dtype", "shape", "dense_shape", "content_size", "content_chunks", "ids_size", "ids_chunks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DENSE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    IDS_SIZE_FIELD_NUMBER: _ClassVar[int]
    IDS_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _tensor_pb2.DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    dense_shape: _containers.RepeatedScalarFieldContainer[int]
    content_size: int
    content_chunks: int
    ids_size: int
    ids_chunks: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_tensor_pb2.DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., dense_shape: _Optional[_Iterable[int]] = ..., content_size: _Optional[int] = ..., content_chunks: _Optional[int] = ..., ids_size: _Optional[int] = ..., ids_chunks: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("tensor", "field", "index", "codec", "checksum", "raw_size", "size")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    tensor: str
    field: ChunkField
    index: int
    codec: str
    checksum: int
    raw_size: int
    size: int
    def __init__(self, tensor: _Optional[str] = ..., field: _Optional[_Union[ChunkField, str]] = ..., index: _Optional[int] = ..., codec: _Optional[str] = ..., checksum: _Optional[int] = ..., raw_size: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class TransferPiece(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class TransferMessage(_message.Message):
    __slots__ = ("pieces",)
    PIECES_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedCompositeFieldContainer[TransferPiece]
    def __init__(self, pieces: _Optional[_Iterable[_Union[TransferPiece, _Mapping]]] = ...) -> None: ...

class TransferFrame(_message.Message):
    __slots__ = ("meta", "payload")
    META_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    meta: bytes
    payload: bytes
    def __init__(self, meta: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...
