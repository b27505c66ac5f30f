"""The coordinator's status page (/status) in headless Chromium: one page stays open while the
head master is killed, and it redraws itself from /status.json — the send list's head moves
to the next group, the dead process shows as down, and the failover is listed."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from ordq.common.metrics import scrape, value
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.helpers.chromium import Chromium
from tests.util import wait_until

pytestmark = pytest.mark.zk

HEAD = "document.querySelector('section[data-queue=\"q\"]')?.dataset.head"
GROUP_ROW = "document.querySelector('section[data-queue=\"q\"] tr[data-group=\"{gid}\"]')?.innerText"
FAILOVERS = "document.getElementById('failovers').innerText"
SUB_ROW = "document.querySelector('section[data-queue=\"q\"] tr[data-subscription=\"s\"]')?.innerText"
UPDATED = "document.getElementById('updated').innerText"
MIRROR_ROW = "document.querySelector('#mirrors tr[data-mirror=\"mirror.dc2\"]')?.innerText"


def test_status_page_redraws_after_the_head_master_dies(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    assert cluster.ordq("sub", "create", "q", "s").returncode == 0
    assert cluster.ordq("sub", "create", "q", "mirror.dc2").returncode == 0  # a mirror's, to data centre dc2
    daemon = cluster.start_daemon("coordinator-1")
    metrics = daemon.wait_for_line("METRICS ", timeout_s=5)
    page = metrics.rsplit("/", 1)[0] + "/status"
    # the daemon has run a round (it notices failovers by comparing rounds)
    wait_until(lambda: value(scrape(metrics), "ordq_queue_send_groups", queue="q") == 2, timeout_s=30,
               what="a coordinator round")
    doc = json.loads(urllib.request.urlopen(page + ".json", timeout=10).read())
    assert [q["queue"] for q in doc["queues"]] == ["q"] and doc["queues"][0]["send"] == ["g1", "g2"]

    with Chromium(tmp_path / "chromium") as browser:
        browser.navigate(page)
        wait_until(lambda: browser.evaluate(HEAD) == "g1", timeout_s=30, what="the page to show head g1")
        assert "master up, slave up" in browser.evaluate(GROUP_ROW.format(gid="g1"))
        assert browser.evaluate(FAILOVERS) == ""
        # last seq, lag, consumer, blocked, parked
        assert browser.evaluate(SUB_ROW).split() == ["s", "-1", "0", "-", "-", "0"]
        # queue, target, copied seq, lag in messages and seconds, mirror instance: nothing to copy yet
        wait_until(lambda: (browser.evaluate(MIRROR_ROW) or "").split() == ["q", "dc2", "-1", "0", "0.0", "-"],
                   timeout_s=30, what="the page to show the mirror caught up")
        producer = cluster.producer(n=5)
        producer.start()
        producer.join(60)
        # five messages the mirror has not copied: lag 5, and their age in seconds
        wait_until(lambda: (browser.evaluate(MIRROR_ROW) or "").split()[:4] == ["q", "dc2", "-1", "5"],
                   timeout_s=30, what="the page to show the mirror 5 messages behind")
        assert float(browser.evaluate(MIRROR_ROW).split()[4]) >= 0
        doc = json.loads(urllib.request.urlopen(page + ".json", timeout=10).read())
        assert [(m["subscription"], m["lag_messages"]) for m in doc["mirrors"]] == [("mirror.dc2", 5)]
        first_update = browser.evaluate(UPDATED)

        cluster.groups["g1"].master.kill()
        wait_until(lambda: browser.evaluate(HEAD) == "g2", timeout_s=30, what="the page to show head g2")
        wait_until(lambda: "master down" in (browser.evaluate(GROUP_ROW.format(gid="g1")) or ""), timeout_s=30,
                   what="the page to show g1's master down")
        wait_until(lambda: "q: g1 -> g2" in (browser.evaluate(FAILOVERS) or ""), timeout_s=30,
                   what="the page to list the failover")
        assert browser.evaluate("location.href") == page  # the same page, redrawn, never reloaded
        assert browser.evaluate(UPDATED) != first_update
