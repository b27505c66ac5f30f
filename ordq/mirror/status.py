"""What a target queue holds of its source: the source seq of its last message (``ordq mirror
status``), read through the target's coordinator and replicas, without any lease."""

from __future__ import annotations

from ordq.mirror.chain import resume_from
from ordq.mirror.config import MirrorEnd


def target_holds(target: MirrorEnd, source_identity: str) -> int | None:
    """The last source seq the target queue holds (None: it holds none). MirrorDiverged when
    its last message is not a copy of that source."""
    from ordq.sdk._cluster import open_coordinator
    from ordq.sdk.replicas import DescribedQueues, ReplicaReader, last_readable_seq, read_message
    from ordq.wire.client import GrpcTransport

    coord, creds = open_coordinator(None, target.zk_hosts, target.root, None)
    store = DescribedQueues(coord)
    reader = ReplicaReader(store, GrpcTransport(rpc_timeout_s=2.0, credentials=creds))
    try:
        st, _ = store.load_state(target.queue)
        last = last_readable_seq(st, reader.extents(st))
        if last is None or last < 0:
            return None
        message = read_message(store, reader, target.queue, last).message
        nxt = resume_from(target.queue, message.headers, last, source=source_identity)
        return None if nxt is None else nxt - 1
    finally:
        reader.close()
        coord.close()
