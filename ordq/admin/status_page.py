"""The coordinator's status page: ``/status`` (a page that redraws itself every second from
``/status.json``) and ``/status.json`` (every queue as ``ordq queue describe --json`` shows it,
each subscription with its parked count, each keyed topic with its partitions and their sums,
the failovers this daemon saw, and each mirror's lag as ``ordq.admin.mirrors`` reads it), served
beside ``/metrics``.

Rules: read-only. The document is built per request (ZooKeeper reads and one size/end probe
per segment replica, each bounded by a short RPC timeout), never in the duty loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ordq.admin.history import INTERVAL_S, History, sample_of
from ordq.common.errors import CorruptState, NotFound, OrdqError
from ordq.common.metrics import Page

if TYPE_CHECKING:
    from ordq.coordinator.daemon import CoordinatorDaemon

log = logging.getLogger("ordq.status_page")
# The coordinator's sweep of its cluster's processes: rows as ``ProcessStatus.to_dict()`` gives them.
Processes = Callable[[Any], list[dict[str, Any]]]
# The sampler builds the page's document itself (ZooKeeper reads per queue, a probe per replica)
# only up to this many queues; above, only a viewer's documents are sampled (issue 43: a
# coordinator of 10^5 queues must not pay for a page nobody reads).
AUTO_SAMPLE_MAX_QUEUES = 500
# ... and only for an hour after someone last loaded the page: a coordinator nobody watches does
# no work for it (a sample is a describe of every queue, and was also a health call to every
# process; with it in every coordinator, tests/test_under_load.py failed twice in a row, its
# consumer's Subscribe unanswered for 10 s beside six busy loops).
VIEWED_S = 3600.0
PROBE_TIMEOUT_S = 0.5  # per replica RPC while building the page: a dead one must not stall it


def status_document(daemon: CoordinatorDaemon, *, queues_only: bool = False,
                    processes: Processes | None = None) -> dict[str, Any]:
    """The page's document; ``queues_only``: without the processes' health and the mirrors
    (what a history sample needs: no RPC to every process of the cluster). ``processes``: see
    ``cluster_processes``."""
    from ordq.admin.mirrors import mirror_views
    from ordq.admin.queue_views import QueueView, describe_queue
    from ordq.sdk.replicas import ReplicaReader

    store = daemon.store
    queues = []
    views: dict[str, QueueView] = {}
    with ReplicaReader(store, rpc_timeout_s=PROBE_TIMEOUT_S) as reader:
        for queue in store.list_queues():
            try:
                views[queue] = describe_queue(store, reader, queue)
                queues.append(views[queue].to_dict())
            except NotFound:
                continue  # deleted meanwhile
            except CorruptState as exc:  # that queue's line only; the page shows the others
                queues.append({"queue": queue, "corrupt": exc.detail, "error": str(exc)})
        mirrors = [] if queues_only else [m.to_dict() for m in mirror_views(store, reader, views)]
    rows, leader = ([], None) if queues_only else cluster_processes(store, processes)
    add_parked(queues)
    return {"generated_ms": int(time.time() * 1000), "coordinator": daemon.identifier,
            "leader": daemon.stats.is_leader, "queues": queues, "failovers": list(daemon.stats.failovers),
            "processes": rows, "coordinator_leader": leader, "mirrors": mirrors,
            "topics": [] if queues_only else topic_rows(queues, store.list_topics())}


def add_parked(queues: list[dict[str, Any]]) -> None:
    """Each subscription's ``parked``: the messages stored in its parking queue
    (``sdk/failure.py``: where a consumer with ``on_failure="park"`` sets aside what it could not
    handle), 0 without one, None when that queue's replicas did not say (issue 42: the page had
    no parked count)."""
    from ordq.sdk.failure import parking_queue

    stored = {q["queue"]: q.get("stored") for q in queues if "corrupt" not in q}
    for q in queues:
        for sub in q.get("subscriptions", ()):
            name = parking_queue(q["queue"], sub["subscription"])
            sub["parked"] = stored.get(name, 0)


def _sum(values: list[Any]) -> int | None:
    return None if any(v is None for v in values) else sum(values)


def topic_rows(queues: list[dict[str, Any]], topics: list[str]) -> list[dict[str, Any]]:
    """One row per keyed topic (issue 42: a topic's partitions were scattered among the queues):
    its partitions' names in partition order and what they sum to (stored messages; per
    subscription, lag and parked), None where one partition's figure is unknown. A partition
    whose state is corrupt counts as unknown."""
    from ordq.coordinator.topics import PARTITION_SEPARATOR, topic_of

    wanted = set(topics)
    parts: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
    for q in queues:
        topic = topic_of(q["queue"])
        if topic in wanted:
            parts[topic].append(q)
    rows = []
    for topic in topics:
        members = sorted(parts[topic], key=lambda q: int(q["queue"].rsplit(PARTITION_SEPARATOR, 1)[1]))
        subs: dict[str, dict[str, list[Any]]] = {}
        for q in members:
            for sub in q.get("subscriptions", ()):
                row = subs.setdefault(sub["subscription"], {"lag": [], "parked": []})
                row["lag"].append(sub.get("lag"))
                row["parked"].append(sub.get("parked"))
        rows.append({
            "topic": topic, "partitions": [q["queue"] for q in members],
            "stored": _sum([None if "corrupt" in q else q.get("stored") for q in members]),
            "subscriptions": [{"subscription": name, "lag": _sum(v["lag"]), "parked": _sum(v["parked"]),
                               "partitions": len(v["lag"])} for name, v in sorted(subs.items())],
        })
    return rows


def cluster_processes(store: Any, processes: Processes | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Every process of the cluster with its health and version, and the coordinator leader's
    name; ([], None) when that fails (the rest of the page still shows). ``processes(store)``:
    the coordinator's own sweep, the one ``ordq status`` asks for (``cluster status``), over the
    broker channels it keeps (issue 42: the page opened a channel, a TLS handshake, to every
    broker at each load); without it, a sweep over channels made for this page."""
    from ordq.cluster_live import live_status
    from ordq.common.security import of_store

    try:
        rows = (processes(store) if processes is not None else
                [s.to_dict() for s in live_status(store, store.hosts, of_store(store), rpc_timeout_s=PROBE_TIMEOUT_S)])
    except Exception:  # noqa: BLE001 - one part of the page: the queues still show
        log.debug("process status failed", exc_info=True)
        return [], None
    leader = next((r["name"] for r in rows if r["kind"] == "coordinator" and r["state"] == "leader"), None)
    return rows, leader


