"""Consumer groups on keyed topics: which member owns which partition. Pure.

Rules: a deterministic function of the sorted live members and the partition count, and
nothing else (no previous assignment, no clock, no randomness): every member computes the
same answer from the same membership, so no member needs to tell another what it owns.

Guarantee (property-tested, tests/test_consumer_group.py): every partition has exactly one
owner; the owners' counts differ by at most one; the answer does not depend on the order the
members are given in. Moves are few (a bonus, not a guarantee): each partition ranks the
members by a hash of (partition, member) — rendezvous hashing — and goes to the highest-ranked
member that still has room, so a join or a leave mostly moves only the partitions the
newcomer ranks first or the leaver held.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable

MAX_MEMBERS = 1000  # per group: the coordinator refuses a member lease beyond this (counted)


@functools.lru_cache(maxsize=1 << 16)  # a coordinator re-assigns a group at every generation
def _rank(partition: int, member: str) -> bytes:
    return hashlib.blake2b(f"{partition}\0{member}".encode(), digest_size=8).digest()


def assign_partitions(members: Iterable[str], partitions: int) -> dict[str, list[int]]:
    """``{member: [partition, ...]}`` for every member (an empty list when there are more
    members than partitions); {} when there is no member."""
    names = sorted(set(members))
    if not names:
        return {}
    base, extra = divmod(partitions, len(names))
    owned: dict[str, list[int]] = {m: [] for m in names}
    with_extra = 0  # members already at base + 1 (at most ``extra`` of them)
    for p in range(partitions):
        # The highest-ranked member that still has room (a max, not a sort: a coordinator
        # computes this for every generation of a group of up to MAX_MEMBERS members).
        room = [m for m in names if len(owned[m]) < base or (len(owned[m]) == base and with_extra < extra)]
        m = max(room, key=lambda m: (_rank(p, m), m))
        with_extra += len(owned[m]) == base
        owned[m].append(p)
    return owned


def owner_of(members: Iterable[str], partitions: int) -> dict[int, str]:
    """``{partition: member}``: the inverse of ``assign_partitions``."""
    return {p: m for m, ps in assign_partitions(members, partitions).items() for p in ps}


# -- the ids of a group's consumers -----------------------------------------------------------------
# The consumer of partition p run by member m names both: the coordinator grants the partition's
# consumer lease only to a holder whose id names the partition's owner (coordinator/group_desk.py),
# and ``ordq topic group`` shows which member delivers a partition from the consumer's id.

_CONSUMER_ID = re.compile(r"(.+)-p(\d+)-(\d+)")


def member_consumer_id(member_id: str, partition: int, tenure: int) -> str:
    """The id of member ``member_id``'s ``tenure``-th consumer of ``partition``."""
    return f"{member_id}-p{partition}-{tenure}"


def parse_consumer_id(consumer_id: str) -> tuple[str, int, int] | None:
    """(member, partition, tenure) of a group consumer's id; None when it is not one."""
    m = _CONSUMER_ID.fullmatch(consumer_id)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def member_of_consumer(consumer_id: str | None) -> str | None:
    """The member a group consumer's id names (``member_consumer_id``); else the id itself."""
    if consumer_id is None:
        return None
    parsed = parse_consumer_id(consumer_id)
    return parsed[0] if parsed else consumer_id
