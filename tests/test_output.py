"""``--json`` output (ordq/output.py): indented as before for a small document; a long list one
item a line, each compact, so that ``queue list --json`` of 10^5 queues encodes in C (issue 43)."""

from __future__ import annotations

import io
import json
from pathlib import PurePosixPath

from ordq.output import LONG_LIST, emit_json


def _emitted(obj: object) -> str:
    out = io.StringIO()
    emit_json(obj, out)
    return out.getvalue()


def test_a_small_document_is_indented_as_before() -> None:
    doc = [{"queue": "q", "send": ["g1", "g2"], "stored": None, "subscriptions": []}, {"b": 1, "a": {"x": [1]}}]
    assert _emitted(doc) == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert _emitted({"rows": doc}) == json.dumps({"rows": doc}, indent=2, sort_keys=True) + "\n"


def test_a_long_list_is_one_compact_item_a_line_and_the_same_json() -> None:
    rows = [{"queue": f"q-{i:06d}", "send": ["g1"], "last_seq": i if i % 2 else None, "z": {"b": 1, "a": 2}}
            for i in range(LONG_LIST + 1)]
    text = _emitted(rows)
    assert json.loads(text) == rows
    lines = text.splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == len(rows) + 2
    assert lines[1] == '  {"last_seq": null, "queue": "q-000000", "send": ["g1"], "z": {"a": 2, "b": 1}},'
    # a value JSON has no type for is written as its text, as in a small document
    odd = [{"at": PurePosixPath("/d/q")}] * (LONG_LIST + 1)
    assert _emitted(odd).splitlines()[1] == '  {"at": "/d/q"},'
