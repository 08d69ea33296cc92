"""The CLI's spans (DESIGN 17): ``imggw generate`` is one ``imggw.generate`` span holding its
submit, its wait and its download, recorded by the OpenTelemetry SDK's in-memory exporter as
an application (or ``opentelemetry-instrument``) would set it, over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from imggw_client import _telemetry
from imggw_client.mock import MockGateway

from ..client.test_telemetry import by_name, parent_of
from .helpers import CANARY, imggw

PROMPT = "a canary prompt 5d2e that must never be recorded"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider only, set as an application sets it, then back to none. The meter
    provider's proxy is left as it is: the SDK's instruments, made once, stay bound to it."""
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()  # type: ignore[attr-defined]
        assert not _telemetry.active()  # the rest of the suite records nothing


def test_generate_is_one_span_holding_its_submit_wait_and_download(
    spans: InMemorySpanExporter, served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    run = imggw("generate", PROMPT, "--base-url", url, "-o", str(tmp_path), "--json")
    assert run.code == 0, run.err
    (record,) = run.records()
    named = by_name(spans.get_finished_spans())
    (generate,) = named["imggw.generate"]
    children = [s for s in spans.get_finished_spans() if parent_of(s) == generate.context.span_id]
    assert sorted(s.name for s in children) == ["imggw.download", "imggw.submit", "imggw.wait"]
    (download,) = named["imggw.download"]
    assert parent_of(download) == generate.context.span_id
    assert generate.attributes is not None
    attempts = sum(s.attributes["imggw.attempts"] for s in children)  # type: ignore[index,misc]
    wait = next(s for s in children if s.name == "imggw.wait")
    assert wait.attributes is not None
    assert dict(generate.attributes) == {
        "imggw.surface": "beta",
        "imggw.task_id": record["task_id"],
        "imggw.status": "succeeded",
        "imggw.attempts": attempts,
        "imggw.polls": wait.attributes["imggw.polls"],
    }
    assert attempts >= 3  # a submit, a poll at least, a file
    assert generate.status.status_code is StatusCode.UNSET
    for span in spans.get_finished_spans():
        for value in (span.attributes or {}).values():
            assert PROMPT not in str(value)
            assert CANARY not in str(value)


@pytest.mark.slow
def test_a_download_that_fails_marks_the_generate_span(
    spans: InMemorySpanExporter, served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    (tmp_path / "file").write_text("")
    run = imggw("generate", "a cat", "--base-url", url, "-o", str(tmp_path / "file"))
    assert run.code == 2  # a file where the folder goes: refused before the submit
    assert "imggw.generate" not in by_name(spans.get_finished_spans())
    taken = tmp_path / "out"
    taken.mkdir()
    first = imggw("generate", "a cat", "--base-url", url, "-o", str(taken), "--json")
    task_id = first.records()[0]["task_id"]
    (taken / f"{task_id}-0.png").rename(taken / "kept.png")
    (taken / f"{int(task_id) + 1}-0.png").write_bytes(b"not the result")  # the next task's name
    spans.clear()
    run = imggw("generate", "a dog", "--base-url", url, "-o", str(taken))
    assert run.code == 2, run.err
    named = by_name(spans.get_finished_spans())
    (generate,) = named["imggw.generate"]
    (download,) = named["imggw.download"]
    assert parent_of(download) == generate.context.span_id
    for span in (generate, download):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == "DownloadError"
