"""``imggw mock serve``: the bundled reference gateway on a real socket, every setting of
``MockGateway`` an option (``python -m imggw_client.mock`` takes the same ones; a test holds
the two lists, and their defaults, together)."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from typing import Annotated, Optional

import typer

from ._command import option

app = typer.Typer(help="The bundled reference gateway.", no_args_is_help=True)

EPILOG = (
    "Exit codes: 0 stopped by Ctrl-C; 1 could not serve (the port is in use); 2 a bad option "
    "or setting; 4 uvicorn missing (pip install 'imggw[mock]')."
)
# The gateway's own (imggw_client.mock.FAULT_KINDS and QUIRKS), which --help must not import.
FAULT_KINDS = ("lost", "reset", "latency", "429", "500", "502", "503", "504", "malformed")
QUIRKS = (
    "alpha_http200",
    "extra_states",
    "no_progress",
    "beta_no_code",
    "no_retry_after",
    "no_charge",
    "charge_at_end",
)
ALL_FAULTS = ",".join(FAULT_KINDS)
SECONDS = "SECONDS"

# The options (Typer reads these annotations at run time). Each is named as the MockGateway
# setting it sets, so that the command hands them on by name.
Host = Annotated[str, option("--host", metavar="HOST", help="Interface to bind.")]
Port = Annotated[int, option("--port", metavar="PORT", help="Port (0 picks a free one).")]
ApiKeys = Annotated[
    Optional[list[str]],  # noqa: UP045 - Typer wants it on 3.10
    option(
        "--api-key",
        metavar="KEY",
        show_default="test-key",
        help="An accepted API key (repeatable).",
    ),
]
Seed = Annotated[
    int,
    option(
        "--seed", metavar="N", help="Seed of every random choice (durations, failures, faults)."
    ),
]
DurationMin = Annotated[
    float, option("--duration-min", metavar=SECONDS, help="Shortest task duration.")
]
DurationMax = Annotated[
    float, option("--duration-max", metavar=SECONDS, help="Longest task duration.")
]
FailureRate = Annotated[
    float, option("--failure-rate", metavar="0..1", help="Share of tasks that end failed.")
]
FaultRate = Annotated[
    float, option("--fault-rate", metavar="0..1", help="Share of requests that meet a fault.")
]
Faults = Annotated[
    str,
    option(
        "--faults",
        metavar="KIND,...",
        help=f"Fault kinds to draw from, of {', '.join(FAULT_KINDS)}.",
    ),
]
Quirks = Annotated[
    str,
    option(
        "--quirks",
        metavar="QUIRK,...",
        show_default="none",
        help=f"Provider quirks to imitate, of {', '.join(QUIRKS)}.",
    ),
]
Retention = Annotated[
    float,
    option("--retention", metavar=SECONDS, help="How long a result file is kept after completion."),
]
LinkTtl = Annotated[
    Optional[float],  # noqa: UP045
    option(
        "--link-ttl",
        metavar=SECONDS,
        show_default="the retention",
        help="How long a result link handed out by a query stays valid (never past the retention).",
    ),
]
ManualClock = Annotated[
    bool, option("--manual-clock", help="Time moves only by POST /_mock/advance?seconds=N.")
]
Latency = Annotated[
    float, option("--latency", metavar=SECONDS, help="Longest delay of the latency fault.")
]
RetryAfter = Annotated[
    int, option("--retry-after", metavar=SECONDS, help="Retry-After of injected 429s.")
]
IdempotencyTtl = Annotated[
    float,
    option("--idempotency-ttl", metavar=SECONDS, help="How long an idempotency key is remembered."),
]
ImageSize = Annotated[
    int, option("--image-size", metavar="PIXELS", help="Long side of result PNGs.")
]
FirstTaskId = Annotated[
    int, option("--first-task-id", metavar="N", help="Id of the first task; ids count up from it.")
]
ResultSize = Annotated[
    int,
    option(
        "--result-size", metavar="BYTES", help="Pad result PNGs to at least this size (benchmarks)."
    ),
]
SubmitLimit = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--submit-limit",
        metavar="N/S",
        show_default="no limit",
        help="At most N submits per API key in any S seconds, both surfaces.",
    ),
]
QueryLimit = Annotated[
    Optional[str],  # noqa: UP045
    option(
        "--query-limit",
        metavar="N/S",
        show_default="no limit",
        help="At most N queries per API key in any S seconds, both surfaces.",
    ),
]
Credits = Annotated[
    Optional[float],  # noqa: UP045
    option(
        "--credits",
        metavar="N",
        show_default="no limit",
        help="Every API key's balance of credits; a submit it cannot cover answers 402 "
        "insufficient_credits and creates nothing (tasks cost 4, 8, 16 credits at 1k, 2k, 4k).",
    ),
]
RequestTimeout = Annotated[
    float,
    option(
        "--request-timeout",
        metavar=SECONDS,
        help="How long a client has to send a whole request before it is cut off.",
    ),
]


def _listed(text: str) -> tuple[str, ...]:
    """``"lost, 503"`` as ``("lost", "503")``, as the gateway takes a list."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


@app.command("serve", epilog=EPILOG)
def serve(
    ctx: typer.Context,
    host: Host = "127.0.0.1",
    port: Port = 8080,
    api_keys: ApiKeys = None,
    seed: Seed = 0,
    duration_min: DurationMin = 1.0,
    duration_max: DurationMax = 5.0,
    failure_rate: FailureRate = 0.0,
    fault_rate: FaultRate = 0.0,
    faults: Faults = ALL_FAULTS,
    quirks: Quirks = "",
    retention: Retention = 86_400.0,
    link_ttl: LinkTtl = None,
    manual_clock: ManualClock = False,
    latency: Latency = 0.5,
    retry_after: RetryAfter = 1,
    idempotency_ttl: IdempotencyTtl = 86_400.0,
    image_size: ImageSize = 64,
    first_task_id: FirstTaskId = 1,
    result_size: ResultSize = 0,
    submit_limit: SubmitLimit = None,
    query_limit: QueryLimit = None,
    credits: Credits = None,
    request_timeout: RequestTimeout = 10.0,
) -> None:
    """Serve the reference gateway (both surfaces) over HTTP until Ctrl-C; print its URL.

    Every setting of the gateway is an option; python -m imggw_client.mock takes the same.

    Example: imggw mock serve --port 8080 --fault-rate 0.2 --submit-limit 20/10
    """
    from imggw_client.mock import serve_forever

    settings = {name: value for name, value in ctx.params.items() if name not in ("host", "port")}
    settings.update(faults=_listed(faults), quirks=_listed(quirks))
    if api_keys is None:  # the gateway's own default key
        del settings["api_keys"]
    raise typer.Exit(serve_forever(host=host, port=port, **settings))