class Sampler:
    """Keeps ``history`` fed (issue 42: rates and lag over time): a sample every ``interval_s``
    from the document a viewer asked for, else from one built for it by a thread while this
    coordinator leads (a standby's view is stale), has at most ``AUTO_SAMPLE_MAX_QUEUES`` and a
    viewer loaded the page within ``VIEWED_S``; those samples leave out the processes and mirrors."""

    def __init__(self, daemon: CoordinatorDaemon, history: History, *, interval_s: float = INTERVAL_S) -> None:
        self.daemon = daemon
        self.history = history
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last = float("-inf")  # time.monotonic() of the last sample
        self._viewed = float("-inf")  # time.monotonic() of a viewer's last document
        self._thread: threading.Thread | None = None

    def viewed(self, now: float) -> None:
        """A viewer asked for the page: the thread samples for the next ``VIEWED_S``."""
        self._viewed = now

    def offer(self, doc: dict[str, Any], now: float) -> bool:
        """Keep a sample of ``doc`` unless one was kept less than ``interval_s`` ago (97 %:
        a viewer's refresh and the thread's tick must not both count)."""
        with self._lock:
            if now - self._last < self.interval_s * 0.97 or "error" in doc:
                return False
            self._last = now
            self.history.add(sample_of(doc, int(doc.get("generated_ms", time.time() * 1000))))
            return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="status-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(max(0.5, self._last + self.interval_s - time.monotonic()))
            st = self.daemon.stats
            now = time.monotonic()
            if now - self._last < self.interval_s * 0.97 or not st.is_leader \
                    or len(st.queues) > AUTO_SAMPLE_MAX_QUEUES or now - self._viewed > VIEWED_S:
                continue
            try:
                self.offer(status_document(self.daemon, queues_only=True), time.monotonic())
            except Exception:  # noqa: BLE001 - ZooKeeper away, a queue mid-change: the next tick tries again
                log.debug("status sample failed", exc_info=True)


