"""Bringing this broker's copies to what ZooKeeper decided (DESIGN §4, Reconcile).

Guarantees:
- A copy of a segment sealed in ZooKeeper ends exactly at the decided ``end``: longer copies
  are truncated, shorter or corrupt ones are completed (or rebuilt) from the peer, before the
  segment is served past what this copy holds (``ReadPath.fetch`` refuses until then).
- After a new disk (``SegmentStore.load_folder``), every segment of this group opened before the
  folder existed is copied from the peer once sealed, so the group holds two copies again.
- The files of a segment popped from the consume list (read by every subscription, or dropped
  by retention) and of a deleted queue are removed (``Broker.free_space``), on both replicas.

One thread runs a round every ``reconcile_interval_s``, or at once when ``kick`` is set; the
Reconcile RPC (a coordinator's Seal protocol asking) runs the same ``reconcile``.

Whoever asks, the two numbers that decide what happens to the bytes come from ZooKeeper,
never from the request: the end is the sealed end ZooKeeper records for the segment (a
request naming another end is refused: it could only cut acked messages off, or ask for
more than was ever written), and the copy comes from the group's registered other member
(its liveness node), never from an address a caller names (it could serve forged batches).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ordq.broker_group import log as seglog
from ordq.broker_group.replica import Role
from ordq.broker_group.segments import FREE_PER_ROUND, SegmentStore
from ordq.broker_group.shared import Segment, Shared
from ordq.common.errors import BrokerUnavailable, ConfigError, OrdqError, QueueNotFound, SegmentNotFound
from ordq.coordinator.state import SegStatus
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import short

if TYPE_CHECKING:
    from ordq.coordinator.store import ZkStore
    from ordq.coordinator.store_values import LiveInfo

log = logging.getLogger("ordq.broker")


class Repairer:
    def __init__(self, shared: Shared, segments: SegmentStore,
                 on_sealed: Callable[[Segment], None] = lambda s: None) -> None:
        self.shared = shared
        self.segments = segments
        self.on_sealed = on_sealed  # builds the reconciled copy's key and time index (finder.py)
        self.kick = threading.Event()  # run a round now (a reader found a copy to complete)

    def run(self) -> None:
        """The reconcile thread: a round per interval, never ended by an error."""
        while not self.shared.stopping:
            try:
                self._round()
            except OrdqError as exc:
                log.info("reconcile round deferred: %s", exc)
            except Exception:  # a bug must not silently end reconciliation for good
                log.exception("reconcile round failed")
            self.kick.wait(self.shared.config.reconcile_interval_s)
            self.kick.clear()

    def reconcile_request(self, queue: str, seg: int, end: int, peer: str) -> pb.SegmentEnd:
        """The Reconcile RPC: ``end`` and ``peer`` are only cross-checked against ZooKeeper's
        sealed end and the group's registered peer; a request that disagrees is refused
        (ConfigError) and changes nothing."""
        z, _ = self.segments.zk_segment(queue, seg)
        if z is None or z.gid != self.shared.config.gid:
            raise SegmentNotFound(queue, seg)
        if z.status is not SegStatus.SEALED or z.end is None:
            raise ConfigError(f"Reconcile {short(queue)}/{seg}: ZooKeeper records no sealed end for it yet "
                              f"(status {z.status.value}); a copy is brought to a sealed end only")
        if end != z.end:
            raise ConfigError(f"Reconcile {short(queue)}/{seg} to end {end}: ZooKeeper records sealed end {z.end}")
        if peer:
            live = self._live_peer()
            if live is None or live.address != peer:
                raise ConfigError(f"Reconcile {short(queue)}/{seg} from {short(peer)}: not this group's registered "
                                  f"peer ({live.address if live else 'none is live'}); copies come from it only")
        return self.reconcile(queue, seg, z.end)

    def reconcile(self, queue: str, seg: int, end: int) -> pb.SegmentEnd:
        """Make this copy of a sealed segment exactly ``end`` messages long (ZooKeeper's sealed
        end: the callers read it there): truncate past it, or copy [our end, end) from the
        group's registered peer. A corrupt copy is set aside and copied whole."""
        from ordq.wire.client import GrpcTransport

        cfg = self.shared.config
        s = self.segments.for_control(queue, seg, to_copy=True)
        with self.shared.cv:
            s.replica.freeze("sealed")
            self.shared.settle(s)
        if s.recorded is not None and end > 0:  # kept as a record (sealed empty): a copy needs its files
            self.segments.materialize(s)
        with s.io_lock:
            if s.log is None:  # corrupt: keep the evidence, rebuild from the peer
                bad = s.directory / "segment.log"
                if bad.exists():
                    bad.rename(s.directory / f"segment.log.corrupt-{int(time.time())}")
                s.log = seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg, create=True)
            lg = s.log
            if lg.synced_end > end:
                lg.truncate(end)
            if lg.synced_end < end:
                live = self._live_peer()
                if live is None:
                    raise BrokerUnavailable(f"group {cfg.gid}", f"no live peer to copy {queue}/{seg} from")
                peer = live.address  # from ZooKeeper: never an address a caller named
                transport = GrpcTransport(rpc_timeout_s=cfg.rpc_timeout_s, credentials=cfg.credentials)
                try:
                    while lg.synced_end < end:
                        res = transport.fetch(peer, queue, seg, lg.synced_end, max_bytes=8 << 20, max_wait_ms=0,
                                              known_end=end)
                        if not res.batches:
                            raise BrokerUnavailable(peer, f"peer holds only {res.readable_end} of {end} messages")
                        for batch in res.batches:
                            if batch_format.parse_header(batch).end_offset <= end:
                                lg.append(batch)
                        lg.sync()
                finally:
                    transport.close()
        with self.shared.cv:
            s.replica.seal()
            s.replica.restored(end=lg.synced_end, first_seq=lg.first_seq, last_seq=lg.last_seq)
            s.corrupt = None
            s.reconciled = True
            self.shared.stats.reconciled += 1
            out = s.end()
            self.shared.changed()
        self.segments.write_meta(s)
        if s.recorded is None:
            self.on_sealed(s)
        log.info("segment %s/%d reconciled to end %d", queue, seg, end)
        return out

    def _live_peer(self) -> LiveInfo | None:
        store = self.shared.require_store()
        peer_role = "slave" if self.shared.config.role is Role.MASTER else "master"
        return store.live_members(self.shared.config.gid).get(peer_role)

    def _round(self) -> None:
        store = self.shared.require_store()
        self.segments.free_space(limit=FREE_PER_ROUND)
        try:
            self._reconcile_round(store)
        finally:
            # After the copies: what the start set aside (thousands of folders after a failover
            # at 10^5 queues) must not hold a copy a reader waits for.
            self.segments.finish_removals()

    def _reconcile_round(self, store: ZkStore) -> None:
        if self.segments.refill:
            self._refill_round()
        with self.shared.cv:
            todo = [s for s in self.shared.segments.values() if not s.reconciled]
        # The states of the queues to look at, read pipelined (issue 43: one read after another,
        # ~33,000 of them on a start at 10^5 queues). A sealed end never changes, so a state read
        # a moment before the segment is looked at says the same of it.
        states = {queue: got[0] for queue, got in store.load_states(sorted({s.key[0] for s in todo})).items()
                  if not isinstance(got, OrdqError)}
        for s in todo:
            queue, seg = s.key
            st = states.get(queue)
            if st is None:  # deleted meanwhile (free_space drops it), or its state does not parse
                continue
            z = st.segment(seg)
            if z is None:
                continue  # popped: free_space removes it
            if z.status is not SegStatus.SEALED or z.gid != self.shared.config.gid:
                continue
            assert z.end is not None
            with self.shared.cv:
                exact = s.replica.sealed and s.replica.local_synced == z.end and s.corrupt is None
            if exact:
                s.reconciled = True
                continue
            peer = self._live_peer()
            with self.shared.cv:
                needs_peer = s.corrupt is not None or s.replica.local_synced < z.end
            if needs_peer and peer is None:
                continue  # try again when the peer is back
            try:
                self.reconcile(queue, seg, z.end)
            except OrdqError as exc:
                log.warning("segment %s/%d: reconcile to end %d deferred: %s", queue, seg, z.end, exc)

    def _refill_round(self) -> None:
        """After a new disk: copy from the peer every segment of this group that was opened
        before the folder existed, once ZooKeeper shows it sealed, so the group holds two
        copies again. A queue is done when none of those is left uncopied."""
        store = self.shared.require_store()
        peer = self._live_peer()
        for queue in sorted(self.segments.refill):
            try:
                st, _ = store.load_state(queue)
            except QueueNotFound:
                self.segments.refill.discard(queue)
                continue
            waiting = False
            for z in st.consume:
                if z.seg >= self.segments.born_at[queue] or z.gid != self.shared.config.gid:
                    continue
                with self.shared.cv:
                    if (queue, z.seg) in self.shared.segments:
                        continue
                if z.status is not SegStatus.SEALED or peer is None:
                    waiting = True  # copied once sealed, from a live peer
                    continue
                assert z.end is not None
                try:
                    self.reconcile(queue, z.seg, z.end)
                    log.info("segment %s/%d copied from the peer (opened before this data folder existed)",
                             queue, z.seg)
                except OrdqError as exc:
                    waiting = True
                    log.warning("segment %s/%d: copy from the peer deferred: %s", queue, z.seg, exc)
            if not waiting:
                self.segments.refill.discard(queue)
                log.info("queue %s: every segment of this group opened before this data folder is copied", queue)
