"""A hand-made flooding client of the coordinator service (tests/test_coordinator_defences.py):
THREADS threads over CONNECTIONS channels call Describe and Subscribe as fast as they are
answered, with one token, until stdin closes; then prints its counts as JSON (and so far, at
each line read from stdin).

    python -m tests.helpers.coordinator_flood ADDRESS CREDENTIALS_JSON THREADS CONNECTIONS QUEUE [describe|coordinators]

(``describe``: Describe only, with the queue's config and live members; ``coordinators``: who
leads only, with the client certificate alone: no token.)
"""

from __future__ import annotations

import collections
import json
import sys
import threading

import grpc

from ordq.common.security import Credentials, channel
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc


def main() -> int:
    address, creds_json, threads, connections, queue = sys.argv[1:6]
    only_describe = sys.argv[6:7] == ["describe"]
    only_coordinators = sys.argv[6:7] == ["coordinators"]
    creds = Credentials.from_dict(json.loads(creds_json))
    md = (("authorization", f"Bearer {creds.token}"),)
    local = [("grpc.use_local_subchannel_pool", 1)]  # CONNECTIONS connections, even in plaintext
    stubs = [pb_grpc.CoordinatorStub(channel(address, creds, local)) for _ in range(int(connections))]  # type: ignore[no-untyped-call]
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def loop(i: int) -> None:
        stub = stubs[i % len(stubs)]
        while not stop.is_set():
            try:
                if only_coordinators:
                    stub.Coordinators(pb.CoordinatorsRequest(), timeout=30)
                elif i % 2 or only_describe:
                    stub.Describe(pb.DescribeRequest(queue=queue, with_config=True, with_live=True), timeout=30,
                                  metadata=md)
                else:
                    stub.Subscribe(pb.SubscribeRequest(queue=queue, subscription=f"f{i}"), timeout=30, metadata=md)
                what = "ok"
            except grpc.RpcError as exc:
                what = exc.code().name
                if "ordq-retry-ms" in dict(exc.trailing_metadata() or ()):
                    what += "+hint"
            with lock:
                counts[what] += 1

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(int(threads))]
    for t in workers:
        t.start()
    print("FLOODING", flush=True)
    for _line in sys.stdin:  # each line read: the counts so far, as JSON (a measurement's marks)
        with lock:
            print(json.dumps(dict(counts)), flush=True)
    stop.set()
    for t in workers:
        t.join(timeout=35)
    print(json.dumps(dict(counts)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
