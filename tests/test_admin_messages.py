"""ordq/wire/admin_messages.py: the Admin and Coordinators messages written and read without
protobuf say what the generated module (``ordq_pb2``) says, byte for byte where it writes."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ordq.wire import admin_messages as light
from ordq.wire import ordq_pb2 as pb
from ordq.wire import varint

texts = st.text(max_size=300)
blobs = st.binary(max_size=3000)


@given(verb=texts, args=blobs)
def test_an_admin_request_is_the_generated_modules_bytes(verb: str, args: bytes) -> None:
    wire = light.admin_request(verb, args)
    assert wire == pb.AdminRequest(verb=verb, args_json=args).SerializeToString(deterministic=True)
    assert pb.AdminRequest.FromString(wire) == pb.AdminRequest(verb=verb, args_json=args)
    assert light.as_bytes(pb.AdminRequest(verb=verb, args_json=args)) == wire == light.as_bytes(wire)


@given(result=blobs, text=blobs,
       junk=st.lists(st.tuples(st.integers(3, 99), st.integers(0, 2**64 - 1)), max_size=4))
def test_an_admin_answer_reads_as_the_generated_module_writes_it(result: bytes, text: bytes,
                                                                 junk: list[tuple[int, int]]) -> None:
    wire = pb.AdminResponse(result_json=result, text=text).SerializeToString()
    # Fields a newer coordinator may add (numbers this reader does not know) are skipped.
    for number, value in junk:
        wire += varint.encode(number << 3) + varint.encode(value)
    answer = light.read_admin_answer(wire)
    assert (answer.result_json, answer.text) == (result, text)


@given(addresses=st.lists(texts, max_size=8))
def test_a_coordinators_answer_reads_as_the_generated_module_writes_it(addresses: list[str]) -> None:
    wire = pb.CoordinatorsResponse(addresses=addresses).SerializeToString()
    assert light.read_coordinators_answer(wire).addresses == addresses
    assert pb.CoordinatorsRequest().SerializeToString() == light.COORDINATORS_REQUEST


@given(data=st.binary(max_size=200))
@example(data=b"\xfd\x00\x00\x00\x00\x00\xa5\x80\x80\x80\x10\x00\x00\x00\x00")  # a key over 32 bits (CI)
@example(data=b"\x08\x01")  # field 1 as a varint
@example(data=b"\x10\x01")  # field 2 (text) as a varint
@example(data=b"\x12\x02ab\x0a\x00")  # text, then an empty result
def test_any_bytes_read_as_protobuf_reads_them_or_refused(data: bytes) -> None:
    """Whatever the bytes, the reader answers what protobuf's parser answers, or both refuse."""
    try:
        parsed = pb.AdminResponse.FromString(data)
        expected: tuple[bytes, bytes] | None = (parsed.result_json, parsed.text)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError
        expected = None
    try:
        answer = light.read_admin_answer(data)
        got: tuple[bytes, bytes] | None = (answer.result_json, answer.text)
    except ValueError:
        got = None
    if expected is not None and got is not None:
        assert got == expected
    else:  # protobuf accepts groups (wire types 3/4) this reader refuses; never the other way
        assert got is None


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\x08\x80", b"\x00\x01", b"\x0f"])
def test_broken_answers_are_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        light.read_admin_answer(data)


def test_the_method_names_are_the_services() -> None:
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    for method, path in (("Admin", light.ADMIN_METHOD), ("Coordinators", light.COORDINATORS_METHOD)):
        assert path == f"/{service.full_name}/{service.methods_by_name[method].name}"
