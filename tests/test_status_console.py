"""The status page as a console people read (issue 42), in headless Chromium on a cluster of
real processes with traffic: rates and lag charts from the coordinator's samples, the busiest
queue first, a filter box, times with their zone, and a failover listed after the head master
is killed. Screenshots are written beside the test's files, and to ``$ORDQ_SCREENSHOTS`` when
set (how docs/status-console*.png were made)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

from ordq import __version__
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.helpers.chromium import Chromium
from tests.util import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]

SECTIONS = "[...document.querySelectorAll('#queues section')].filter(s => !s.hidden).map(s => s.dataset.queue)"
ZONED = re.compile(r"\d{1,2}:\d\d:\d\d( [AP]M)? [A-Z]{2,5}([+-]\d+)?")
# each process row: name -> [listen, state, healthy, version]
PROCESS_ROWS = ("Object.fromEntries([...document.querySelectorAll('#processes tr[data-process]')]"
                ".map(r => [r.dataset.process, [...r.cells].slice(1, 5).map(c => c.innerText)]))")
CHART_POINTS = "document.querySelector('#charts path[data-series=\"produced\"]')?.getAttribute('d')?.length || 0"


def screenshot(browser: Chromium, path: Path) -> None:
    browser.call("Emulation.setDeviceMetricsOverride", width=1100, height=900, deviceScaleFactor=1, mobile=False)
    data = browser.call("Page.captureScreenshot", format="png")["data"]
    path.write_bytes(base64.b64decode(data))
    if os.environ.get("ORDQ_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["ORDQ_SCREENSHOTS"]) / path.name)


def test_the_console_charts_rates_and_lag_filters_and_lists_a_failover(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("orders")
    cluster.create_queue("audit")
    assert cluster.ordq("sub", "create", "orders", "billing").returncode == 0
    daemon = cluster.start_daemon("coordinator-1")
    page = daemon.wait_for_line("METRICS ", timeout_s=30).split()[-1].rsplit("/", 1)[0] + "/status"
    cluster.spawn_ordq("producer", "produce", "orders", "--count", "1000000", "--rate", "100")
    cluster.spawn_ordq("consumer", "consume", "orders", "-s", "billing", "--quiet")

    def history() -> dict:  # type: ignore[type-arg]
        return json.loads(urllib.request.urlopen(page + ".json", timeout=30).read())["history"]

    # two samples 10 s apart make the first rate; the producer's and the consumer's show in them
    wait_until(lambda: sum((r or 0) > 0 for r in history()["queues"]["*"]["produce"]) >= 2
               and any((r or 0) > 0 for r in history()["queues"]["*"]["consume"]), timeout_s=180,
               interval_s=1.0, what="produce and consume rates in the coordinator's samples")
    with Chromium(tmp_path / "chromium") as browser:
        browser.navigate(page)
        wait_until(lambda: browser.evaluate(CHART_POINTS) > 0, timeout_s=30, what="the rates chart drawn")
        assert browser.evaluate(SECTIONS) == ["orders", "audit"]  # the busiest first, not by name
        updated = browser.evaluate("document.getElementById('updated').innerText")
        assert ZONED.fullmatch(updated), updated  # a zone, e.g. "3:30:29 PM UTC"
        assert "lag, every queue" in browser.evaluate("document.getElementById('charts').innerText")
        leader = browser.evaluate("document.getElementById('leader').innerText")
        assert leader not in ("?", "none", ""), leader
        rows = browser.evaluate(PROCESS_ROWS)
        assert {"g1/master", "g1/slave", "g2/master", "g2/slave", "zk1", leader} <= set(rows), rows
        assert all(r[2] == "yes" for r in rows.values()), rows  # [listen, state, healthy, version]
        assert rows["g1/master"][3] == __version__
        screenshot(browser, tmp_path / "status-console.png")
        browser.evaluate("(f => { f.value = 'aud'; f.dispatchEvent(new Event('input')); })"
                         "(document.getElementById('filter'))")
        assert browser.evaluate(SECTIONS) == ["audit"]
        browser.evaluate("(f => { f.value = ''; f.dispatchEvent(new Event('input')); })"
                         "(document.getElementById('filter'))")

        cluster.groups["g1"].master.kill()
        wait_until(lambda: "orders: g1 -> g2" in (browser.evaluate("document.getElementById('failovers').innerText")
                                                  or ""), timeout_s=60, what="the failover listed")
        wait_until(lambda: browser.evaluate(PROCESS_ROWS).get("g1/master", [""] * 4)[2] == "no", timeout_s=60,
                   what="g1/master shown unhealthy")
        failover = browser.evaluate("document.getElementById('failovers').innerText")
        assert ZONED.match(failover), failover  # its time carries a zone
        screenshot(browser, tmp_path / "status-console-failover.png")


TOPIC = ("(t => t && {head: t.querySelector('h2').innerText, partitions: [...t.querySelectorAll('details section')]"
         ".map(s => s.dataset.queue), subs: [...t.querySelectorAll(':scope > table tr[data-subscription]')]"
         ".map(r => r.innerText.split('\\t'))})(document.querySelector('#queues > section[data-topic=\"clicks\"]'))")
PARKED_ROW = ("(r => r && [r.className, r.querySelector('td.parked').innerText])(document.querySelector("
              "'#queues > section[data-queue=\"orders\"] tr[data-subscription=\"billing\"]'))")
TOP_SECTIONS = "[...document.querySelectorAll('#queues > section')].filter(s => !s.hidden).map(s => s.dataset.queue)"


def test_the_console_groups_a_topics_partitions_and_shows_parked_counts(cluster: Cluster, tmp_path: Path) -> None:
    """Issue 42: a topic's partitions were scattered among the queues and no subscription showed
    what it had parked. A topic is one section with its sums, its partitions folded under it; a
    subscription's parked count is what its parking queue stores, highlighted when not 0."""
    cluster.add_groups("g1")
    cluster.create_queue("orders")
    daemon = cluster.start_daemon("coordinator-1")
    page = daemon.wait_for_line("METRICS ", timeout_s=30).split()[-1].rsplit("/", 1)[0] + "/status"
    for argv in (("sub", "create", "orders", "billing"), ("topic", "create", "clicks", "--partitions", "2"),
                 ("sub", "create", "clicks.p0", "reports"), ("sub", "create", "clicks.p1", "reports"),
                 ("queue", "create", "orders.parked.billing")):
        done = cluster.ordq(*argv)
        assert done.returncode == 0, done.stderr
    # what a consumer with on_failure="park" sets aside: three messages in billing's parking queue
    done = cluster.ordq("produce", "orders.parked.billing", stdin=b"a\nb\nc\n")
    assert done.returncode == 0, done.stderr

    doc = json.loads(urllib.request.urlopen(page + ".json", timeout=30).read())
    [topic] = doc["topics"]
    assert topic["topic"] == "clicks" and topic["partitions"] == ["clicks.p0", "clicks.p1"]
    assert topic["subscriptions"] == [{"subscription": "reports", "lag": 0, "parked": 0, "partitions": 2}]
    [orders] = [q for q in doc["queues"] if q["queue"] == "orders"]
    assert [(s["subscription"], s["parked"]) for s in orders["subscriptions"]] == [("billing", 3)]
    with Chromium(tmp_path / "chromium") as browser:
        browser.navigate(page)
        wait_until(lambda: browser.evaluate(TOPIC) is not None, timeout_s=30, what="the topic's section drawn")
        shown = browser.evaluate(TOPIC)
        assert shown["head"] == "topic clicks (2 partitions, stored 0)"
        assert shown["partitions"] == ["clicks.p0", "clicks.p1"]
        assert shown["subs"] == [["reports", "0", "0", "2"]]  # subscription, lag, parked, partitions
        assert sorted(browser.evaluate(TOP_SECTIONS)) == ["clicks", "orders", "orders.parked.billing"]
        assert browser.evaluate(PARKED_ROW) == ["parked", "3"]
        browser.evaluate("document.querySelector('#queues > section[data-topic=\"clicks\"] details').open = true")
        screenshot(browser, tmp_path / "status-console-topic.png")
        browser.evaluate("(f => { f.value = 'clicks.p1'; f.dispatchEvent(new Event('input')); })"
                         "(document.getElementById('filter'))")
        assert browser.evaluate(TOP_SECTIONS) == ["clicks"]  # a partition's name finds its topic


