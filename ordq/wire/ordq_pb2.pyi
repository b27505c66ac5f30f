from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_KIND_UNSPECIFIED: _ClassVar[LeaseKind]
    PRODUCER: _ClassVar[LeaseKind]
    CONSUMER: _ClassVar[LeaseKind]
    MEMBER: _ClassVar[LeaseKind]
LEASE_KIND_UNSPECIFIED: LeaseKind
PRODUCER: LeaseKind
CONSUMER: LeaseKind
MEMBER: LeaseKind

class SegmentRef(_message.Message):
    __slots__ = ("queue", "seg")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("queue", "seg", "epoch", "batches", "epoch_key", "local_acks")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_KEY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ACKS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    epoch: int
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    epoch_key: str
    local_acks: bool
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., epoch: _Optional[int] = ..., batches: _Optional[_Iterable[bytes]] = ..., epoch_key: _Optional[str] = ..., local_acks: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("acks", "local_acks")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    local_acks: bool
    def __init__(self, acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ..., local_acks: _Optional[bool] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("queue", "seg", "batches", "lac", "hello", "answers_many")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_MANY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    lac: int
    hello: bool
    answers_many: bool
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., batches: _Optional[_Iterable[bytes]] = ..., lac: _Optional[int] = ..., hello: _Optional[bool] = ..., answers_many: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("synced", "answered")
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    synced: _containers.RepeatedCompositeFieldContainer[ReplicaSegment]
    answered: int
    def __init__(self, synced: _Optional[_Iterable[_Union[ReplicaSegment, _Mapping]]] = ..., answered: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("end", "first_seq", "last_seq", "sealed", "fenced_epoch", "bytes", "first_write_ms", "frozen", "acked_bytes")
    END_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    FENCED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_WRITE_MS_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    ACKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    end: int
    first_seq: int
    last_seq: int
    sealed: bool
    fenced_epoch: int
    bytes: int
    first_write_ms: int
    frozen: bool
    acked_bytes: int
    def __init__(self, end: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., sealed: _Optional[bool] = ..., fenced_epoch: _Optional[int] = ..., bytes: _Optional[int] = ..., first_write_ms: _Optional[int] = ..., frozen: _Optional[bool] = ..., acked_bytes: _Optional[int] = ...) -> None: ...

class OpenSegmentsRequest(_message.Message):
    __slots__ = ("include",)
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    include: _containers.RepeatedCompositeFieldContainer[SegmentRef]
    def __init__(self, include: _Optional[_Iterable[_Union[SegmentRef, _Mapping]]] = ...) -> None: ...

class OpenSegment(_message.Message):
    __slots__ = ("queue", "seg", "end")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    end: SegmentEnd
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ..., end: _Optional[_Union[SegmentEnd, _Mapping]] = ...) -> None: ...

class OpenSegmentsResponse(_message.Message):
    __slots__ = ("segments", "included")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    INCLUDED_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[OpenSegment]
    included: bool
    def __init__(self, segments: _Optional[_Iterable[_Union[OpenSegment, _Mapping]]] = ..., included: _Optional[bool] = ...) -> None: ...

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

class AdminRequest(_message.Message):
    __slots__ = ("verb", "args_json")
    VERB_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    verb: str
    args_json: bytes
    def __init__(self, verb: _Optional[str] = ..., args_json: _Optional[bytes] = ...) -> None: ...

class AdminResponse(_message.Message):
    __slots__ = ("result_json", "text")
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    result_json: bytes
    text: bytes
    def __init__(self, result_json: _Optional[bytes] = ..., text: _Optional[bytes] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("kind", "queue", "subscription", "holder", "generation", "lease_key", "ttl_ms", "wait_ms", "with_state")
    KIND_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WITH_STATE_FIELD_NUMBER: _ClassVar[int]
    kind: LeaseKind
    queue: str
    subscription: str
    holder: str
    generation: int
    lease_key: str
    ttl_ms: int
    wait_ms: int
    with_state: bool
    def __init__(self, kind: _Optional[_Union[LeaseKind, str]] = ..., queue: _Optional[str] = ..., subscription: _Optional[str] = ..., holder: _Optional[str] = ..., generation: _Optional[int] = ..., lease_key: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., wait_ms: _Optional[int] = ..., with_state: _Optional[bool] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("granted", "generation", "lease_key", "ttl_ms", "holder", "retry_ms", "group_generation", "partitions", "state_zxid")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    RETRY_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_ZXID_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    generation: int
    lease_key: str
    ttl_ms: int
    holder: str
    retry_ms: int
    group_generation: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    state_zxid: int
    def __init__(self, granted: _Optional[bool] = ..., generation: _Optional[int] = ..., lease_key: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., holder: _Optional[str] = ..., retry_ms: _Optional[int] = ..., group_generation: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., state_zxid: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("queue", "subscription", "with_config", "with_live", "topic")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    WITH_CONFIG_FIELD_NUMBER: _ClassVar[int]
    WITH_LIVE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    queue: str
    subscription: str
    with_config: bool
    with_live: bool
    topic: str
    def __init__(self, queue: _Optional[str] = ..., subscription: _Optional[str] = ..., with_config: _Optional[bool] = ..., with_live: _Optional[bool] = ..., topic: _Optional[str] = ...) -> None: ...

class LiveProcess(_message.Message):
    __slots__ = ("gid", "role", "address", "incarnation", "produce")
    GID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    gid: str
    role: str
    address: str
    incarnation: str
    produce: str
    def __init__(self, gid: _Optional[str] = ..., role: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[str] = ..., produce: _Optional[str] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("state_json", "state_version", "config_json", "live", "cursor_json", "cursor_version", "topic_json", "state_zxid")
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_JSON_FIELD_NUMBER: _ClassVar[int]
    CURSOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_ZXID_FIELD_NUMBER: _ClassVar[int]
    state_json: bytes
    state_version: int
    config_json: bytes
    live: _containers.RepeatedCompositeFieldContainer[LiveProcess]
    cursor_json: bytes
    cursor_version: int
    topic_json: bytes
    state_zxid: int
    def __init__(self, state_json: _Optional[bytes] = ..., state_version: _Optional[int] = ..., config_json: _Optional[bytes] = ..., live: _Optional[_Iterable[_Union[LiveProcess, _Mapping]]] = ..., cursor_json: _Optional[bytes] = ..., cursor_version: _Optional[int] = ..., topic_json: _Optional[bytes] = ..., state_zxid: _Optional[int] = ...) -> None: ...

class CoordinatorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CoordinatorsResponse(_message.Message):
    __slots__ = ("addresses",)
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class RecordRequest(_message.Message):
    __slots__ = ("queue", "subscription", "generation", "lease_key", "op", "body_json")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    subscription: str
    generation: int
    lease_key: str
    op: str
    body_json: bytes
    def __init__(self, queue: _Optional[str] = ..., subscription: _Optional[str] = ..., generation: _Optional[int] = ..., lease_key: _Optional[str] = ..., op: _Optional[str] = ..., body_json: _Optional[bytes] = ...) -> None: ...

class RecordResponse(_message.Message):
    __slots__ = ("body_json",)
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    body_json: bytes
    def __init__(self, body_json: _Optional[bytes] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class SubscriptionRef(_message.Message):
    __slots__ = ("queue", "subscription")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    queue: str
    subscription: str
    def __init__(self, queue: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("queue", "leader_node", "timeout_ms", "generation", "lease_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    leader_node: str
    timeout_ms: int
    generation: int
    lease_key: str
    def __init__(self, queue: _Optional[str] = ..., leader_node: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., generation: _Optional[int] = ..., lease_key: _Optional[str] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("epoch", "epoch_key", "gid", "seg", "has_last", "last_seq", "last_seg", "last_offset", "state_json")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_KEY_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    HAS_LAST_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEG_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    epoch_key: str
    gid: str
    seg: int
    has_last: bool
    last_seq: int
    last_seg: int
    last_offset: int
    state_json: bytes
    def __init__(self, epoch: _Optional[int] = ..., epoch_key: _Optional[str] = ..., gid: _Optional[str] = ..., seg: _Optional[int] = ..., has_last: _Optional[bool] = ..., last_seq: _Optional[int] = ..., last_seg: _Optional[int] = ..., last_offset: _Optional[int] = ..., state_json: _Optional[bytes] = ...) -> None: ...

class HeadRequest(_message.Message):
    __slots__ = ("queue", "gid", "seg", "epoch", "epoch_key", "timeout_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    gid: str
    seg: int
    epoch: int
    epoch_key: str
    timeout_ms: int
    def __init__(self, queue: _Optional[str] = ..., gid: _Optional[str] = ..., seg: _Optional[int] = ..., epoch: _Optional[int] = ..., epoch_key: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class HeadResponse(_message.Message):
    __slots__ = ("state_json",)
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    state_json: bytes
    def __init__(self, state_json: _Optional[bytes] = ...) -> None: ...

class SealRequest(_message.Message):
    __slots__ = ("queue", "seg")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEG_FIELD_NUMBER: _ClassVar[int]
    queue: str
    seg: int
    def __init__(self, queue: _Optional[str] = ..., seg: _Optional[int] = ...) -> None: ...

class StateResponse(_message.Message):
    __slots__ = ("state_json",)
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    state_json: bytes
    def __init__(self, state_json: _Optional[bytes] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("queue", "subscription", "cursor_json", "version", "holder", "generation", "lease_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CURSOR_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    subscription: str
    cursor_json: bytes
    version: int
    holder: str
    generation: int
    lease_key: str
    def __init__(self, queue: _Optional[str] = ..., subscription: _Optional[str] = ..., cursor_json: _Optional[bytes] = ..., version: _Optional[int] = ..., holder: _Optional[str] = ..., generation: _Optional[int] = ..., lease_key: _Optional[str] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("queue", "subscription", "start")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    queue: str
    subscription: str
    start: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue: _Optional[str] = ..., subscription: _Optional[str] = ..., start: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("cursor_json", "starts_at")
    CURSOR_JSON_FIELD_NUMBER: _ClassVar[int]
    STARTS_AT_FIELD_NUMBER: _ClassVar[int]
    cursor_json: bytes
    starts_at: int
    def __init__(self, cursor_json: _Optional[bytes] = ..., starts_at: _Optional[int] = ...) -> None: ...

class FindSegmentRef(_message.Message):
    __slots__ = ("seg", "known_end")
    SEG_FIELD_NUMBER: _ClassVar[int]
    KNOWN_END_FIELD_NUMBER: _ClassVar[int]
    seg: int
    known_end: int
    def __init__(self, seg: _Optional[int] = ..., known_end: _Optional[int] = ...) -> None: ...

class FindRequest(_message.Message):
    __slots__ = ("queue", "segments", "key", "time_us", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    segments: _containers.RepeatedCompositeFieldContainer[FindSegmentRef]
    key: bytes
    time_us: int
    limit: int
    def __init__(self, queue: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[FindSegmentRef, _Mapping]]] = ..., key: _Optional[bytes] = ..., time_us: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class FindMatch(_message.Message):
    __slots__ = ("seg", "offset", "seq", "timestamp_us")
    SEG_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    seg: int
    offset: int
    seq: int
    timestamp_us: int
    def __init__(self, seg: _Optional[int] = ..., offset: _Optional[int] = ..., seq: _Optional[int] = ..., timestamp_us: _Optional[int] = ...) -> None: ...

class FindSegmentResult(_message.Message):
    __slots__ = ("seg", "readable_end", "index")
    SEG_FIELD_NUMBER: _ClassVar[int]
    READABLE_END_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    seg: int
    readable_end: int
    index: str
    def __init__(self, seg: _Optional[int] = ..., readable_end: _Optional[int] = ..., index: _Optional[str] = ...) -> None: ...

class FindResponse(_message.Message):
    __slots__ = ("matches", "segments")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[FindMatch]
    segments: _containers.RepeatedCompositeFieldContainer[FindSegmentResult]
    def __init__(self, matches: _Optional[_Iterable[_Union[FindMatch, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[FindSegmentResult, _Mapping]]] = ...) -> None: ...

class SealManyRequest(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentRef]
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentRef, _Mapping]]] = ...) -> None: ...

class SealManyResult(_message.Message):
    __slots__ = ("segment", "end", "error")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    segment: SegmentRef
    end: SegmentEnd
    error: str
    def __init__(self, segment: _Optional[_Union[SegmentRef, _Mapping]] = ..., end: _Optional[_Union[SegmentEnd, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class SealManyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SealManyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SealManyResult, _Mapping]]] = ...) -> None: ...

class ProduceLinkHello(_message.Message):
    __slots__ = ("token", "read", "local_acks", "watch")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ACKS_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    token: str
    read: bool
    local_acks: bool
    watch: ReplicaSegment
    def __init__(self, token: _Optional[str] = ..., read: _Optional[bool] = ..., local_acks: _Optional[bool] = ..., watch: _Optional[_Union[ReplicaSegment, _Mapping]] = ...) -> None: ...

class ProduceLinkAnswer(_message.Message):
    __slots__ = ("response", "error_json", "error_text", "synced")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    response: ProduceResponse
    error_json: str
    error_text: str
    synced: ReplicaSegment
    def __init__(self, response: _Optional[_Union[ProduceResponse, _Mapping]] = ..., error_json: _Optional[str] = ..., error_text: _Optional[str] = ..., synced: _Optional[_Union[ReplicaSegment, _Mapping]] = ...) -> None: ...

class ReadLinkAnswer(_message.Message):
    __slots__ = ("response", "error_json", "error_text", "end")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    response: FetchResponse
    error_json: str
    error_text: str
    end: bool
    def __init__(self, response: _Optional[_Union[FetchResponse, _Mapping]] = ..., error_json: _Optional[str] = ..., error_text: _Optional[str] = ..., end: _Optional[bool] = ...) -> None: ...
