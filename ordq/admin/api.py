"""The admin API's verbs (coordinator/admin_api.py): what ``ordq queue|sub|topic|auth|peek``
ask the elected coordinator to do, each row the admin library function the CLI ran against
ZooKeeper before (one way to do each thing). ``ordq coordinator run`` injects ``admin_verbs``
into its service; the CLI renders the results (ordq/commands/*).

Results are JSON data: what the command prints with ``--json``, or what its table is made of.
A listing (``queue list``, ``topic list``) shows only the queues the caller's token has a role
on (issue 42: a one-queue token listed every queue).

Rules: a handler reads and writes through the store and the replicas it is given, never the
caller's ZooKeeper session (the caller has none).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from ordq.admin.queue_list import Known, Phases, list_rows
from ordq.common.errors import ConfigError, NotFound, OrdqError
from ordq.coordinator.admin_api import SOME, AdminCall, AdminVerb, TextAnswer, everywhere, on_arg
from ordq.coordinator.daemon_gc import collections_held
from ordq.coordinator.paths import check_name
from ordq.coordinator.state import QueueState
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import QueueConfig
from ordq.coordinator.tokens import ANY
from ordq.coordinator.topics import HASH_NAME, partition_queue
from ordq.output import LONG_LIST, json_items_text, json_text
from ordq.sdk.delay import check_delay_ms
from ordq.sdk.replicas import ReplicaReader

log = logging.getLogger("ordq.admin")
Readers = Callable[[ZkStore], ReplicaReader]  # a reader of the replicas, with the coordinator's credentials
# A listing this long logs one line of where its time went (its phases, the states it read).
LONG_LISTING_S = 2.0


# Names per ``queue create-many`` request (the CLI sends more in several): ~150 KB of JSON,
# well under the admin API's 1 MiB of arguments.
MAX_CREATE_NAMES = 5000


def page_names(names: Iterable[str], prefix: str, after: str, limit: int) -> tuple[list[str], bool]:
    """The names that start with ``prefix``, after ``after``, at most ``limit`` of them, in
    name order; and whether more match (ordq/commands/paging.py)."""
    matching = sorted(n for n in names if n.startswith(prefix) and n > after)
    return matching[:limit], len(matching) > limit


def _paging(call: AdminCall) -> tuple[str, str, int]:
    prefix, after, limit = call.arg("prefix", ""), call.arg("after", ""), call.arg("limit", 100)
    if not isinstance(prefix, str) or not isinstance(after, str) or not isinstance(limit, int) or limit < 1:
        raise ConfigError("paging: prefix and after are names, limit a positive integer")
    return prefix, after, limit


def queue_row(st: QueueState, subs: list[str] | None, last_seq: int | None, stored: int | None) -> dict[str, Any]:
    """One row of ``ordq queue list`` (``subs`` None: not read; ``last_seq``, ``stored`` None:
    a replica did not answer; ordq/admin/queue_list.py)."""
    open_seg = st.open_segment
    return {"queue": st.queue, "groups": list(st.groups), "send": list(st.send), "head": st.head,
            "open_segment": open_seg.seg if open_seg else None, "segments": len(st.consume),
            "epoch": st.producer_epoch, "subscriptions": subs, "last_seq": last_seq, "stored": stored}


def row_texts() -> Callable[[QueueState, list[str] | None, int | None, int | None], str]:
    """A maker of each row's JSON text as ``json_text`` prints an item of a long list (compact,
    keys sorted): what ``queue_row`` would make and encode, without the dict (issue 43: at
    10^5 queues the dicts and their encoding were ~1.9 s of the listing's 7.4 s in the
    coordinator). One maker per listing: it keeps the text of each list of names it met (a
    queue's groups and send list are few distinct lists)."""
    from json.encoder import encode_basestring_ascii as text_of  # what json.dumps uses (ensure_ascii)

    lists: dict[tuple[str, ...], str] = {}

    def list_text(items: Sequence[str]) -> str:
        key = tuple(items)
        found = lists.get(key)
        if found is None:
            found = lists[key] = "[" + ", ".join(map(text_of, key)) + "]"
        return found

    def number(value: int | None) -> str:
        return "null" if value is None else int.__repr__(value)

    def row_text(st: QueueState, subs: list[str] | None, last_seq: int | None, stored: int | None) -> str:
        open_seg, head = st.open_segment, st.head
        return (f'{{"epoch": {int.__repr__(st.producer_epoch)}, "groups": {list_text(st.groups)}, '
                f'"head": {"null" if head is None else text_of(head)}, "last_seq": {number(last_seq)}, '
                f'"open_segment": {"null" if open_seg is None else int.__repr__(open_seg.seg)}, '
                f'"queue": {text_of(st.queue)}, "segments": {len(st.consume)}, "send": {list_text(st.send)}, '
                f'"stored": {number(stored)}, "subscriptions": {"null" if subs is None else list_text(subs)}}}')

    return row_text


def _config(call: AdminCall) -> QueueConfig:
    raw = call.arg("config", {})
    if not isinstance(raw, dict):
        raise ConfigError("config must be an object of queue settings")
    try:
        return QueueConfig(**raw)
    except TypeError as exc:
        raise ConfigError(f"bad queue settings: {exc}") from None


def _groups(call: AdminCall) -> list[str] | None:
    groups = call.arg("groups", None)
    if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
        raise ConfigError("groups must be a list of group names")
    return groups


def admin_verbs(readers: Readers, known: Known | None = None,
                rebalance: Callable[..., Any] | None = None,
                processes: Callable[[ZkStore], list[dict[str, Any]]] | None = None) -> dict[str, AdminVerb]:
    """The table of verbs a coordinator serves; ``readers(store)`` opens a ReplicaReader;
    ``known(names)``: what the elected coordinator's copies hold of those queues
    (``CoordinatorDaemon.known_queues``), so a listing need not read them; ``rebalance(max_moves=,
    dry_run=)``: the elected daemon's spread of idle queues' heads (``CoordinatorDaemon.rebalance``,
    issue 43), as JSON-able data; ``processes(store)``: every process of the cluster with its
    health, asked now (``ordq status``: ``ordq.cluster_live.live_status`` with this coordinator's
    credentials and kept channels), as ``ProcessStatus.to_dict()`` rows."""
    from ordq.admin.groups import add_group_to_queue, remove_group_from_queue, roll_queue
    from ordq.admin.parked import resolve_parked
    from ordq.admin.queue_views import describe_queue
    from ordq.admin.subscriptions import create_subscription, delete_subscription, reset_subscription
    from ordq.sdk.positions import latest_cursor, parse_reset_target
    from ordq.sdk.replicas import read_message

    def next_text(store: ZkStore, reader: ReplicaReader, queue: str, cursor: Any, starts_at: Any) -> str:
        # ``seq N``, the message a consumer at ``cursor`` delivers next, with ``, once it is
        # sent`` only when it is not stored yet (issue 24: ``earliest`` on a queue holding
        # messages resolves to a cursor, not a message)
        if starts_at is not None:
            return f"seq {starts_at.seq}"
        nxt = cursor.last_seq + 1
        try:
            stored = latest_cursor(store, reader, store.load_state(queue)[0]).last_seq >= nxt
        except OrdqError:  # no replica of an open segment answered: say only what is certain
            return f"seq {nxt}"
        return f"seq {nxt}" if stored else f"seq {nxt}, once it is sent"

    # -- queues ------------------------------------------------------------------------------

    def queue_list(call: AdminCall) -> Any:
        store = call.store
        phases = Phases()
        names, more = page_names((q for q in store.list_queues() if call.may_read(q)), *_paging(call))
        phases.done("names", names=len(names))
        # ``queue list --json``: the rows as the CLI prints them, which it writes out as they
        # come (issue 43: at 10^5 queues it decoded ~20 MB of rows and encoded them again, ~1.3 s
        # of CPU; a JSON string of the text costs ~0.1 s). Older CLIs ask not. A long list's
        # items are made as text at once (``row_texts``), a short one's through ``json_text``.
        as_text = bool(call.arg("rows_as_text", False))
        # one read of the states, not a describe per queue (issue 43; ordq/admin/queue_list.py);
        # a queue whose state does not parse: one line, the others listed
        rows_text: str | None = None
        # No cyclic collection while the rows are made (issue 43): at 10^5 queues they are
        # ~100,000 containers alive to the end, and the young collections they trigger in the
        # loaded leader took 0.2-0.9 s each (scale43q); they die by reference counting after.
        with collections_held(), readers(store) as reader:
            if as_text and len(names) > LONG_LIST:
                texts, corrupt = list_rows(store, reader, names, known, row_texts(), phases)
                # (fewer rows than names, deleted meanwhile: a short list's layout, as json_text's)
                rows_text = json_items_text(texts) if len(texts) > LONG_LIST else json_text(
                    [json.loads(t) for t in texts])
            else:
                rows, corrupt = list_rows(store, reader, names, known, queue_row, phases)
                if as_text:
                    rows_text = json_text(rows)
        if rows_text is not None:
            phases.done("text", text_bytes=len(rows_text))
        if phases.total_s >= LONG_LISTING_S:
            log.info("queue list of %d names: %.1f s: %s", len(names), phases.total_s, phases.line())
        if rows_text is None:
            return {"rows": rows, "corrupt": corrupt, "names": names, "more": more}
        if call.arg("text_apart", False):  # not escaped into the answer's JSON (CLIs since issue 43's stop 58)
            return TextAnswer({"corrupt": corrupt, "names": names, "more": more}, rows_text)
        return {"rows_text": rows_text, "corrupt": corrupt, "names": names, "more": more}

    def queue_describe(call: AdminCall) -> Any:
        with readers(call.store) as reader:
            return describe_queue(call.store, reader, call.arg("queue")).to_dict()

    def queue_create(call: AdminCall) -> Any:
        return call.store.create_queue(call.arg("queue"), _groups(call), _config(call)).to_dict()

    def queue_create_many(call: AdminCall) -> Any:
        # ``ordq queue create A B C ...`` (issue 43): batched transactions; the admin role on
        # every name is checked before any is created (the frame checked a valid token only)
        names = call.arg("queues")
        if not isinstance(names, list) or not names or not all(isinstance(q, str) for q in names):
            raise ConfigError("queues must be a non-empty list of queue names")
        if len(names) > MAX_CREATE_NAMES:
            raise ConfigError(f"at most {MAX_CREATE_NAMES} queues per request, not {len(names)}")
        for q in names:
            check_name("queue", q)
            call.require(q, "admin")
        request = call.arg("request", None)
        if request is not None and not isinstance(request, str):
            raise ConfigError("request must be a request id")
        created, existing = call.store.create_queues(names, _groups(call), _config(call), request=request)
        return {"created": [{"queue": st.queue, "groups": list(st.groups), "head": st.head} for st in created],
                "existing": existing}

    def queue_update(call: AdminCall) -> Any:
        changes = call.arg("changes")
        if not isinstance(changes, dict) or not changes:
            raise ConfigError("nothing to change: give at least one setting (see ordq queue update --help)")
        return {"queue": call.arg("queue"), "config": attrs.asdict(call.store.update_queue_config(call.arg("queue"),
                                                                                                  **changes))}

    def queue_add_group(call: AdminCall) -> Any:
        return add_group_to_queue(call.store, call.arg("queue"), call.arg("group")).to_dict()

    def queue_remove_group(call: AdminCall) -> Any:
        return remove_group_from_queue(call.store, call.arg("queue"), call.arg("group"),
                                       force=bool(call.arg("force", False))).to_dict()

    def queue_roll(call: AdminCall) -> Any:
        with readers(call.store) as reader:
            return roll_queue(call.store, reader, call.arg("queue")).to_dict()

    def queue_delete(call: AdminCall) -> Any:
        call.store.delete_queue(call.arg("queue"))
        return {"deleted": call.arg("queue")}

    # -- subscriptions -----------------------------------------------------------------------

    def sub_list(call: AdminCall) -> Any:
        with readers(call.store) as reader:
            view = describe_queue(call.store, reader, call.arg("queue"))
        return {"queue": call.arg("queue"), "last_seq": view.last_seq,
                "subscriptions": [s.to_dict() for s in view.subscriptions]}

    def sub_create(call: AdminCall) -> Any:
        queue, sub = call.arg("queue"), call.arg("subscription")
        target = parse_reset_target(call.arg("start", ["earliest"]))
        delay_ms = check_delay_ms(call.arg("delay_ms", 0))
        with readers(call.store) as reader:
            cursor, starts_at = create_subscription(call.store, reader, queue, sub, target,
                                                    settings={"delay_ms": delay_ms} if delay_ms else None)
            first = next_text(call.store, reader, queue, cursor, starts_at)
        return {"queue": queue, "subscription": sub, "start": str(target), "cursor": cursor.to_dict(),
                "next_seq": starts_at.seq if starts_at else None, "first": first, "delay_ms": delay_ms}

    def sub_alter(call: AdminCall) -> Any:
        # The consumer holding the subscription reads its settings again within
        # SETTINGS_REFRESH_S (sdk/consumer.py); a new one reads them before its first message.
        queue, sub, store = call.arg("queue"), call.arg("subscription"), call.store
        store.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
        before = store.sub_settings(queue, sub)
        after = {**before, "delay_ms": check_delay_ms(call.arg("delay_ms"))}
        store.set_sub_settings(queue, sub, after)
        return {"queue": queue, "subscription": sub, "before": before, "settings": after}

    def sub_reset(call: AdminCall) -> Any:
        queue, sub = call.arg("queue"), call.arg("subscription")
        target = parse_reset_target(call.arg("to"))
        with readers(call.store) as reader:
            result = reset_subscription(call.store, reader, queue, sub, target, force=bool(call.arg("force", False)))
            nxt = next_text(call.store, reader, queue, result.after, result.starts_at)
        return {"result": result.to_dict(), "next": nxt}

    def sub_delete(call: AdminCall) -> Any:
        queue, sub = call.arg("queue"), call.arg("subscription")
        holder = delete_subscription(call.store, queue, sub, force=bool(call.arg("force", False)))
        return {"queue": queue, "subscription": sub, "deleted": True, "held_by": holder}

    def sub_policy(call: AdminCall) -> Any:
        from ordq.sdk.failure import FailurePolicy

        queue, sub, store = call.arg("queue"), call.arg("subscription"), call.store
        stored = store.sub_policy(queue, sub)
        current = FailurePolicy(**{**stored, "backoff_s": tuple(stored["backoff_s"])}) if stored else FailurePolicy()
        change = call.arg("set", None)
        if change:
            backoff = change.get("backoff_s")
            current = FailurePolicy(on_failure=change.get("on_failure") or current.on_failure,
                                    attempts=change.get("attempts") or current.attempts,
                                    backoff_s=tuple(backoff) if backoff else current.backoff_s)
            store.set_sub_policy(queue, sub, attrs.asdict(current))
        else:
            store.get_cursor(queue, sub)  # unknown queue or subscription: an error
        return {"queue": queue, "subscription": sub, **attrs.asdict(current)}

    def sub_parked(call: AdminCall) -> Any:
        queue, sub = call.arg("queue"), call.arg("subscription")
        return {"queue": queue, "subscription": sub, "parked": call.store.parked(queue, sub)}

    def sub_parked_resolve(call: AdminCall) -> Any:
        queue, sub, action = call.arg("queue"), call.arg("subscription"), call.arg("action")
        if action not in ("replay", "drop"):
            raise ConfigError(f"parked: replay or drop, not {action!r}")
        key_hex = call.arg("key_hex", None)
        who = call.arg("operator", "") or "unknown"
        if call.token is not None:
            who = f"{who} (token {call.token.tid})"
        seqs = resolve_parked(call.store, queue, sub, action, seq=call.arg("seq", None),
                              key=bytes.fromhex(key_hex) if key_hex is not None else None,
                              every=bool(call.arg("all", False)), reason=call.arg("reason", None), who=who)
        return {"queue": queue, "subscription": sub, "action": action, "seqs": seqs}

    # -- topics ------------------------------------------------------------------------------

    def topic_list(call: AdminCall) -> Any:
        store = call.store
        names, more = page_names((t for t in store.list_topics() if call.may_read(partition_queue(t, 0))),
                                 *_paging(call))
        rows = []
        for name in names:
            try:
                topic = store.read_topic(name)
                first = store.load_state(partition_queue(name, 0))[0]
            except NotFound:
                continue  # deleted meanwhile
            rows.append({"topic": name, "partitions": topic.partitions, "hash": topic.hash,
                         "groups": list(first.groups)})
        return {"rows": rows, "names": names, "more": more}

    def topic_describe(call: AdminCall) -> Any:
        store, name = call.store, call.arg("topic")
        topic = store.read_topic(name)
        queues = [partition_queue(name, i) for i in range(topic.partitions)]
        for q in queues:
            call.require(q, ANY)
        with readers(store) as reader:
            views = [describe_queue(store, reader, q) for q in queues]
        rows: list[dict[str, Any]] = []
        for i, v in enumerate(views):
            st = v.state
            rows.append({"partition": i, "queue": st.queue, "head": st.head, "send": list(st.send),
                         "open_segment": st.open_segment.seg if st.open_segment else None,
                         "segments": len(st.consume), "stored": v.stored, "last_seq": v.last_seq,
                         "epoch": st.producer_epoch,
                         "subscriptions": {s.name: {"lag": s.lag, "held_by": s.held_by} for s in v.subscriptions}})
        return {"topic": name, "partitions": topic.partitions, "hash": topic.hash,
                "config": views[0].to_dict()["config"] if views else None, "queues": rows}

    def topic_create(call: AdminCall) -> Any:
        name, partitions = call.arg("topic"), call.arg("partitions")
        states = call.store.create_topic(name, partitions, _groups(call), _config(call))
        return {"topic": name, "partitions": partitions, "hash": HASH_NAME,
                "queues": {q: st.to_dict() for q, st in states.items()}}

    def topic_alter(call: AdminCall) -> Any:
        new = call.store.alter_topic(call.arg("topic"), call.arg("partitions"), rekey=bool(call.arg("rekey", False)))
        return {"topic": call.arg("topic"), "partitions": new.partitions, "hash": new.hash}

    def topic_delete(call: AdminCall) -> Any:
        call.store.delete_topic(call.arg("topic"))
        return {"deleted": call.arg("topic")}

    # -- tokens ------------------------------------------------------------------------------

    def auth_create(call: AdminCall) -> Any:
        from ordq.coordinator.store_base import zk_errors
        from ordq.coordinator.tokens import create_token, parse_grants, touch

        store = call.store
        roles = call.arg("roles")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ConfigError("roles must be a list of ROLE[:QUEUE]")
        grants = parse_grants(roles)
        unknown = sorted(set(grants) - {"*"} - set(store.list_queues()))
        if unknown and not call.arg("allow_unknown_queue", False):
            # A grant on a name no queue has is most often a typo: the token would be refused
            # on the queue meant, far from here. Creating the queue later is what the flag is for.
            raise NotFound(f"no queue {', '.join(unknown)} (see: ordq queue list); give --allow-unknown-queue "
                           "to grant roles on a queue created later")
        with zk_errors(store.hosts):
            rec, token = create_token(store.client, store.paths.root, grants, str(call.arg("name", "")))
            touch(store.client, store.paths.root)  # brokers reload (a token is no ZooKeeper identity)
        return {**rec.describe(), "token": token}

    def auth_list(call: AdminCall) -> Any:
        from ordq.coordinator.tokens import enforced, load_revoked, load_tokens

        client, root = call.store.client, call.store.paths.root
        on = enforced(client, root)
        doc = {"enforced": on, "tokens": [r.describe() for r in sorted(load_tokens(client, root).values(),
                                                                       key=lambda r: r.tid)]}
        if call.arg("all", False):  # the revoked ones too (issue 42), each with its revoked_ms
            doc["revoked"] = load_revoked(client, root)
        return doc

    def auth_revoke(call: AdminCall) -> Any:
        from ordq.coordinator.store_base import zk_errors
        from ordq.coordinator.tokens import revoke_token, touch

        tid = call.arg("id")
        if not isinstance(tid, str) or not re.fullmatch(r"[0-9a-f]{8}", tid):
            raise ConfigError("not a token id: 8 hex digits, as ordq auth list shows (or the whole token)")
        store = call.store
        with zk_errors(store.hosts):
            revoke_token(store.client, store.paths.root, tid)
            touch(store.client, store.paths.root)  # brokers refuse it
        return {"revoked": tid}

    # -- one message -------------------------------------------------------------------------

    def peek(call: AdminCall) -> Any:
        seq = call.arg("seq")
        if not isinstance(seq, int) or seq < 0:
            raise ConfigError("peek: seq must be an integer >= 0")
        with readers(call.store) as reader:
            peeked = read_message(call.store, reader, call.arg("queue"), seq)
        return peeked.to_dict(full=bool(call.arg("full", False)), limit=int(call.arg("limit", 256)))

    # -- finding by key or time (issue 41) ------------------------------------------------------

    def _find(call: AdminCall, queue: str) -> Any:
        from ordq.common.errors import SubscriptionNotFound
        from ordq.sdk.find import describe_search, find_in_queue, key_of

        key = key_of(call.args)
        time_us, from_us, limit = call.arg("time_us", None), call.arg("from_time_us", 0), call.arg("limit", 100)
        if not all(isinstance(v, int) for v in (from_us, limit)) or not isinstance(time_us, int | None):
            raise ConfigError("find: times are integers (microseconds), limit an integer")
        cursors = {}
        for sub in call.store.list_subscriptions(queue):
            try:
                cursors[sub] = call.store.get_cursor(queue, sub)[0]
            except SubscriptionNotFound:
                continue  # deleted meanwhile
        with readers(call.store) as reader:
            found = find_in_queue(call.store, reader, queue, key=key, time_us=time_us, from_time_us=from_us,
                                  limit=limit, cursors=cursors)
        return {**found.to_dict(), "searched_for": describe_search(key, time_us, from_us)}

    def find(call: AdminCall) -> Any:
        return _find(call, call.arg("queue"))

    def find_topic(call: AdminCall) -> Any:
        from ordq.coordinator.topics import partition_of
        from ordq.sdk.find import key_of

        name, key = call.arg("topic"), key_of(call.args)
        if key is None:
            raise ConfigError("find --topic needs a key: it searches the one partition the key routes to")
        config = call.store.read_topic(name)
        q = partition_queue(name, partition_of(key, config.partitions))
        call.require(q, "consume")
        return _find(call, q)

    def group_rebalance(call: AdminCall) -> Any:
        max_moves, dry_run = call.arg("max_moves", 1000), call.arg("dry_run", False)
        if not isinstance(max_moves, int) or isinstance(max_moves, bool) or not 0 <= max_moves <= 1_000_000:
            raise ConfigError("max_moves must be a whole number from 0 to 1000000")
        if rebalance is None:
            raise ConfigError("this coordinator does not spread heads (no daemon beside its service)")
        return rebalance(max_moves=max_moves, dry_run=bool(dry_run))

    def cluster_status(call: AdminCall) -> Any:
        # ``ordq status`` of any cluster (issue 42): one call, where the CLI opened a ZooKeeper
        # session and a TLS connection to every process itself (0.53 s of CPU on a quiet box)
        if processes is None:
            raise ConfigError("this coordinator does not sweep its cluster's processes")
        rows = processes(call.store)
        leader = next((r["name"] for r in rows if r["kind"] == "coordinator" and r["state"] == "leader"), None)
        return {"processes": rows, "leader": leader, "healthy": all(r["healthy"] for r in rows),
                "zk": call.store.hosts, "root": call.store.paths.root}

    def group_list(call: AdminCall) -> Any:
        # ``ordq group list`` (issue 42): one call, where the CLI opened a ZooKeeper session and
        # read every queue's state; the queues from the elected coordinator's copies (``known``)
        from ordq.admin.group_list import group_rows
        from ordq.common.errors import CorruptState

        store = call.store
        names = [q for q in store.list_queues() if call.may_read(q)]
        states = {q: v[0] for q, v in (known(names) if known is not None else {}).items()}
        read = store.load_states([q for q in names if q not in states])  # no subscriptions: not shown
        states.update({q: v[0] for q, v in read.items() if not isinstance(v, CorruptState)})
        return {"rows": group_rows(store, states, call.may_read)}

    def top_sample(call: AdminCall) -> Any:
        # ``ordq top`` (issue 42): a frame of the queues the caller may read, a page of them, with
        # no rates (the command takes them between two frames); the CLI held a ZooKeeper session
        # and a channel to every broker for it
        import time

        from ordq.admin.top import sample, top_frame

        store, queues = call.store, call.arg("queues", None)
        if queues is not None:
            if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
                raise ConfigError("queues must be a list of queue names")
            for q in queues:
                check_name("queue", q)
                call.require(q, ANY)
        prefix, after, limit = _paging(call)
        page: dict[str, Any] = {"names": [], "more": False}

        def select(names: list[str]) -> list[str]:
            page["names"], page["more"] = page_names((n for n in names if call.may_read(n)), prefix, after, limit)
            return list(page["names"])

        with readers(store) as reader:
            got = sample(store, reader, queues or None, select=select)
        return {"frame": top_frame(got), "at": time.time(), **page}

    def topic_group(call: AdminCall) -> Any:
        # ``ordq topic group T G`` (issue 42): one call, where the CLI opened a ZooKeeper
        # session and a reader of every partition's replicas
        from ordq.admin.consumer_groups import describe_consumer_group

        store, name = call.store, call.arg("topic")
        for q in (partition_queue(name, i) for i in range(store.read_topic(name).partitions)):
            call.require(q, ANY)
        with readers(store) as reader:
            return describe_consumer_group(store, reader, name, call.arg("group"))

    queue, sub_queue, topic = on_arg("queue"), on_arg("queue"), on_arg("topic", "topic")
    return {
        "queue list": AdminVerb(SOME, everywhere, queue_list),
        "queue describe": AdminVerb(ANY, queue, queue_describe),
        "queue create": AdminVerb("admin", queue, queue_create),
        "queue create-many": AdminVerb(SOME, everywhere, queue_create_many),
        "queue update": AdminVerb("admin", queue, queue_update),
        "queue add-group": AdminVerb("admin", queue, queue_add_group),
        "queue remove-group": AdminVerb("admin", queue, queue_remove_group),
        "queue roll": AdminVerb("admin", queue, queue_roll),
        "queue delete": AdminVerb("admin", queue, queue_delete),
        "sub list": AdminVerb(ANY, sub_queue, sub_list),
        "sub create": AdminVerb("admin", sub_queue, sub_create),
        "sub reset": AdminVerb("admin", sub_queue, sub_reset),
        "sub delete": AdminVerb("admin", sub_queue, sub_delete),
        "sub policy": AdminVerb("admin", sub_queue, sub_policy),
        "sub alter": AdminVerb("admin", sub_queue, sub_alter),
        "sub parked": AdminVerb(ANY, sub_queue, sub_parked),
        "sub parked resolve": AdminVerb("admin", sub_queue, sub_parked_resolve),
        "topic list": AdminVerb(SOME, everywhere, topic_list),
        "topic describe": AdminVerb(ANY, topic, topic_describe),
        "topic create": AdminVerb("admin", everywhere, topic_create),
        "topic alter": AdminVerb("admin", everywhere, topic_alter),
        "topic delete": AdminVerb("admin", everywhere, topic_delete),
        "auth create": AdminVerb("admin", everywhere, auth_create, changes_tokens=True, needs_tls=True),
        "auth list": AdminVerb("admin", everywhere, auth_list),
        "auth revoke": AdminVerb("admin", everywhere, auth_revoke, changes_tokens=True),
        "peek": AdminVerb("consume", queue, peek),
        "find": AdminVerb("consume", queue, find),
        "find topic": AdminVerb(ANY, topic, find_topic),
        "group rebalance": AdminVerb("admin", everywhere, group_rebalance),
        "cluster status": AdminVerb("admin", everywhere, cluster_status),
        "group list": AdminVerb(SOME, everywhere, group_list),
        "top sample": AdminVerb(SOME, everywhere, top_sample),
        "topic group": AdminVerb(ANY, topic, topic_group),
    }
