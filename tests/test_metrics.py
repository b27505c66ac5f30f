"""Prometheus metrics of every process kind, scraped over HTTP from a real cluster under load:
broker master and slave (processes), coordinator daemon (process), producer and consumer (in
this process, each on its own registry, so they do not collide). The key series must be there
and move while messages flow; and every series docs/alerts.yml alerts on must be one of them."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

import attrs
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from ordq.common.errors import SegmentNotFound
from ordq.common.metrics import Sample, parse, value
from ordq.sdk import Consumer, ConsumerConfig, FailurePolicy
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.test_everyday import N as QUEUED
from tests.test_everyday import queue_fixture  # noqa: F401 - the "queue" fixture: QUEUED messages on g1, g2
from tests.util import read_metrics, read_metrics_text, wait_until

pytestmark = pytest.mark.zk

DOCS = Path(__file__).resolve().parents[1] / "docs"
ALERTS = DOCS / "alerts.yml"
# listed in docs/OPERATIONS.md but exposed only once something happened (a seal, a conflict)
# Series with labels that appear only once something happened (a seal, a conflict, a queue
# whose state does not parse).
CONDITIONAL = {"ordq_coordinator_seal_seconds", "ordq_coordinator_conflicts_total", "ordq_coordinator_actions_total",
               "ordq_queue_state_corrupt", "ordq_coordinator_away_probes_total"}
N = 20_000

# process kind -> series (sample names) that must grow under load, with the labels to pick
MOVING: dict[str, list[tuple[str, dict[str, str]]]] = {
    "master": [("ordq_broker_produce_messages_total", {}), ("ordq_broker_produce_bytes_total", {}),
               ("ordq_broker_produce_batches_total", {}), ("ordq_broker_fsync_seconds_count", {}),
               ("ordq_broker_fetch_batches_total", {}), ("ordq_broker_fetch_bytes_total", {}),
               ("ordq_broker_fetch_messages_total", {}),
               ("ordq_broker_segment_bytes", {"queue": "q"})],
    "slave": [("ordq_broker_produce_messages_total", {}), ("ordq_broker_fsync_seconds_count", {}),
              ("ordq_broker_segment_bytes", {"queue": "q"})],
    "coordinator": [("ordq_coordinator_rounds_total", {})],
    "producer": [("ordq_producer_acked_messages_total", {}), ("ordq_producer_send_ack_seconds_count", {}),
                 ("ordq_producer_send_ack_seconds_sum", {})],
    "consumer": [("ordq_consumer_delivered_messages_total", {}), ("ordq_consumer_last_seq", {})],
}
# series that must be there (their value may stay put)
PRESENT = {
    "master": ["ordq_broker_replication_connected", "ordq_broker_replication_lag_bytes",
               "ordq_broker_replication_lag_seconds", "ordq_broker_open_segments", "ordq_broker_disk_free_bytes",
               "ordq_broker_disk_size_bytes", "ordq_broker_fsync_seconds_bucket"],
    "slave": ["ordq_broker_open_segments", "ordq_broker_disk_free_bytes"],
    "coordinator": ["ordq_coordinator_leader", "ordq_queue_send_groups", "ordq_queue_segments",
                    "ordq_queue_segments_not_live", "ordq_coordinator_errors_total"],
    "producer": ["ordq_producer_inflight_bytes", "ordq_producer_failovers_total", "ordq_producer_rolls_total",
                 "ordq_producer_epoch"],
    "consumer": ["ordq_consumer_lag_messages", "ordq_consumer_lag_seconds", "ordq_consumer_blocked",
                 "ordq_consumer_gaps_total", "ordq_consumer_redeliveries_total", "ordq_consumer_stalled_seconds"],
}


def test_every_process_kind_exposes_moving_series(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    daemon = cluster.start_daemon("coordinator-1")
    head = cluster.head()
    producer = cluster.producer(n=N, rate=4000.0)
    producer.config = attrs.evolve(producer.config, metrics_listen="127.0.0.1:0")
    consumer = cluster.consumer(until=N - 1)
    consumer.config = attrs.evolve(consumer.config, metrics_listen="127.0.0.1:0")
    producer.start()
    consumer.start()

    def client_url(load: object) -> str | None:
        client = getattr(load, "_producer", None) or getattr(load, "_consumer", None)
        return getattr(client, "metrics_url", None)

    urls = {
        "master": head.master.metrics_url,
        "slave": head.slave.metrics_url,
        "coordinator": daemon.wait_for_line("METRICS ", timeout_s=5),
        "producer": wait_until(lambda: client_url(producer), timeout_s=30, what="the producer's metrics URL"),
        "consumer": wait_until(lambda: client_url(consumer), timeout_s=30, what="the consumer's metrics URL"),
    }
    assert all(urls.values()), urls
    assert len(set(urls.values())) == len(urls), urls  # each process kind on its own endpoint
    wait_until(lambda: len(producer.acked) >= 1000, timeout_s=30, what="1000 acks")
    refused = value(read_metrics(urls["master"]), "ordq_broker_refused_requests_total", reason="SegmentNotFound") or 0
    with pytest.raises(SegmentNotFound):  # a refused request, counted by its reason
        cluster.transport.fetch(head.master.address, "q", 999, 0, max_bytes=1024, max_wait_ms=0)
    first = {kind: read_metrics(url) for kind, url in urls.items()}
    # What each process exposed when its series were seen moving, as text for promtool below:
    # by then the producer (N messages) and the consumer (until N-1) may have finished and
    # closed their endpoints (a scrape of them was refused in the loaded tier, stop 104).
    texts: dict[str, str] = {}

    def moved() -> dict[str, list[Sample]] | None:
        texts.update({kind: read_metrics_text(url) for kind, url in urls.items()})
        now = {kind: parse(text) for kind, text in texts.items()}
        for kind, series in MOVING.items():
            for name, labels in series:
                before, after = value(first[kind], name, **labels), value(now[kind], name, **labels)
                if before is None or after is None or after <= before:
                    return None
        return now

    last = wait_until(moved, timeout_s=60, interval_s=0.2, what="every key series to grow under load")
    for kind, names in PRESENT.items():
        seen = {s.name for s in last[kind]}
        assert not set(names) - seen, f"{kind}: missing {set(names) - seen}"
    assert value(last["master"], "ordq_broker_replication_connected") == 1
    assert value(last["coordinator"], "ordq_coordinator_leader") == 1
    assert value(last["coordinator"], "ordq_queue_send_groups", queue="q") == 2
    assert value(last["producer"], "ordq_producer_failovers_total") == 0
    assert value(last["consumer"], "ordq_consumer_gaps_total") == 0
    # the broker labels its series with its group and role
    assert {(s.labels.get("group"), s.labels.get("role")) for s in last["slave"]
            if s.name == "ordq_broker_produce_messages_total"} == {(head.gid, "slave")}

    assert value(last["master"], "ordq_broker_refused_requests_total", reason="SegmentNotFound") >= refused + 1

    # docs/OPERATIONS.md lists exactly what the processes expose.
    exposed = {s.name for samples in last.values() for s in samples}
    families = {re.sub(r"_(bucket|count|sum|created)$", "", n) if n.startswith(HISTOGRAMS) else n for n in exposed}
    documented = documented_series()
    assert families <= documented, f"exposed, not in docs/OPERATIONS.md: {families - documented}"
    assert documented - families <= CONDITIONAL, f"documented, not exposed: {documented - families - CONDITIONAL}"

    # Prometheus's own linter on what each process kind exposes (names, units, help, types).
    for kind, text in texts.items():
        lint = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        assert lint.returncode == 0, f"{kind}: {lint.stdout.decode()}{lint.stderr.decode()}"

    # Every series an alert names is one a process exposes.
    for rule in alert_rules():
        names = set(re.findall(r"\bordq_[a-z0-9_]+", rule["expr"]))
        assert names, rule["alert"]
        names = {n for n in names if not n.startswith("ordq_mirror_")}  # a mirror's: tests/test_mirror.py
        assert not names - exposed, f"alert {rule['alert']} names series no process exposes: {names - exposed}"
    producer.join(60)
    consumer.join(60)


HISTOGRAMS = ("ordq_broker_fsync_seconds", "ordq_coordinator_seal_seconds", "ordq_coordinator_round_seconds",
              "ordq_producer_send_ack_seconds", "ordq_broker_loop_lag_seconds")


def test_a_blocked_message_and_a_dead_group_show_in_the_consumer_and_coordinator_metrics(queue: Cluster) -> None:
    """The series the alerts watch go up when it happens and back when it is over: a message
    the handler rejects blocks the subscription (blocked, redeliveries, lag), then both
    processes of the group holding the consumer's segment die (stalled; the coordinator counts
    the segment not live) and come back. The consumer's series go to the application's own
    registry here (``metrics_registry``), not over HTTP."""
    registry = CollectorRegistry()
    daemon = queue.start_daemon("coordinator-1")
    coordinator = daemon.wait_for_line("METRICS ", timeout_s=5)
    cfg = ConsumerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, metrics_registry=registry,
                         on_failure=FailurePolicy(on_failure="block", attempts=2, backoff_s=(0.05,)))
    healed, stop = threading.Event(), threading.Event()
    handled: list[int] = []
    errors: list[BaseException] = []

    def handler(m) -> None:  # noqa: ANN001
        if m.seq == 10 and not healed.is_set():
            raise ValueError("cannot handle 10 yet")
        handled.append(m.seq)

    def run() -> None:
        try:
            with Consumer(cfg) as c:
                c.run(handler, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def metric(name: str, **labels: str) -> float | None:
        return value(parse(generate_latest(registry).decode()), name, **labels)

    thread = threading.Thread(target=run, name="blocked-consumer", daemon=True)
    thread.start()
    try:
        wait_until(lambda: metric("ordq_consumer_blocked") == 1, timeout_s=30, what="the blocked alarm")
        assert (metric("ordq_consumer_redeliveries_total") or 0) >= 2
        assert metric("ordq_consumer_blocked_attempts") >= 2
        assert metric("ordq_consumer_lag_messages") == QUEUED - 11  # seqs 11.. wait behind 10
        assert metric("ordq_consumer_last_seq") == 10
        healed.set()
        wait_until(lambda: metric("ordq_consumer_last_seq") == QUEUED - 1, timeout_s=30, what="all delivered")
        assert metric("ordq_consumer_blocked") == 0 and metric("ordq_consumer_lag_messages") == 0
        assert metric("ordq_consumer_stalled_seconds") == 0

        group = queue.head()
        group.kill()  # both processes of the group the consumer reads
        wait_until(lambda: (metric("ordq_consumer_stalled_seconds") or 0) > 0.5, timeout_s=30,
                   what="the consumer to report waiting at a dead group")
        wait_until(lambda: value(read_metrics(coordinator), "ordq_queue_segments_not_live", queue="q") == 1,
                   timeout_s=30, what="the coordinator to count the segment on the dead group")
        # the count over every queue, which the alert watches (issue 43: per-queue series top-N)
        assert value(read_metrics(coordinator), "ordq_coordinator_queues_not_live") == 1
        for member in (group.slave, group.master):
            queue.restart(member)
        wait_until(lambda: metric("ordq_consumer_stalled_seconds") == 0, timeout_s=30,
                   what="the consumer to read again")
        wait_until(lambda: value(read_metrics(coordinator), "ordq_queue_segments_not_live", queue="q") == 0,
                   timeout_s=30, what="the coordinator to see the group live")
        assert value(read_metrics(coordinator), "ordq_coordinator_queues_not_live") == 0
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    assert handled == list(range(QUEUED))


def documented_series() -> set[str]:
    """The series named in the tables of docs/OPERATIONS.md's "Metrics" section."""
    text = (DOCS / "OPERATIONS.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `((?:ordq|python_gc)_[a-z0-9_]+)` \|", section, flags=re.M))


