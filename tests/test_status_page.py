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


def _connections_to(port: int) -> set[int]:
    """The client-side ports of every TCP connection to ``port`` on this machine, in any state:
    one the coordinator closed stays in TIME_WAIT for a minute, so a connection made per page
    load is counted after it closed."""
    out = set()
    lines = [ln for table in ("tcp", "tcp6") for ln in Path(f"/proc/net/{table}").read_text().splitlines()[1:]]
    for line in lines:  # gRPC's sockets are IPv6 ones, 127.0.0.1 mapped
        local, remote = (int(end.split(":")[1], 16) for end in line.split()[1:3])
        if remote == port and local != port:
            out.add(local)
        elif local == port and remote != port:
            out.add(remote)
    return out


def test_the_pages_process_list_asks_over_the_coordinators_kept_channels(cluster: Cluster) -> None:
    """Issue 42: the page's process list is the coordinator's own sweep, the one ``ordq status``
    asks for (``cluster status``), over the broker channels it keeps; it opened a channel, a TLS
    handshake, to every broker at each load."""
    cluster.add_groups("g1")
    daemon = cluster.start_daemon("coordinator-1")
    page = daemon.wait_for_line("METRICS ", timeout_s=5).rsplit("/", 1)[0] + "/status.json"

    def processes() -> dict[str, str]:
        doc = json.loads(urllib.request.urlopen(page, timeout=30).read())
        return {p["name"]: p["state"] for p in doc["processes"]}

    wait_until(lambda: processes().get("g1/master") == "live", timeout_s=30, what="the page to list g1's master")
    master = int(cluster.store.live_members("g1")["master"].address.rpartition(":")[2])
    before = _connections_to(master)
    for _ in range(6):
        assert processes()["g1/master"] == "live"
    made = _connections_to(master) - before
    assert len(made) <= 1, f"{len(made)} connections to g1's master for 6 loads of the page"
