"""One of several processes racing conditional transitions on one queue.

usage: python -m tests.helpers.churn HOSTS ROOT QUEUE OPS SEED
Prints one JSON line: how many transitions of each kind this process got through.
"""

from __future__ import annotations

import json
import random
import sys

from ordq.common.errors import IllegalTransition
from ordq.coordinator import state as sm
from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import ZkStore


def main() -> None:
    hosts, root, queue, ops, seed = sys.argv[1:]
    rng = random.Random(int(seed))
    done = {"bump": 0, "fail_over": 0, "seal": 0, "pop": 0, "refused": 0}
    with ZkStore.connect(hosts, root) as store:
        for _ in range(int(ops)):
            kind = rng.choice(["bump", "bump", "fail_over", "seal", "pop", "admit_all"])

            def step(st: sm.QueueState, facts: sm.Facts, kind: str = kind) -> sm.QueueState:
                if kind == "bump":
                    return sm.bump_epoch(st)
                if kind == "fail_over":
                    o = st.open_segment
                    if o is None:
                        raise IllegalTransition("fail_over", "nothing open")
                    return sm.fail_over(st, o.gid, o.seg, facts)
                if kind == "seal":
                    sealing = [s for s in st.consume if s.status is SegStatus.SEALING]
                    if not sealing:
                        raise IllegalTransition("seal", "nothing sealing")
                    return sm.seal(st, sealing[0].seg, 0, None, None)
                if kind == "pop":
                    return sm.pop(st, facts, retention=True)
                return sm.admit_all(st, facts)

            try:
                store.apply(queue, step)
            except IllegalTransition:
                done["refused"] += 1
                continue
            if kind in done:
                done[kind] += 1
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
