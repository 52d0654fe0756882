"""JSON logs: one object per line with service, level, extras and the current trace ids."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from common_runtime_support import SpanFixture

from services.common.logging import configure_logging


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("usage", "DEBUG", stream=stream)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_outside_a_span_has_no_trace_ids(log_stream: io.StringIO) -> None:
    logging.getLogger("hami.test").info("journal opened at %s", "/data/usage.sqlite",
                                        extra={"revision": 42})
    (line,) = _lines(log_stream)
    assert line["message"] == "journal opened at /data/usage.sqlite"
    assert line["level"] == "INFO"
    assert line["logger"] == "hami.test"
    assert line["service"] == "usage"
    assert line["revision"] == 42
    assert str(line["time"]).endswith("Z")
    assert "trace_id" not in line and "span_id" not in line


def test_a_line_inside_a_span_carries_its_trace_and_span_ids(
    log_stream: io.StringIO, spans: SpanFixture
) -> None:
    provider, _exporter = spans
    with provider.get_tracer("test").start_as_current_span("usage.record") as span:
        logging.getLogger("hami.test").warning("pod shrunk", extra={"pod_uid": "uid-1"})
    (line,) = _lines(log_stream)
    context = span.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"
    assert line["pod_uid"] == "uid-1"


def test_exceptions_stay_on_one_json_line(log_stream: io.StringIO) -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        logging.getLogger("hami.test").exception("failed")
    (line,) = _lines(log_stream)
    assert "ValueError: bad value" in str(line["exception"])


def test_reconfiguring_replaces_the_handler_instead_of_doubling_lines(
    log_stream: io.StringIO,
) -> None:
    second = io.StringIO()
    handler = configure_logging("usage", "INFO", stream=second)
    try:
        logging.getLogger("hami.test").info("once")
        logging.getLogger("hami.test").debug("filtered by the new level")
    finally:
        logging.getLogger().removeHandler(handler)
    assert log_stream.getvalue() == ""
    assert [line["message"] for line in _lines(second)] == ["once"]
