"""How batches travel in gRPC messages, for every stream that carries them (producer → master,
master → slave): the channel options and the split into stream messages.

A broker accepts a request of at most REQUEST_BYTES plus one batch (``server_options``), so
every sender splits with ``chunks``: a chunk ends at the first batch that takes it past
REQUEST_BYTES, whatever lists the batches were handed over in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

# Large batches ride in one gRPC message: lift gRPC's 4 MiB default on every channel/server.
# Reconnect quickly after a broker restarts (attempts 100 ms apart, at most 1 s), but give each
# attempt CONNECT_ATTEMPT_MS to finish TCP, TLS and HTTP/2: gRPC core takes
# ``min_reconnect_backoff_ms`` as the *minimum connect timeout* (doc/connection-backoff.md), so
# at 100 ms a handshake slower than that on a busy machine failed the call at once with
# UNAVAILABLE "timed out before receiving SETTINGS frame", whatever the call's own deadline.
CONNECT_ATTEMPT_MS = 10_000  # as long as a broker waits for a handshake (handshake_timeout_ms)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", CONNECT_ATTEMPT_MS),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
REQUEST_BYTES = 8 << 20  # split outgoing stream messages at about this size (a broker's receive limit)
# The producer's pipelined stream splits at about this size instead: the master reads a request
# whole before it places any of its batches, so a request is forwarded, synced and acked as one,
# and its size is the step in which a deep window's acks come back. 8 MiB steps came ~0.3 s
# apart on a quiet box and over 1 s apart under load, against a 2 s ack deadline (issue 39).
# (Master → slave splits at a step of its own within a window of bytes: broker_group/replication.py.)
PRODUCE_STEP_BYTES = 1 << 20


def chunks(batches: Iterable[bytes], limit: int = REQUEST_BYTES) -> Iterator[list[bytes]]:
    """``batches`` in order, cut into lists of at most ``limit`` bytes, or one batch when a
    single batch is larger (never empty lists)."""
    chunk: list[bytes] = []
    size = 0
    for b in batches:
        if chunk and size + len(b) > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(b)
        size += len(b)
    if chunk:
        yield chunk
