from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentRef(_message.Message):
    __slots__ = ("queue", "seg")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("queue", "seg", "epoch", "batches")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    epoch: int
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., epoch: _Optional[int] = ..., batches: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seg", "first_offset", "first_seq", "count")
    SEG_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    seg: int
    first_offset: int
    first_seq: int
    count: int
    def __init__(self, seg: _Optional[int] = ..., first_offset: _Optional[int] = ..., first_seq: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    def __init__(self, acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("queue", "seg", "batches", "lac", "hello")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    lac: int
    hello: bool
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., batches: _Optional[_Iterable[bytes]] = ..., lac: _Optional[int] = ..., hello: _Optional[bool] = ...) -> None: ...

class ReplicaSegment(_message.Message):
    __slots__ = ("queue", "seg", "synced_end")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    SYNCED_END_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    synced_end: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., synced_end: _Optional[int] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("synced",)
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    synced: _containers.RepeatedCompositeFieldContainer[ReplicaSegment]
    def __init__(self, synced: _Optional[_Iterable[_Union[ReplicaSegment, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("queue", "seg", "offset", "max_bytes", "max_wait_ms", "known_end", "stream_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_END_FIELD_NUMBER: _ClassVar[int]
    STREAM_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    offset: int
    max_bytes: int
    max_wait_ms: int
    known_end: int
    stream_ms: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., known_end: _Optional[int] = ..., stream_ms: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("batches", "readable_end", "sealed")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    READABLE_END_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    readable_end: int
    sealed: bool
    def __init__(self, batches: _Optional[_Iterable[bytes]] = ..., readable_end: _Optional[int] = ..., sealed: _Optional[bool] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("queue", "seg", "epoch")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    epoch: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class SegmentEnd(_message.Message):
    __slots__ = ("end", "first_seq", "last_seq", "sealed", "fenced_epoch", "bytes", "first_write_ms")
    END_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    FENCED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_WRITE_MS_FIELD_NUMBER: _ClassVar[int]
    end: int
    first_seq: int
    last_seq: int
    sealed: bool
    fenced_epoch: int
    bytes: int
    first_write_ms: int
    def __init__(self, end: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., sealed: _Optional[bool] = ..., fenced_epoch: _Optional[int] = ..., bytes: _Optional[int] = ..., first_write_ms: _Optional[int] = ...) -> None: ...

class ReconcileRequest(_message.Message):
    __slots__ = ("queue", "seg", "end", "peer")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    end: int
    peer: str
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., end: _Optional[int] = ..., peer: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("gid", "role", "incarnation", "slave_connected", "stats_json")
    GID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SLAVE_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    gid: str
    role: str
    incarnation: str
    slave_connected: bool
    stats_json: str
    def __init__(self, gid: _Optional[str] = ..., role: _Optional[str] = ..., incarnation: _Optional[str] = ..., slave_connected: _Optional[bool] = ..., stats_json: _Optional[str] = ...) -> None: ...
