"""OpenTelemetry traces and metrics (DESIGN 17), recorded by the OpenTelemetry SDK's in-memory
exporter and metric reader, over loopback against the reference gateway."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from imggw_client import (
    AsyncClient,
    Client,
    PollPolicy,
    RequestValidationError,
    TaskFailedError,
    _telemetry,
)
from imggw_client.batch import run_batch
from imggw_client.mock import MockGateway

KEY = "sk-telemetry-canary-4b1d77"
PROMPT = "a canary prompt 93f1e0 that must never be recorded"
FAST = {"poll": PollPolicy(initial_interval=0.05, max_interval=0.1)}
QUICK = {"duration_min": 0.1, "duration_max": 0.2}
pytestmark = pytest.mark.gateway(api_keys=[KEY], **QUICK)


def _reset_globals() -> None:
    """Back to no provider configured, as OpenTelemetry's own tests do between tests: the API
    lets an application set its providers once, and the rest of this suite runs without."""
    from opentelemetry.metrics import _internal as metrics_internal
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()  # type: ignore[attr-defined]
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()


@pytest.fixture(scope="module")
def installed() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    """The OpenTelemetry SDK with in-memory exporters, set as an application sets it."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        yield exporter, reader
    finally:
        _reset_globals()
        assert not _telemetry.active()  # the rest of the suite records nothing


@pytest.fixture
def otel(
    installed: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    exporter, _ = installed
    exporter.clear()  # (metrics are cumulative: a test reads what it added, by difference)
    yield installed
    exporter.clear()


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """Every metric's points: attributes and value (a histogram's count and sum)."""
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            if scope.scope.name != "imggw_client":
                continue
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.sum  # type: ignore[union-attr]
                        found.setdefault(metric.name + ".count", []).append(
                            (dict(point.attributes or {}), point.count)  # type: ignore[union-attr]
                        )
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


def total(found: dict[str, list[tuple[dict[str, Any], float]]], name: str, **match: str) -> float:
    return sum(
        v for attrs, v in found.get(name, []) if all(attrs.get(k) == m for k, m in match.items())
    )


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def run_kind(kind: str, base: str, job: Any, **options: Any) -> Any:
    """``job(client)`` with a Client or (awaited) an AsyncClient."""
    if kind == "sync":
        with Client(api_key=KEY, base_url=base, **FAST, **options) as client:
            return job(client)

    async def main() -> Any:
        async with AsyncClient(api_key=KEY, base_url=base, **FAST, **options) as client:
            return await job(client)

    return anyio.run(main)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.slow
def test_a_generate_is_a_span_tree_under_the_applications_span(
    kind: str,
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
    gateway_url: str,
    tmp_path: Path,
) -> None:
    exporter, _ = otel
    app = trace.get_tracer("the.application")

    def job(client: Any) -> Any:
        with app.start_as_current_span("handle request"):
            return client.generate(PROMPT, aspect_ratio="3:2", resolution="2k")

    async def ajob(client: Any) -> Any:
        with app.start_as_current_span("handle request"):
            return await client.generate(PROMPT, aspect_ratio="3:2", resolution="2k")

    task = run_kind(kind, gateway_url, job if kind == "sync" else ajob)
    named = by_name(exporter.get_finished_spans())
    (root,) = named["handle request"]
    (generate,) = named["imggw.generate"]
    (submit,) = named["imggw.submit"]
    (wait,) = named["imggw.wait"]
    assert parent_of(generate) == root.context.span_id
    assert parent_of(submit) == parent_of(wait) == generate.context.span_id
    assert submit.end_time <= wait.start_time  # type: ignore[operator]
    assert generate.attributes is not None
    assert wait.attributes is not None
    assert dict(generate.attributes) == {
        "imggw.surface": "beta",
        "imggw.task_id": task.id,
        "imggw.status": "succeeded",
        "imggw.attempts": 1 + wait.attributes["imggw.polls"],  # type: ignore[operator]
        "imggw.polls": wait.attributes["imggw.polls"],
    }
    assert submit.attributes == {
        "imggw.surface": "beta",
        "imggw.task_id": task.id,
        "imggw.attempts": 1,
    }
    assert wait.attributes["imggw.polls"] >= 1
    assert wait.attributes["imggw.status"] == "succeeded"
    assert all(s.status.status_code is StatusCode.UNSET for s in (generate, submit, wait))


@pytest.mark.gateway(failure_rate=1.0)
def test_a_failed_task_sets_the_error_status_with_its_class_and_code(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], gateway_url: str
) -> None:
    exporter, reader = otel
    with (
        Client(api_key=KEY, base_url=gateway_url, **FAST) as client,
        pytest.raises(TaskFailedError) as failed,
    ):
        client.generate(PROMPT)
    named = by_name(exporter.get_finished_spans())
    for name in ("imggw.generate", "imggw.wait"):
        (span,) = named[name]
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == "TaskFailedError"
        assert span.attributes["imggw.error.code"] == failed.value.code
    (submit,) = named["imggw.submit"]
    assert submit.status.status_code is StatusCode.UNSET
    assert total(points(reader), "imggw.task.duration.count", status="failed") == 1


