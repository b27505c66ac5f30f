"""Each caller's share of what its coordinator calls cost (coordinator/fair_share.py, stop e of
issue 38): a call is charged its ZooKeeper requests, and a caller over its share is held while a
caller that used less called within the window. Pure accounting and ``FairTurns`` with an
injected clock, sleep, CPU and ZooKeeper counters: no gRPC, no ZooKeeper."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.coordinator.fair_share import CallerTime, FairShareConfig, FairTurns, TurnRefused

# Measured costs (docs/BENCHMARKS.md, stop e): a Describe with config and live members waits for
# ~5 ZooKeeper requests, a Commit for ~4.
CFG = FairShareConfig()
DESCRIBE_S = (CFG.request_time.call_cost_us + 5 * CFG.zk_request_cost_us) / 1e6 + 0.0003
COMMIT_S = (CFG.request_time.call_cost_us + 4 * CFG.zk_request_cost_us) / 1e6 + 0.0003


class _Fake:
    """A clock that sleeping advances, and the counters a call's charge reads."""

    def __init__(self) -> None:
        self.now, self.cpu, self.zk = 100.0, 0.0, 0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _turns(fake: _Fake, **cfg: object) -> FairTurns:
    return FairTurns(FairShareConfig(**cfg), clock=lambda: fake.now, sleep=fake.sleep,  # type: ignore[arg-type]
                     cpu=lambda: fake.cpu, zk_requests=lambda: fake.zk, spread=lambda: 0.5)


def test_a_call_is_charged_its_zookeeper_requests_and_its_frame() -> None:
    """A call whose own thread only waited for ZooKeeper was charged ~0.7 ms where it cost the
    machine ~4.3 ms (a Describe with live members): its requests are charged now."""
    fake = _Fake()
    turns = _turns(fake)
    with turns.turn("flooder"):
        fake.cpu += 0.0002
        fake.zk += 5
    expected = 0.0002 + 5 * CFG.zk_request_cost_us / 1e6 + CFG.request_time.call_cost_us / 1e6
    assert turns.request_time.recent("flooder", fake.now) == pytest.approx(expected)


def _simulate(neighbour_every_s: float | None, seconds: float = 10.0, flood_calls: int = 1, *,
              cfg: FairShareConfig = CFG, describe_s: float = DESCRIBE_S,
              commit_s: float = COMMIT_S) -> tuple[int, int, float]:
    """A flooder calling Describe (``describe_s`` each) back to back (one running at a time, as
    its part of the slots allows; ``flood_calls`` in flight in all, the rest waiting) beside a
    neighbour committing (``commit_s`` each) every ``neighbour_every_s`` (None: alone), one call at
    a time, on CallerTime's accounting of ``cfg``; (the flooder's calls served, the neighbour's
    calls delayed, the neighbour's charges per second)."""
    rt = CallerTime(cfg.request_time, half_life_s=cfg.half_life_s)
    for _ in range(flood_calls):
        rt.begin("flooder")
    t, flood_next, next_commit = 0.0, 0.0, 0.0
    served = delayed = 0
    charged = 0.0
    while t < seconds:
        if neighbour_every_s is not None and t >= next_commit:
            rt.begin("neighbour")
            if rt.delay_s("neighbour", t) > 0:
                delayed += 1
            rt.charge("neighbour", commit_s, t)
            rt.end("neighbour")
            charged += commit_s
            next_commit = t + neighbour_every_s
        if t >= flood_next:
            wait = rt.delay_s("flooder", t)
            if wait:
                flood_next = t + wait
            else:
                rt.charge("flooder", describe_s, t)
                served += 1
                flood_next = t + describe_s
        t += 0.0005
    return served, delayed, charged / seconds


