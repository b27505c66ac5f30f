"""The coordinator's status page: ``/status`` (a page that redraws itself every second from
``/status.json``) and ``/status.json`` (every queue as ``ordq queue describe --json`` shows it,
the failovers this daemon saw, and each mirror's lag as ``ordq.admin.mirrors`` reads it), served
beside ``/metrics``.

Rules: read-only. The document is built per request (ZooKeeper reads and one size/end probe
per segment replica, each bounded by a short RPC timeout), never in the duty loop.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ordq.common.errors import CorruptState, NotFound, OrdqError
from ordq.common.metrics import Page

if TYPE_CHECKING:
    from ordq.coordinator.daemon import CoordinatorDaemon

PROBE_TIMEOUT_S = 0.5  # per replica RPC while building the page: a dead one must not stall it


def status_document(daemon: CoordinatorDaemon) -> dict[str, Any]:
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
        mirrors = [m.to_dict() for m in mirror_views(store, reader, views)]
    return {"generated_ms": int(time.time() * 1000), "coordinator": daemon.identifier,
            "leader": daemon.stats.is_leader, "queues": queues, "failovers": list(daemon.stats.failovers),
            "mirrors": mirrors}


def pages(daemon: CoordinatorDaemon) -> dict[str, Page]:
    def document() -> tuple[str, bytes]:
        try:
            doc = status_document(daemon)
        except OrdqError as exc:  # ZooKeeper away: say so on the page instead of failing it
            doc = {"generated_ms": int(time.time() * 1000), "error": str(exc), "queues": [], "failovers": []}
        return "application/json", json.dumps(doc).encode()

    return {"/status": lambda: ("text/html; charset=utf-8", PAGE.encode()), "/status.json": document}


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
</style></head>
<body>
<h1>ordq</h1>
<p>updated <span id="updated">never</span> <span id="error"></span></p>
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
    el("th", {}, "last seq"), el("th", {}, "lag"), el("th", {}, "consumer"), el("th", {}, "blocked")),
    ...q.subscriptions.map(s => el("tr", {"data-subscription": s.subscription}, el("td", {}, s.subscription),
      el("td", {}, String(s.last_seq)), el("td", {}, String(s.lag ?? "?")), el("td", {}, s.held_by || "-"),
      el("td", {}, s.blocked ? `seq ${s.blocked.seq} (${s.blocked.attempts} attempts)` : "-"))));
  return el("section", {"data-queue": q.queue, "data-head": q.head || ""},
    el("h2", {}, `${q.queue} (head ${q.head || "none"}, epoch ${q.producer_epoch}, last seq ${q.last_seq ?? "?"})`),
    "send list", send, "consume list", consume, groups, subs);
}
async function refresh() {
  try {
    const doc = await (await fetch("status.json", {cache: "no-store"})).json();
    document.getElementById("queues").replaceChildren(...doc.queues.map(queueSection));
    document.getElementById("failovers").replaceChildren(...doc.failovers.slice().reverse().map(f =>
      el("li", {"data-queue": f.queue}, `${new Date(f.at_ms).toLocaleTimeString()} ${f.queue}: ` +
         `${f.from} -> ${f.to || "none"} (segment ${f.seg ?? "?"})`)));
    document.getElementById("mirrors").replaceChildren(...(doc.mirrors || []).length ? [el("tr", {},
      ...["queue", "to", "copied seq", "lag (messages)", "lag (seconds)", "mirror"].map(h => el("th", {}, h))),
      ...doc.mirrors.map(m => el("tr", {"data-mirror": m.subscription, "data-queue": m.queue},
        el("td", {}, m.queue), el("td", {}, m.target), el("td", {}, String(m.copied_seq)),
        el("td", {}, String(m.lag_messages ?? "?")),
        el("td", {}, m.lag_seconds === null ? "?" : m.lag_seconds.toFixed(1)),
        el("td", {}, m.held_by || "-")))] : []);
    document.getElementById("error").textContent = doc.error || "";
    document.getElementById("updated").textContent = new Date(doc.generated_ms).toLocaleTimeString();
  } catch (e) {
    document.getElementById("error").textContent = "coordinator not answering: " + e;
  }
  setTimeout(refresh, 1000);
}
refresh();
</script>
</body></html>
"""