@pytest.mark.slow
def test_each_batch_line_is_a_span_with_its_calls_beneath(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], gateway_url: str, tmp_path: Path
) -> None:
    exporter, _ = otel
    source = tmp_path / "in.txt"
    source.write_text(f"{PROMPT} 1\n{PROMPT} 2\n{PROMPT} 3\n")
    report = run_batch(
        source,
        tmp_path / "out",
        gallery=False,
        client_factory=lambda: AsyncClient(api_key=KEY, base_url=gateway_url, **FAST),
    )
    assert report.exit_code == 0
    named = by_name(exporter.get_finished_spans())
    lines = {span.attributes["imggw.line"]: span for span in named["imggw.batch.line"]}  # type: ignore[index]
    assert sorted(lines) == [1, 2, 3]
    ids = {span.context.span_id for span in lines.values()}
    for name in ("imggw.submit", "imggw.wait", "imggw.download"):
        assert len(named[name]) == 3
        assert {parent_of(span) for span in named[name]} == ids, name


@pytest.mark.slow
# One submit a second: the second of two quick submits meets a 429 and is retried.
@pytest.mark.gateway(submit_limit="1/1")
def test_metrics_after_a_run_that_met_a_429(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, reader = otel
    gw, base = served_gateway
    before = points(reader)
    with Client(api_key=KEY, base_url=base, **FAST) as client:
        began = time.monotonic()
        tasks = [client.generate(f"{PROMPT} {i}") for i in range(2)]
        spent = time.monotonic() - began
    assert gw.stats()["rate_limited"] >= 1
    after = points(reader)

    def grew(name: str, **match: str) -> float:
        return total(after, name, **match) - total(before, name, **match)

    assert grew("imggw.rate_limited", kind="submit") == gw.stats()["rate_limited"]
    assert grew("imggw.requests", kind="submit", outcome="rate_limited") >= 1
    assert grew("imggw.requests", kind="submit", outcome="ok") == 2
    queries = gw.stats()["requests"]
    polls = grew("imggw.polls", surface="beta")
    assert polls == grew("imggw.requests", kind="query", outcome="ok") >= 2
    assert sum(n for route, n in queries.items() if "GET" in route) == polls
    assert grew("imggw.task.duration.count", surface="beta", status="succeeded") == 2
    took = grew("imggw.task.duration", surface="beta", status="succeeded")
    # Two tasks of 0.1-0.2 s, each measured inside its own generate call: seconds, from the
    # submit to the answer that saw it done, however long a loaded machine made the calls.
    assert 0.2 <= took <= spent
    assert grew("imggw.budget.wait.count", kind="submit") >= 3  # every attempt asked it
    assert {t.status.value for t in tasks} == {"succeeded"}


@pytest.mark.slow
@pytest.mark.gateway(failure_rate=0.5, seed=3)
def test_neither_the_key_nor_the_prompt_is_recorded_anywhere(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], gateway_url: str, tmp_path: Path
) -> None:
    exporter, reader = otel
    with Client(api_key=KEY, base_url=gateway_url, **FAST) as client:
        for i in range(4):
            try:
                task = client.generate(f"{PROMPT} {i}")
                client.download(task, tmp_path)
            except TaskFailedError:
                pass
        with pytest.raises(RequestValidationError):  # a refused request, too
            client.submit(PROMPT, aspect_ratio="7:3")
    spans = exporter.get_finished_spans()
    assert spans
    recorded = json.dumps(
        [
            [
                s.name,
                dict(s.attributes or {}),
                [(e.name, dict(e.attributes or {})) for e in s.events],
                dict(s.resource.attributes),
                s.status.description,
            ]
            for s in spans
        ]
        + [repr(points(reader))],
        default=str,
    )
    assert KEY not in recorded
    assert "canary prompt" not in recorded
    assert "93f1e0" not in recorded


