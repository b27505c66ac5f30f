"""How far a mirror's copy is behind its source, in messages and in seconds, as Prometheus
series (``ordq_mirror_*``) and for ``ordq mirror status``.

The source side is read through its coordinator and replicas (``SourceProbe``), so the lag
shows while the target is unreachable or no instance leads: the last source seq the copy
holds is what this process acked last, else the mirror subscription's committed cursor (which
never passes what the target holds). ``lag_seconds`` is the age of the oldest source message
not yet copied (0 when none waits).

Rules: the probe runs on its own thread, once per ``every_s``; a scrape only reads its last
result (a cluster that does not answer never blocks a scrape).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import attrs
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ordq.common.errors import OrdqError
from ordq.common.metrics import ServedCollector
from ordq.mirror.config import MirrorEnd

log = logging.getLogger("ordq.mirror")


@attrs.frozen
class Lag:
    source_last_seq: int | None  # the source's last readable seq (None: unknown now)
    copied_seq: int | None  # the last source seq the copy holds (as known here)
    messages: int | None
    seconds: float | None
    at: float  # time.time() of the reading


class SourceProbe:
    """The source queue's readable end, a subscription's cursor and a message's timestamp."""

    def __init__(self, end: MirrorEnd, subscription: str) -> None:
        from ordq.sdk._cluster import open_coordinator
        from ordq.sdk.replicas import DescribedQueues, ReplicaReader
        from ordq.wire.client import GrpcTransport

        self.end, self.subscription = end, subscription
        self.coord, creds = open_coordinator(None, end.zk_hosts, end.root, None)
        self.store = DescribedQueues(self.coord)
        self.reader = ReplicaReader(self.store, GrpcTransport(rpc_timeout_s=1.0, credentials=creds))
        self._ts: dict[int, int] = {}

    def close(self) -> None:
        self.reader.close()
        self.coord.close()

    def last_seq(self) -> int | None:
        from ordq.sdk.replicas import last_readable_seq

        st, _ = self.store.load_state(self.end.queue)
        return last_readable_seq(st, self.reader.extents(st))

    def cursor_seq(self) -> int | None:
        """The subscription's committed last seq (None: no such subscription yet)."""
        from ordq.common.errors import SubscriptionNotFound

        try:
            got = self.coord.describe(self.end.queue, subscription=self.subscription, timeout_s=2.0)
        except SubscriptionNotFound:
            return None
        return got.cursor.last_seq if got.cursor is not None else None

    def timestamp_us(self, seq: int) -> int:
        if seq not in self._ts:
            from ordq.sdk.replicas import read_message

            self._ts = {seq: read_message(self.store, self.reader, self.end.queue, seq).message.timestamp_us}
        return self._ts[seq]

    def lag(self, copied: int | None) -> Lag:
        """The lag with the copy at source seq ``copied`` (None: as the subscription's cursor says)."""
        last = self.last_seq()
        if copied is None:
            copied = self.cursor_seq()
        now = time.time()
        if last is None:
            return Lag(None, copied, None, None, now)
        behind = last - (copied if copied is not None else -1)
        if behind <= 0:
            return Lag(last, copied, 0, 0.0, now)
        first = (copied if copied is not None else -1) + 1
        try:
            age = max(now - self.timestamp_us(first) / 1e6, 0.0)
        except OrdqError:  # popped meanwhile, a replica down: unknown for now
            age = None
        return Lag(last, copied, behind, age, now)


class LagWatch:
    """Reads the lag every ``every_s`` on a thread of its own; ``latest`` is the last reading."""

    def __init__(self, probe: SourceProbe, copied: Callable[[], int | None], *, every_s: float = 1.0) -> None:
        self._probe, self._copied, self._every_s = probe, copied, every_s
        self.latest: Lag | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ordq-mirror-lag", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.latest = self._probe.lag(self._copied())
            except OrdqError as exc:
                log.debug("mirror lag not read: %s", exc)
            self._stop.wait(self._every_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._probe.close()


@attrs.frozen
class MirrorSnapshot:
    state: str
    copied: int
    skipped: int
    retries: int
    leaderships: int
    lag: Lag | None


STATES = ("starting", "standby", "leading", "waiting")


class MirrorMetrics(ServedCollector):
    """The mirror's series, labelled with source and target (``cluster/queue``): one sample per
    mirror this process runs (one per partition of a topic)."""

    def __init__(self, parts: Sequence[tuple[dict[str, str], Callable[[], MirrorSnapshot]]], *,
                 registry: CollectorRegistry | None = None, listen: str | None = None) -> None:
        self._parts = list(parts)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.register_and_serve(listen)

    def collect(self) -> Iterator[Metric]:
        snaps = [(labels, snapshot()) for labels, snapshot in self._parts]
        names = list(self._parts[0][0]) if self._parts else ["source", "target"]

        def family(kind: str, name: str, doc: str, value: Callable[[MirrorSnapshot], float]) -> Metric:
            out = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=names)
            for labels, snap in snaps:
                out.add_metric([labels[n] for n in names], value(snap))
            return out

        def lag_messages(snap: MirrorSnapshot) -> float:
            return snap.lag.messages if snap.lag is not None and snap.lag.messages is not None else -1

        def lag_seconds(snap: MirrorSnapshot) -> float:
            return snap.lag.seconds if snap.lag is not None and snap.lag.seconds is not None else -1

        yield family("counter", "ordq_mirror_copied_messages", "Source messages this process copied to the target "
                     "(acked there)", lambda s: s.copied)
        yield family("counter", "ordq_mirror_skipped_messages", "Source messages the target held already (dropped)",
                     lambda s: s.skipped)
        yield family("counter", "ordq_mirror_retries", "Attempts after a cluster could not be reached",
                     lambda s: s.retries)
        yield family("counter", "ordq_mirror_leaderships", "Times this process became the mirror's leader",
                     lambda s: s.leaderships)
        yield family("gauge", "ordq_mirror_leader", "1 while this process leads the mirror (copies)",
                     lambda s: int(s.state == "leading"))
        yield family("gauge", "ordq_mirror_waiting", "1 while a cluster cannot be reached and the mirror waits",
                     lambda s: int(s.state == "waiting"))
        yield family("gauge", "ordq_mirror_lag_messages", "Source messages not yet on the target (-1: unknown)",
                     lag_messages)
        yield family("gauge", "ordq_mirror_lag_seconds", "Age of the oldest source message not yet on the target "
                     "(0: none waits; -1: unknown)", lag_seconds)