def test_a_flood_is_held_to_its_share_while_a_lighter_neighbour_calls_and_never_alone() -> None:
    """The drill's case: the neighbour commits every ~20 ms (over the share, under the heavy
    share) one call at a time. A flood with calls waiting is served at most its share of seconds
    per second (~25 Describes/s); one calling back to back one at a time, about the heavy share;
    the neighbour is never held. Alone, the flood is never held (work-conserving)."""
    rt = CFG.request_time
    for flood_calls, share in ((64, rt.share), (1, CFG.heavy_share * 1.3)):
        served, delayed, neighbour_rate = _simulate(0.020, flood_calls=flood_calls)
        assert rt.share < neighbour_rate < CFG.heavy_share
        assert delayed == 0
        bound = (share * 10 + rt.burst_s) / DESCRIBE_S + 1
        assert served <= bound, (flood_calls, served, bound)
        alone, _, _ = _simulate(None, flood_calls=flood_calls)
        assert alone >= 0.9 * 10 / DESCRIBE_S  # back to back, never waiting (0.5 ms steps)


def test_the_flood_waits_for_at_most_half_as_many_zookeeper_requests_as_the_neighbour() -> None:
    """Stop k (docs/BENCHMARKS.md): in the control-plane drill the neighbour's Commit was almost
    all ZooKeeper waiting, its requests queued on the leader's one session behind the flood's
    served ones. As measured there: a Commit every ~28 ms waiting for 3 requests with ~1.5 ms of
    CPU, the flood's Describe (config and live members) for 8 with ~2.5 ms. Held to 0.1 s per s,
    the flood was served ~6 Describes a second plus its refused calls' work, ~65 % as many requests
    as the neighbour's, and the neighbour's Commit p99 was 2.0-2.05x quiet in the flood's windows
    (two probes; 1.5-2.4x in stop j's six). Held to half that, 1.37x, 1.65x, 1.71x. The flood's
    requests stay within half the neighbour's (and its bucket's burst), the neighbour never held."""
    zk, frame = CFG.zk_request_cost_us / 1e6, CFG.request_time.call_cost_us / 1e6
    describe_s, commit_s = frame + 8 * zk + 0.0025, frame + 3 * zk + 0.0015
    served, delayed, _ = _simulate(0.028, flood_calls=64, describe_s=describe_s, commit_s=commit_s)
    commits = 10 / 0.028
    burst = CFG.request_time.burst_s / describe_s * 8
    assert delayed == 0
    assert served * 8 <= 0.5 * commits * 3 + burst, (served * 8, commits * 3)


def test_a_flood_of_many_calls_is_held_to_its_share_beside_a_neighbour_over_it_who_is_never_held() -> None:
    """A neighbour committing every 8 ms is over the share itself: the brokers' rule (hold a
    token only while another keeps to its share) then held nobody and the flood took what it
    could. A flood with calls waiting is heavier than a neighbour calling one at a time, whatever
    either used: it is held to its share, and the neighbour never."""
    served, delayed, neighbour_rate = _simulate(0.008, flood_calls=64)
    assert neighbour_rate > CFG.heavy_share
    assert delayed == 0
    assert served <= (CFG.request_time.share * 10 + CFG.request_time.burst_s) / DESCRIBE_S + 1, served


def test_two_callers_alike_over_the_share_are_held_until_their_use_is_level() -> None:
    """One call at a time each (as many in flight), both past the heavy share: the one that used
    more lately yields, so the flood's charges per second stay at about the neighbour's (max-min)."""
    served, _delayed, neighbour_rate = _simulate(0.008, flood_calls=1)
    assert neighbour_rate > CFG.heavy_share
    assert served * DESCRIBE_S / 10 <= neighbour_rate * 1.25 + CFG.request_time.burst_s, (served, neighbour_rate)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("a", "b", "c")), st.floats(0, 0.05), st.floats(0, 0.02)),
                min_size=1, max_size=60))