def pages(daemon: CoordinatorDaemon, *, prometheus_url: str | None = None,
          processes: Processes | None = None) -> dict[str, Page]:
    """``/status`` and ``/status.json``; ``prometheus_url``: the charts' history is read from that
    Prometheus (``ordq.admin.prom_history``), the ring buffer's only while it does not answer;
    ``processes``: the coordinator's sweep of its cluster's processes (``cluster_processes``)."""
    sampler = Sampler(daemon, History())
    sampler.start()
    prom = None
    if prometheus_url:
        from ordq.admin.prom_history import PromHistory

        prom = PromHistory(prometheus_url)

    def document() -> tuple[str, bytes]:
        try:
            doc = status_document(daemon, processes=processes)
            sampler.viewed(time.monotonic())
            sampler.offer(doc, time.monotonic())
        except OrdqError as exc:  # ZooKeeper away: say so on the page instead of failing it
            doc = {"generated_ms": int(time.time() * 1000), "error": str(exc), "queues": [], "failovers": []}
        history = sampler.history
        doc["busiest"] = history.busiest()[:20]
        doc["history"] = history_of(sampler, doc["busiest"], prom)
        return "application/json", json.dumps(doc).encode()

    return {"/status": lambda: ("text/html; charset=utf-8", PAGE.encode()), "/status.json": document}