@pytest.mark.parametrize("mode", ["no provider", "without the extra"])
@pytest.mark.slow
def test_without_a_provider_or_the_extra_nothing_is_recorded_and_all_works(mode: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        if {mode == "without the extra"!r}:
            sys.modules["opentelemetry"] = None  # as if imggw[otel] were not installed
        from imggw_client import Client, PollPolicy, _telemetry
        from imggw_client.mock import MockGateway
        gw = MockGateway(api_keys=["{KEY}"], duration_min=0.05, duration_max=0.1)
        with gw.serve() as base, Client(api_key="{KEY}", base_url=base,
                                        poll=PollPolicy(initial_interval=0.05)) as client:
            task = client.generate("a fox")
        recording = None
        if _telemetry.ENABLED:
            from opentelemetry import trace
            with trace.get_tracer("probe").start_as_current_span("probe") as span:
                recording = span.is_recording()
        print(_telemetry.ENABLED, task.status.value, recording)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    expected = "True succeeded False" if mode == "no provider" else "False succeeded None"
    assert done.stdout.split() == expected.split()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_generation_of_separate_calls_is_one_generate_span(
    kind: str,
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
    gateway_url: str,
    tmp_path: Path,
) -> None:
    """``client.generation()``: a submit, a wait and a download made one by one are one
    ``imggw.generate`` span, as the CLI's ``generate`` is (DESIGN 17)."""
    exporter, _ = otel

    def job(client: Any) -> Any:
        with client.generation(surface="alpha"):
            sub = client.submit(PROMPT, surface="alpha")
            task = client.wait(sub)
            return task, client.download(task, tmp_path)

    async def ajob(client: Any) -> Any:
        with client.generation(surface="alpha"):
            sub = await client.submit(PROMPT, surface="alpha")
            task = await client.wait(sub)
            return task, await client.download(task, tmp_path)

    task, (saved,) = run_kind(kind, gateway_url, job if kind == "sync" else ajob)
    assert saved.path.is_file()
    finished = exporter.get_finished_spans()
    (generate,) = by_name(finished)["imggw.generate"]
    children = [s for s in finished if parent_of(s) == generate.context.span_id]
    assert [s.name for s in children] == ["imggw.submit", "imggw.wait", "imggw.download"]
    assert generate.attributes is not None
    assert generate.attributes["imggw.surface"] == "alpha"
    assert generate.attributes["imggw.task_id"] == task.id
    assert generate.attributes["imggw.status"] == "succeeded"
    assert generate.attributes["imggw.attempts"] == sum(
        s.attributes["imggw.attempts"]  # type: ignore[index,misc]
        for s in children
    )
