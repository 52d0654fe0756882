"""Error mapping: what a servicer raises becomes one gRPC status, decided in one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
import pytest
from common_runtime_support import DEAD_TARGET, SECRET, ServeFn
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from accounting.errors import AccountingError, FieldViolation, InvalidInputError
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common.errors import (
    MAX_MESSAGE_CHARS,
    DependencyUnavailableError,
    NotFoundError,
    map_errors,
    status_for,
)


class FakeUpstreamError(grpc.RpcError):
    """What a client stub raises: an RpcError that is also a grpc.Call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass(frozen=True)
class Case:
    name: str
    error: Exception
    want_code: grpc.StatusCode
    want_in_message: str
    want_expected: bool = True


CASES = [
    Case("bad input names every field",
         InvalidInputError([FieldViolation("pod.uid", "must not be empty"),
                            FieldViolation("pod.containers[0].name", "must be unique")]),
         grpc.StatusCode.INVALID_ARGUMENT,
         "pod.uid: must not be empty; pod.containers[0].name: must be unique"),
    Case("an untracked pod is not found", NotFoundError("pod team-a/p is not tracked"),
         grpc.StatusCode.NOT_FOUND, "pod team-a/p is not tracked"),
    Case("a missing dependency is unavailable",
         DependencyUnavailableError("usage recorder unavailable at 127.0.0.1:50053: refused"),
         grpc.StatusCode.UNAVAILABLE, "at 127.0.0.1:50053"),
    Case("another accounting error is a failed precondition",
         AccountingError("node n1 is not registered"),
         grpc.StatusCode.FAILED_PRECONDITION, "node n1 is not registered"),
    Case("an unreachable usage recorder makes the caller unavailable",
         FakeUpstreamError(grpc.StatusCode.UNAVAILABLE, "ipv4:127.0.0.1:50053: connection refused"),
         grpc.StatusCode.UNAVAILABLE, "usage recorder unavailable (UNAVAILABLE): ipv4:127.0.0.1"),
    Case("an upstream deadline also counts as unavailable",
         FakeUpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
         grpc.StatusCode.UNAVAILABLE, "usage recorder unavailable (DEADLINE_EXCEEDED)"),
    Case("an upstream verdict on the request passes through",
         FakeUpstreamError(grpc.StatusCode.INVALID_ARGUMENT, "pod.uid: must not be empty"),
         grpc.StatusCode.INVALID_ARGUMENT, "usage recorder: pod.uid: must not be empty"),
    Case("an upstream internal error is our internal error",
         FakeUpstreamError(grpc.StatusCode.INTERNAL, f"boom {SECRET}"),
         grpc.StatusCode.INTERNAL, "internal error", want_expected=False),
    Case("a bug is internal and does not quote the exception",
         KeyError(SECRET), grpc.StatusCode.INTERNAL, "internal error", want_expected=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_status_for(case: Case) -> None:
    status = status_for(case.error)
    assert status.code == case.want_code
    assert case.want_in_message in status.message
    assert status.expected == case.want_expected
    assert SECRET not in status.message


def _call(target: str, uid: str) -> usage_pb2.GetPodUsageResponse:
    with grpc.insecure_channel(target) as channel:
        return usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
            usage_pb2.GetPodUsageRequest(pod_uid=uid), timeout=5
        )


def test_invalid_input_is_invalid_argument_naming_every_field(serve: ServeFn) -> None:
    handle = serve()
    with pytest.raises(grpc.RpcError) as caught:
        _call(handle.target, "invalid")
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "pod.uid: must not be empty" in error.details()
    assert "pod.containers[1].grants[0].memory_mib: must be >= 0" in error.details()
    # The same violations, machine-readable, as a google.rpc.BadRequest detail.
    status = rpc_status.from_call(error)
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [
        ("pod.uid", "must not be empty"),
        ("pod.containers[1].grants[0].memory_mib", "must be >= 0"),
    ]


def test_unexpected_exception_is_internal_without_its_text_and_is_logged(
    serve: ServeFn, caplog: pytest.LogCaptureFixture
) -> None:
    handle = serve()
    with caplog.at_level(logging.ERROR, logger="services.common.errors"), \
            pytest.raises(grpc.RpcError) as caught:
        _call(handle.target, "bug")
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert SECRET not in caught.value.details()
    assert "RuntimeError" not in caught.value.details()
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert len(logged) == 1
    assert "GetPodUsage" in logged[0].getMessage()


@pytest.mark.parametrize(
    ("uid", "want_code", "want_in_details"),
    [
        ("missing", grpc.StatusCode.NOT_FOUND, "pod missing is not tracked"),
        ("dependency", grpc.StatusCode.UNAVAILABLE, "kubernetes API unavailable at 10.0.0.1:443"),
        ("own-abort", grpc.StatusCode.PERMISSION_DENIED, "the servicer said no itself"),
        ("upstream", grpc.StatusCode.UNAVAILABLE, "usage recorder unavailable"),
    ],
    ids=[
        "an untracked pod is not found",
        "a dependency error names the dependency",
        "the servicer's own abort is not swallowed",
        "a real upstream call to a dead address becomes unavailable",
    ],
)
def test_mapped_codes_over_the_wire(
    serve: ServeFn, uid: str, want_code: grpc.StatusCode, want_in_details: str
) -> None:
    handle = serve()
    with pytest.raises(grpc.RpcError) as caught:
        _call(handle.target, uid)
    assert caught.value.code() == want_code
    assert want_in_details in caught.value.details()


def test_upstream_unavailable_details_carry_the_address(serve: ServeFn) -> None:
    handle = serve()
    with pytest.raises(grpc.RpcError) as caught:
        _call(handle.target, "upstream")
    assert DEAD_TARGET in caught.value.details()


def test_stream_ends_with_the_mapped_status_after_earlier_messages(serve: ServeFn) -> None:
    handle = serve()
    received = []
    with grpc.insecure_channel(handle.target) as channel:
        stream = usage_pb2_grpc.UsageRecorderStub(channel).WatchUsage(
            usage_pb2.WatchUsageRequest(send_initial_state=True), timeout=5
        )
        with pytest.raises(grpc.RpcError) as caught:
            for event in stream:
                received.append(event.revision)
    assert received == [1]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "send_initial_state: not supported by this fake" in caught.value.details()


def test_stream_without_error_delivers_every_message(serve: ServeFn) -> None:
    handle = serve()
    with grpc.insecure_channel(handle.target) as channel:
        stream = usage_pb2_grpc.UsageRecorderStub(channel).WatchUsage(
            usage_pb2.WatchUsageRequest(), timeout=5
        )
        assert [event.revision for event in stream] == [1, 2]


def test_a_huge_invalid_argument_stays_small_enough_for_grpc_trailers() -> None:
    # 100 violations of ~200 characters once made a 20 KB status that clients refused as
    # RESOURCE_EXHAUSTED "Stream removed (received metadata size exceeds ...)".
    error = InvalidInputError(
        FieldViolation(f"pod.containers[{i}].requests[0].memory_mib", "x" * 160) for i in range(100)
    )
    status = status_for(error)
    assert status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(status.message) <= MAX_MESSAGE_CHARS
    assert status.message.startswith("invalid request: pod.containers[0].requests[0].memory_mib")
    assert status.bad_request is not None
    last = status.bad_request.field_violations[-1]
    kept = len(status.bad_request.field_violations) - 1
    assert last.description == f"and {100 - kept} more problems"
    assert status.bad_request.ByteSize() <= MAX_MESSAGE_CHARS + 500


# Values an attacker may make errors quote: long, of multi-byte characters (each up to nine
# bytes once percent-encoded in grpc-message), of "%" (three), of separators and escapes.
HOSTILE_TEXT = {
    "long ascii": "x" * 100_000,
    "percent signs": "%" * 20_000,
    "CJK": "\u4e2d\u6587" * 10_000,
    "emoji": "\U0001f680" * 10_000,
    "a lone surrogate": "GPU-\ud800" * 5_000,
    "control characters": "\x00\n\r\t\x7f" * 5_000,
}
HOSTILE_ERRORS: dict[str, Exception] = {}
for _label, _text in HOSTILE_TEXT.items():
    HOSTILE_ERRORS[f"one violation quoting {_label}"] = InvalidInputError.single(
        f'pod.annotations["{_text}"]', f"must not be {_text}")
    HOSTILE_ERRORS[f"a hundred violations quoting {_label}"] = InvalidInputError(
        FieldViolation(f"pod.containers[{i}].name", f"got {_text[:300]}") for i in range(100))
    HOSTILE_ERRORS[f"not found quoting {_label}"] = NotFoundError(f"node {_text} is unknown")
    HOSTILE_ERRORS[f"a failed precondition quoting {_label}"] = AccountingError(_text)
    HOSTILE_ERRORS[f"an upstream verdict quoting {_label}"] = FakeUpstreamError(
        grpc.StatusCode.INVALID_ARGUMENT, _text)


class _Raiser:
    @map_errors
    def call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        raise HOSTILE_ERRORS[request.decode()]


@pytest.fixture(scope="module")
def raiser_target() -> object:
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    raiser = _Raiser()
    handler = grpc.method_handlers_generic_handler("test.Raiser", {
        "Call": grpc.unary_unary_rpc_method_handler(raiser.call)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize("name", HOSTILE_ERRORS, ids=lambda name: name)
def test_an_error_quoting_any_value_arrives_as_itself_within_its_bounds(
    raiser_target: str, name: str
) -> None:
    """Over a real connection, with gRPC's default client limits: the code the error maps
    to (never RESOURCE_EXHAUSTED from the metadata's size), a message of at most 1,500
    printable ASCII characters, and for INVALID_ARGUMENT a BadRequest within the same bound.
    Sent 20 times: a status past the soft limit is refused only now and then."""
    want = status_for(HOSTILE_ERRORS[name]).code
    with grpc.insecure_channel(raiser_target) as channel:
        call = channel.unary_unary("/test.Raiser/Call")
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as caught:
                call(name.encode(), timeout=5)
            error = caught.value
            assert error.code() == want, (error.code(), error.details()[:200])
            details = error.details()
            assert len(details) <= MAX_MESSAGE_CHARS and details.isascii(), details[:200]
            assert details.isprintable()
            if want is grpc.StatusCode.INVALID_ARGUMENT and not name.startswith("an upstream"):
                status = rpc_status.from_call(error)
                assert status is not None and status.message == details
                bad_request = error_details_pb2.BadRequest()
                assert status.details[0].Unpack(bad_request)
                violations = bad_request.field_violations
                assert sum(len(v.field) + len(v.description) + 2 for v in violations) <= (
                    MAX_MESSAGE_CHARS)
