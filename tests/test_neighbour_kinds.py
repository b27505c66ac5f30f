"""The noisy-neighbour drill's kinds of abuse as the environment names them (pure): all by
default, a subset for a measurement, ``none`` for the idle control (nothing sent), ``hog`` for the
CPU control (nothing sent, ~0.1-0.2 core spun in the cluster's group), and clear errors for a
mistyped kind or a control mixed with others; and the abused master's counters it tells."""

from __future__ import annotations

from typing import Any

import pytest

from ordq.drills import neighbour


def kinds(monkeypatch: pytest.MonkeyPatch, value: str | None) -> tuple[str, ...]:
    if value is None:
        monkeypatch.delenv(neighbour.ABUSE_ENV, raising=False)
    else:
        monkeypatch.setenv(neighbour.ABUSE_ENV, value)
    return neighbour.abuse_kinds()


def test_every_kind_by_default_and_a_subset_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, None) == neighbour.ABUSE_KINDS
    assert kinds(monkeypatch, "streams, huge") == ("streams", "huge")


def test_none_is_the_idle_control_sending_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, "none") == ()


def test_hog_is_the_cpu_control_sending_nothing_either(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, "hog") == (neighbour.HOG_CONTROL,)
    assert not set(neighbour.ABUSE_KINDS) & {neighbour.HOG_CONTROL, neighbour.IDLE_CONTROL}


@pytest.mark.parametrize("value", ["streams,none", "stream", "hog,streams", "none,hog"])
def test_a_mistyped_kind_or_none_with_others_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    with pytest.raises(ValueError, match=neighbour.ABUSE_ENV):
        kinds(monkeypatch, value)


def test_the_abused_masters_counters_are_summed_per_kind_of_window() -> None:
    """What the drill tells of the abused master's read rate and request-time shares (stop 67:
    how it was found that the neighbour, not the abuser, was being held): each window's
    counters as read from a real /metrics page before and after it, summed per kind of window
    and told per second; a page that does not answer counts nothing and is told."""
    import http.server
    import threading

    pages = iter([(0, 0.0, 0), (10, 2e6, 0), (10, 2e6, 0), (30, 10e6, 4)])

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            answers, nbytes, paced = next(pages)
            body = (f"ordq_broker_fetch_requests_total {answers}\nordq_broker_fetch_bytes_total {nbytes}\n"
                    f"ordq_broker_read_paced_total {paced}\n"
                    f'ordq_broker_loop_lag_seconds_bucket{{le="0.005"}} {answers * 10}\n'
                    f'ordq_broker_loop_lag_seconds_bucket{{le="0.02"}} {answers * 10}\n'
                    f"ordq_broker_loop_lag_seconds_count {answers * 10 + paced}\n"
                    f'python_gc_collections_total{{generation="0"}} {answers * 100}\n'
                    f'python_gc_collections_total{{generation="2"}} {paced}\n'
                    f'python_gc_objects_collected_total{{generation="2"}} {paced * 1000}\n').encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        counted = neighbour.MasterCounters(f"http://127.0.0.1:{server.server_address[1]}/metrics")
        for kind in ("quiet", "abused"):
            counted.start()
            counted.stop(kind)
        told = counted.told({"quiet": 2.0, "abused": 4.0})
    finally:
        server.shutdown()
        server.server_close()
    assert told.startswith("quiet: answers 5.0, answer MB 1.0, paced 0.0")
    assert "abused: answers 5.0, answer MB 2.0, paced 1.0" in told
    assert told.count("lag>=20ms") == 2 and "lag>=5ms 1.0, lag>=20ms 1.0" in told  # 4 late ticks in 4 s of abuse
    # full collections only (generation 2), per second: none while quiet, 4 in the 4 s of abuse
    assert "lag>=20ms 0.0, full gcs 0.0, full gc objects 0.0" in told
    assert "full gcs 1.0, full gc objects 1000.0" in told
    assert "failed" not in told
    unread = neighbour.MasterCounters("http://127.0.0.1:9/metrics")  # nothing listens on the discard port
    unread.start()
    unread.stop("quiet")
    assert unread.told({"quiet": 1.0}).startswith("not read") and unread.failed == 2


@pytest.mark.parametrize("kinds", [neighbour.ABUSE_KINDS, ("huge",), ("streams", "malformed"), ("oversized",),
                                   (neighbour.HOG_CONTROL,)])
def test_every_connection_a_window_uses_was_made_before_it(monkeypatch: pytest.MonkeyPatch,
                                                           kinds: tuple[str, ...]) -> None:
    """Stop 70: the abuser's connections are opened before its window (``connected``), so that
    their handshakes do not land on its first calls; a window must then open none of its own."""
    from unittest.mock import MagicMock

    from ordq.common.security import Credentials

    opened: list[str] = []
    monkeypatch.setattr(neighbour, "Stub", lambda address, creds: opened.append(address) or MagicMock())
    ready: list[Any] = [MagicMock() for _ in range(neighbour.connections_of(kinds))]
    abuser = neighbour._Abuser("127.0.0.1:1", Credentials(token="t"), "q", 0, kinds, ready)
    abuser.stop_event.set()  # its loops end at once
    abuser.start()
    assert opened == [] and abuser._ready == []  # used every connection made before, and only those
