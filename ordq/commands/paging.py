"""Paging and filtering of long listings (``queue list``, ``sub list``, ``top``): by name,
in name order. With 10,000 queues a listing that describes every one reads every queue's
replicas; a page describes only what it shows (issue 29).

A page is the names that start with ``--prefix``, after ``--after`` (the last name of the
previous page), at most ``--limit`` of them. When more remain, a line on stderr says how to
get the next page (``--after LAST``); stdout stays a table, or JSON, of this page only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from ordq.commands import int_in

DEFAULT_LIMIT = 100


def add_paging(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--prefix", default="", metavar="TEXT", help=f"only {what} whose name starts with TEXT")
    parser.add_argument("--limit", type=int_in(1, 10**6), default=DEFAULT_LIMIT, metavar="N",
                        help=f"at most N {what} (default %(default)s); stderr says how to get the next page")
    parser.add_argument("--after", default="", metavar="NAME",
                        help="start after NAME (the last of the previous page), in name order")


class Page:
    """One page of names; ``more``: names past this page match too. (A plain class, not attrs:
    ``ordq queue list`` loads no attrs, issue 42.)"""

    __slots__ = ("names", "more")

    def __init__(self, *, names: list[str], more: bool) -> None:
        self.names = names
        self.more = more

    def __repr__(self) -> str:
        return f"Page(names={self.names!r}, more={self.more!r})"

    @property
    def next_after(self) -> str | None:
        return self.names[-1] if self.more and self.names else None


def page(names: Iterable[str], args: argparse.Namespace) -> Page:
    """The page of ``names`` that ``--prefix``, ``--after`` and ``--limit`` select."""
    prefix, after, limit = args.prefix, args.after, args.limit
    matching = sorted(n for n in names if n.startswith(prefix) and n > after)
    return Page(names=matching[:limit], more=len(matching) > limit)


def say_next(p: Page, what: str) -> None:
    """On stderr: how to get the next page, if there is one."""
    if p.next_after is not None:
        sys.stdout.flush()  # after the page, also when both go to one pipe
        print(f"ordq: {len(p.names)} {what} shown, more follow: add --after {p.next_after}", file=sys.stderr)