def history_of(sampler: Sampler, busiest: list[str], prom: Any = None) -> dict[str, Any]:
    """The charts' series: from Prometheus (``prom``, a ``PromHistory``) when one is configured
    and answers, else from the ring buffer, with ``note`` saying why when Prometheus was asked
    and did not answer (issue 42). ``source``: ``prometheus`` or ``coordinator``."""
    note = None
    if prom is not None:
        from ordq.admin.prom_history import PrometheusUnavailable

        try:
            hist: dict[str, Any] = prom.get()
        except PrometheusUnavailable as exc:
            note = (f"Prometheus at {prom.url} does not answer ({exc}): the charts show this coordinator's own "
                    "samples")
        else:
            missing = hist.pop("missing", [])
            hist["note"] = f"charts from Prometheus at {prom.url}" + (
                f"; it has {'; '.join(missing)}" if missing else "")
            return hist
    hist = sampler.history.series(busiest)
    hist.update(interval_s=sampler.interval_s, source="coordinator")
    if note is not None:
        hist["note"] = note
    return hist


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>ordq status</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222 }
section { border: 1px solid #ccc; border-radius: 6px; padding: .5em 1em; margin-bottom: 1em }
ol.groups { display: flex; gap: .5em; list-style: none; padding: 0; margin: .2em 0 }
ol.groups li { border: 1px solid #888; border-radius: 4px; padding: .2em .6em }
li.open { background: #e6f4ea } li.sealing { background: #fff4d6 } li.sealed { background: #eee }
li.down { border-color: #c00; color: #c00 }
table { border-collapse: collapse } td, th { padding: .1em .7em; text-align: left }
#error { color: #c00 }
#history-note { font-size: 12px; color: #555 }
tr.blocked td, tr.parked td, tr.unhealthy td { background: #fde2e1; color: #900; font-weight: bold }
#processes { margin-bottom: 1em }
#charts svg { border: 1px solid #ddd; margin-right: 1em; background: #fafafa }
#charts figure { display: inline-block; vertical-align: top; margin: 0 1em 0 0; width: 360px }
figcaption { font-size: 12px; color: #555 }
</style></head>
<body>
<h1>ordq</h1>
<p>updated <span id="updated">never</span> <span id="error"></span></p>
<p>coordinator leader: <b id="leader">?</b></p>
<table id="processes"></table>
<div id="charts"></div>
<p id="history-note"></p>
<p><input id="filter" type="search" placeholder="filter queues" autocomplete="off">
   <span id="shown"></span> (busiest first)</p>
<div id="queues"></div>
<h2>Recent failovers</h2>
<ul id="failovers"></ul>
<h2>Mirrors</h2>
<table id="mirrors"></table>
<script>
"use strict";
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}
function bytes(n) { return n === null || n === undefined ? "?" : n.toLocaleString() + " B"; }
function roles(g) { return ["master", "slave"].map(r => r + (g.live.includes(r) ? " up" : " down")).join(", "); }
function queueSection(q) {
  if (q.corrupt) return el("section", {"data-queue": q.queue, class: "corrupt"}, el("h2", {}, q.queue), q.error);
  const live = Object.fromEntries(q.groups.map(g => [g.group, g]));
  const send = el("ol", {class: "groups send"}, ...q.send.map(g =>
    el("li", {class: live[g] && live[g].live.length === 2 ? "" : "down"}, g)));
  const consume = el("ol", {class: "groups consume"}, ...q.consume.map(s =>
    el("li", {class: s.status + (live[s.gid] && live[s.gid].live.length ? "" : " down")},
       `seg ${s.seg} on ${s.gid}: ${s.status}, ${bytes(s.bytes)}`)));
  const groups = el("table", {class: "processes"}, el("tr", {}, el("th", {}, "group"), el("th", {}, "processes"),
    el("th", {}, "backlog"), el("th", {}, "bytes")), ...q.groups.map(g => el("tr", {"data-group": g.group},
      el("td", {}, g.group), el("td", {}, roles(g)), el("td", {}, String(g.backlog ?? "?")),
      el("td", {}, bytes(g.bytes)))));
  const subs = el("table", {class: "subscriptions"}, el("tr", {}, el("th", {}, "subscription"),
    el("th", {}, "last seq"), el("th", {}, "lag"), el("th", {}, "consumer"), el("th", {}, "blocked"),
    el("th", {}, "parked")),
    ...q.subscriptions.map(s => el("tr", {"data-subscription": s.subscription,
                                          class: s.blocked ? "blocked" : s.parked ? "parked" : ""},
      el("td", {}, s.subscription),
      el("td", {}, String(s.last_seq)), el("td", {}, String(s.lag ?? "?")), el("td", {}, s.held_by || "-"),
      el("td", {}, s.blocked ? `seq ${s.blocked.seq} (${s.blocked.attempts} attempts)` : "-"),
      el("td", {class: "parked"}, String(s.parked ?? "?")))));
  return el("section", {"data-queue": q.queue, "data-head": q.head || ""},
    el("h2", {}, `${q.queue} (head ${q.head || "none"}, epoch ${q.producer_epoch}, last seq ${q.last_seq ?? "?"})`),
    "send list", send, "consume list", consume, groups, subs);
}
// Times with their zone (issue 42: they carried none).
function when(ms) { return new Date(ms).toLocaleTimeString([], {timeZoneName: "short"}); }
const SVG = "http://www.w3.org/2000/svg";
function chart(title, t, series) {  // series: [[name, colour, values]]; a gap where a value is null
  const w = 360, h = 90, svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  const all = series.flatMap(s => s[2]).filter(v => v !== null && v !== undefined);
  const top = Math.max(1, ...all), n = Math.max(1, t.length - 1);
  for (const [name, colour, values] of series) {
    let d = "";
    values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const x = (i / n) * (w - 4) + 2, y = h - 2 - (v / top) * (h - 4);
      const joined = i > 0 && values[i - 1] !== null && values[i - 1] !== undefined;
      d += (joined ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1) + (joined ? "" : "h1");  // a lone point shows
    });
    const path = document.createElementNS(SVG, "path");
    path.setAttribute("d", d); path.setAttribute("fill", "none"); path.setAttribute("stroke", colour);
    path.setAttribute("stroke-width", "1.5"); path.setAttribute("data-series", name);
    svg.append(path);
  }
  const last = series.map(s => `${s[0]} ${fmt(s[2][s[2].length - 1])}`).join(", ");
  const span = t.length ? `${when(t[0])} - ${when(t[t.length - 1])}` : "no samples yet";
  return el("figure", {}, svg, el("figcaption", {}, `${title} (max ${fmt(top)}; now ${last}; ${span})`));
}
function fmt(v) { return v === null || v === undefined ? "-" : (Math.round(v * 10) / 10).toLocaleString(); }
function busiestFirst(doc) {
  const rank = new Map((doc.busiest || []).map((q, i) => [q, i]));
  return doc.queues.slice().sort((a, b) => (rank.get(a.queue) ?? 1e9) - (rank.get(b.queue) ?? 1e9)
    || (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0));
}
// A topic is one section (issue 42: its partitions were scattered): its sums, each subscription's
// lag and parked count over the partitions, and the partitions' own sections folded under it,
// placed where its busiest partition would be.
function topicSection(t, byName) {
  const subs = el("table", {class: "subscriptions"}, el("tr", {}, ...["subscription", "lag", "parked", "partitions"]
    .map(h => el("th", {}, h))), ...t.subscriptions.map(s => el("tr", {"data-subscription": s.subscription,
      class: s.parked ? "parked" : ""}, el("td", {}, s.subscription), el("td", {}, String(s.lag ?? "?")),
      el("td", {class: "parked"}, String(s.parked ?? "?")), el("td", {}, String(s.partitions)))));
  const parts = t.partitions.filter(p => byName.has(p)).map(p => queueSection(byName.get(p)));
  return el("section", {"data-queue": t.topic, "data-topic": t.topic, "data-partitions": t.partitions.join(" ")},
    el("h2", {}, `topic ${t.topic} (${t.partitions.length} partitions, stored ${t.stored ?? "?"})`), subs,
    el("details", {}, el("summary", {}, `${t.partitions.length} partitions`), ...parts));
}
function queueSections(doc) {
  const inTopic = new Map(), byName = new Map(doc.queues.map(q => [q.queue, q])), done = new Set(), out = [];
  for (const t of doc.topics || []) for (const p of t.partitions) inTopic.set(p, t);
  for (const q of busiestFirst(doc)) {
    const t = inTopic.get(q.queue);
    if (!t) out.push(queueSection(q));
    else if (!done.has(t.topic)) { done.add(t.topic); out.push(topicSection(t, byName)); }
  }
  return out;
}
function applyFilter() {
  const text = document.getElementById("filter").value.trim().toLowerCase();
  let shown = 0;
  for (const section of document.querySelectorAll("#queues > section")) {
    const names = [section.dataset.queue, ...(section.dataset.partitions || "").split(" ")];
    const hit = !text || names.some(n => n && n.toLowerCase().includes(text));
    section.hidden = !hit; shown += hit ? 1 : 0;
  }
  document.getElementById("shown").textContent = `${shown} queue(s) or topic(s) shown`;
}
document.getElementById("filter").addEventListener("input", applyFilter);
async function refresh() {
  try {
    const doc = await (await fetch("status.json", {cache: "no-store"})).json();
    const open = new Set([...document.querySelectorAll("#queues details[open]")].map(d => d.parentNode.dataset.topic));
    document.getElementById("queues").replaceChildren(...queueSections(doc));
    for (const d of document.querySelectorAll("#queues details")) d.open = open.has(d.parentNode.dataset.topic);
    applyFilter();
    document.getElementById("leader").textContent = doc.coordinator_leader || "none";
    document.getElementById("processes").replaceChildren(
      el("tr", {}, ...["process", "listen", "state", "healthy", "version", "detail"].map(h => el("th", {}, h))),
      ...(doc.processes || []).map(p => el("tr", {"data-process": p.name, class: p.healthy ? "" : "unhealthy"},
        el("td", {}, p.name), el("td", {}, p.listen || "-"), el("td", {}, p.state),
        el("td", {}, p.healthy ? "yes" : "no"), el("td", {}, p.version || "-"), el("td", {}, p.detail || "-"))));
    const hist = doc.history, all = hist && hist.queues["*"];
    if (all) document.getElementById("charts").replaceChildren(
      chart("messages/s, every queue", hist.t_ms, [["produced", "#1a73e8", all.produce],
                                                  ["consumed", "#188038", all.consume]]),
      chart("lag, every queue", hist.t_ms, [["lag", "#c5221f", all.lag]]));
    document.getElementById("history-note").textContent = (hist && hist.note) || "";
    document.getElementById("failovers").replaceChildren(...doc.failovers.slice().reverse().map(f =>
      el("li", {"data-queue": f.queue}, `${when(f.at_ms)} ${f.queue}: ` +
         `${f.from} -> ${f.to || "none"} (segment ${f.seg ?? "?"})`)));
    document.getElementById("mirrors").replaceChildren(...(doc.mirrors || []).length ? [el("tr", {},
      ...["queue", "to", "copied seq", "lag (messages)", "lag (seconds)", "mirror"].map(h => el("th", {}, h))),
      ...doc.mirrors.map(m => el("tr", {"data-mirror": m.subscription, "data-queue": m.queue},
        el("td", {}, m.queue), el("td", {}, m.target), el("td", {}, String(m.copied_seq)),
        el("td", {}, String(m.lag_messages ?? "?")),
        el("td", {}, m.lag_seconds === null ? "?" : m.lag_seconds.toFixed(1)),
        el("td", {}, m.held_by || "-")))] : []);
    document.getElementById("error").textContent = doc.error || "";
    document.getElementById("updated").textContent = when(doc.generated_ms);
  } catch (e) {
    document.getElementById("error").textContent = "coordinator not answering: " + e;
  }
  setTimeout(refresh, 1000);
}
refresh();
</script>
</body></html>
"""
