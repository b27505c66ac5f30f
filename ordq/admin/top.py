"""Frames of ``ordq top``: samples of every queue's view, and rates between two samples."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from ordq.admin.mirrors import MirrorLagView, mirror_views
from ordq.admin.queue_views import QueueView, describe_queue
from ordq.common.errors import NotFound
from ordq.coordinator.store import ZkStore
from ordq.sdk.replicas import ReplicaReader

# -- top ---------------------------------------------------------------------------------------


@attrs.frozen
class Sample:
    at_s: float  # monotonic
    views: dict[str, QueueView]
    mirrors: tuple[MirrorLagView, ...] = ()  # the queues' mirrors (ordq.admin.mirrors)


def sample(store: ZkStore, reader: ReplicaReader, queues: Sequence[str] | None = None,
           *, clock: Callable[[], float] = time.monotonic,
           select: Callable[[list[str]], list[str]] | None = None) -> Sample:
    """``queues`` (all if None); ``select``: of those, the ones to describe (a page)."""
    names = list(queues) if queues else store.list_queues()
    if select is not None:
        names = select(names)
    views = {}
    for q in names:
        try:
            views[q] = describe_queue(store, reader, q)
        except NotFound:
            if queues:
                raise
            continue  # deleted meanwhile
    return Sample(clock(), views, tuple(mirror_views(store, reader, views)))


def _rate(now: int | None, before: int | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0:
        return None
    return round(max(0, now - before) / seconds, 1)


def _max_lag(v: QueueView) -> int | None:
    lags = [s.lag for s in v.subscriptions]
    if not lags or any(x is None for x in lags):
        return None
    return max(x for x in lags if x is not None)


def top_frame(cur: Sample, prev: Sample | None = None) -> dict[str, Any]:
    """One frame of ``ordq top``: per queue and per subscription, with rates against ``prev``."""
    seconds = cur.at_s - prev.at_s if prev is not None else 0.0
    queues, subs = [], []
    for name, v in cur.views.items():
        before = prev.views.get(name) if prev is not None else None
        st = v.state
        queues.append({
            "queue": name, "head": st.head, "send": list(st.send),
            "consume_head": st.consume[0].seg if st.consume else None,
            "open_segment": st.open_segment.seg if st.open_segment else None,
            "segments": len(st.consume), "last_seq": v.last_seq, "stored": v.stored,
            "produce_rate": _rate(v.last_seq, before.last_seq if before else None, seconds),
            "subscriptions": len(v.subscriptions), "max_lag": _max_lag(v),
        })
        old = {s.name: s for s in before.subscriptions} if before else {}
        for s in v.subscriptions:
            was = old.get(s.name)
            subs.append({"queue": name, "subscription": s.name, "seg": s.cursor.seg, "last_seq": s.cursor.last_seq,
                         "lag": s.lag, "held_by": s.held_by, "blocked": s.blocked,
                         "consume_rate": _rate(s.cursor.last_seq, was.cursor.last_seq if was else None, seconds)})
    return {"interval_s": round(seconds, 3) if prev is not None else None, "queues": queues, "subscriptions": subs,
            "mirrors": [m.to_dict() for m in cur.mirrors]}


def frames(store: ZkStore, reader: ReplicaReader, queues: Sequence[str] | None, interval_s: float,
           *, sleep: Callable[[float], None] = time.sleep,
           select: Callable[[list[str]], list[str]] | None = None) -> Iterator[dict[str, Any]]:
    """Frames forever, one every ``interval_s``; rates are over the last interval."""
    prev = sample(store, reader, queues, select=select)
    while True:
        sleep(max(0.0, interval_s - (time.monotonic() - prev.at_s)))
        cur = sample(store, reader, queues, select=select)
        yield top_frame(cur, prev)
        prev = cur