BLOCKED_ROW = ("(r => r && [r.className, r.cells[4].innerText])(document.querySelector("
               "'#queues > section[data-queue=\"q\"] tr[data-subscription=\"s\"]'))")


def test_a_blocked_subscription_is_highlighted(cluster: Cluster) -> None:
    """Issue 42: the console highlights a subscription whose consumer is blocked on a message
    (its policy ``block``, past its attempts), with the message and the attempts, until the
    message goes through."""
    import threading

    from ordq.sdk import Consumer, ConsumerConfig

    cluster.add_groups("g1")
    cluster.create_queue("q")
    daemon = cluster.start_daemon("coordinator-1")
    page = daemon.wait_for_line("METRICS ", timeout_s=30).split()[-1].rsplit("/", 1)[0] + "/status"
    for argv in (("produce", "q", "--count", "5"), ("sub", "create", "q", "s"),
                 ("sub", "policy", "q", "s", "--on-failure", "block", "--attempts", "2", "--backoff", "0.05")):
        done = cluster.ordq(*argv)
        assert done.returncode == 0, done.stderr
    fixed, stop = threading.Event(), threading.Event()

    def handler(m) -> None:  # noqa: ANN001
        if m.seq == 2 and not fixed.is_set():
            raise ValueError("downstream is down")
        if m.seq == 4:
            stop.set()

    with Chromium(cluster.base / "chromium") as browser, \
            Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s")) as c:
        runner = threading.Thread(target=c.run, args=(handler,), kwargs={"stop": stop})
        runner.start()
        try:
            browser.navigate(page)
            row = wait_until(lambda: (r := browser.evaluate(BLOCKED_ROW)) and r[0] == "blocked" and r,
                             timeout_s=60, what="the subscription's row highlighted as blocked")
            assert re.fullmatch(r"seq 2 \(\d+ attempts\)", row[1]), row
            fixed.set()
            wait_until(lambda: (browser.evaluate(BLOCKED_ROW) or ["blocked"])[0] == "", timeout_s=60,
                       what="the highlight gone once the message went through")
        finally:
            stop.set()
            runner.join(60)