def test_the_lightest_caller_lately_is_never_held(calls: list[tuple[str, float, float]]) -> None:
    """Whatever the callers do (one call at a time each), the one that used the least lately is
    never held for another."""
    rt = CallerTime(CFG.request_time, half_life_s=CFG.half_life_s)
    now = 0.0
    for who, dt, cost in calls:
        now += dt
        active = [h for h, at in rt._active.items() if now - at <= (rt.config.contention_s or 1e9)] + [who]
        if all(rt.recent(who, now) <= rt.recent(h, now) for h in active):
            assert rt.delay_s(who, now) == 0
        else:
            rt.delay_s(who, now)
        rt.charge(who, cost, now)


def test_a_refusal_past_the_held_calls_is_held_as_a_refused_turn_and_charged() -> None:
    """A caller far over its share with ``max_held`` calls waiting already was refused at once,
    and came back at once (each refusal costs the coordinator ~0.85 ms and ~18 context
    switches): it is now answered after its debt's time asleep (at least ``hold_refused_ms``, at
    most ``max_delay_ms``), and charged its frame."""
    from ordq.common.request_time import RequestTimeConfig

    fake = _Fake()
    turns = _turns(fake, request_time=RequestTimeConfig(share=0.25, burst_s=0.05, max_delay_ms=2_000, max_held=0,
                                                       call_cost_us=600, contention_s=1.0))
    with turns.turn("neighbour"):
        pass
    with turns.turn("flooder"):  # a call far over the share beside the neighbour: deep in debt
        fake.zk += 1000
    before, t0 = turns.request_time.recent("flooder", fake.now), fake.now
    fake.slept.clear()
    with pytest.raises(TurnRefused) as info, turns.turn("flooder"):
        pass
    assert info.value.retry_ms >= 50
    assert fake.slept == [CFG.max_delay_ms / 1000.0]  # as long as its debt lasts, at most max_delay_ms
    assert turns.request_time.recent("flooder", fake.now) > before * 0.5 ** ((fake.now - t0) / CFG.half_life_s)


def test_a_floods_calls_paced_at_once_wait_one_behind_another_not_together() -> None:
    """CI (heavy tier): beside a neighbour, a flood of Describes was served 27 a second where its
    share allowed ~14. Its calls paced at the same moment each waited out the same debt and were
    let through together, each charged only once past the wait: up to ``max_held`` calls past the
    share at a time. Now a paced call is charged its likely cost before it sleeps, so the next one
    waits behind it: ten calls paced at once wait ten different times, each a call's cost over the
    share after the one before."""
    import threading

    fake = _Fake()
    cond = threading.Condition()
    waits: list[float] = []
    released = threading.Event()

    def sleep(s: float) -> None:  # the paced calls block here until all ten were paced
        with cond:
            waits.append(s)
            cond.notify_all()
        assert released.wait(30)

    turns = FairTurns(CFG, clock=lambda: fake.now, sleep=sleep, cpu=lambda: fake.cpu,
                      zk_requests=lambda: fake.zk, spread=lambda: 0.0)
    with turns.turn("neighbour"):
        pass
    rt = turns.request_time
    with turns._cond:  # the flooder with calls in flight beside the neighbour, a little in debt
        rt.begin("flooder")
        rt.begin("flooder")
        rt.charge("flooder", CFG.request_time.burst_s + 0.005, fake.now)
    def call() -> None:
        with turns.turn("flooder"):
            pass

    calls = [threading.Thread(target=call, daemon=True) for _ in range(10)]
    for c in calls:
        c.start()
    with cond:
        assert cond.wait_for(lambda: len(waits) == 10, timeout=30), waits
    released.set()
    for c in calls:
        c.join(30)
    assert not any(c.is_alive() for c in calls)
    step = CFG.request_time.call_cost_us / 1e6 / CFG.request_time.share  # a call's likely cost, not yet learnt
    ordered = sorted(waits)
    assert all(b - a >= 0.8 * step for a, b in zip(ordered[:-1], ordered[1:], strict=True)), (ordered, step)