def alert_rules() -> list[dict[str, str]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def promtool() -> str:
    """Debian's ``prometheus`` package brings it (make system-deps)."""
    path = shutil.which("promtool")
    assert path, "promtool is not installed (Debian: apt-get install prometheus; make system-deps)"
    return path


def test_alert_rules_load_and_fire_in_promtool() -> None:
    """promtool loads docs/alerts.yml, and its unit tests (tests/alerts_test.yml: synthetic
    series) see each alert fire on its condition, after its ``for``, and not on healthy series."""
    check = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    unit = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=Path(__file__).parent,
                          capture_output=True, timeout=60)
    assert unit.returncode == 0, unit.stdout.decode() + unit.stderr.decode()
    tested = set(re.findall(r"alertname: (\w+)", (Path(__file__).parent / "alerts_test.yml").read_text()))
    assert tested == {rule["alert"] for rule in alert_rules()}  # every alert has its unit test


def test_alert_rules_file_is_well_formed() -> None:
    """The shape Prometheus loads (rule_files): groups with a name and rules, each rule with
    alert, expr, a ``for`` duration, a severity label and a summary; names unique."""
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}
    names = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"] and group["rules"], group
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]), rule["alert"]
            assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), rule
            assert rule["labels"]["severity"] in ("warning", "critical"), rule
            assert rule["annotations"]["summary"], rule
            assert rule["expr"].count("(") == rule["expr"].count(")"), rule
            names.append(rule["alert"])
    assert len(names) == len(set(names))
    wanted = {"OrdqConsumerWaitingAtDeadGroup", "OrdqConsumerLagGrowing", "OrdqMessageBlocked",
              "OrdqMessageParked", "OrdqReplicationBroken", "OrdqDiskNearlyFull"}
    assert wanted <= set(names), wanted - set(names)
