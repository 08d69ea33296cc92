"""Global options: which value wins (an option typed anywhere beats the environment, one typed
after the command beats one typed before), the request budget reaching every client the CLI
makes, and help that names each environment variable once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import imggw_client
from imggw_client import RateLimit
from imggw_client.mock import MockGateway

from .helpers import CANARY, imggw


@pytest.fixture
def two_gateways(
    make_gateway: Callable[..., MockGateway], serve_gateway: Callable[[MockGateway], str]
) -> tuple[str, str]:
    return serve_gateway(make_gateway()), serve_gateway(make_gateway())


def created(url: str) -> int:
    """Tasks the gateway at ``url`` created, as its /_mock/stats says."""
    return int(httpx.get(f"{url}/_mock/stats").json()["tasks_created"])


@pytest.mark.slow
def test_a_base_url_option_beats_the_environment_before_or_after_the_command(
    two_gateways: tuple[str, str],
) -> None:
    from_env, from_option = two_gateways
    env: dict[str, str | None] = {"IMGGW_BASE_URL": from_env}
    assert imggw("--base-url", from_option, "submit", "a cat", env=env).code == 0
    assert (created(from_env), created(from_option)) == (0, 1)
    assert imggw("submit", "a dog", "--base-url", from_option, env=env).code == 0
    assert (created(from_env), created(from_option)) == (0, 2)
    assert imggw("submit", "a fox", env=env).code == 0  # the environment alone
    assert (created(from_env), created(from_option)) == (1, 2)


@pytest.fixture
def budgets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Records the rate_limit each Client and AsyncClient was made with. A subclass, not a
    function: the CLI also calls the class's own methods (make_http_client)."""
    seen: list[tuple[str, Any]] = []
    for name in ("Client", "AsyncClient"):
        real = getattr(imggw_client, name)

        class Recording(real):
            kind = name

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                seen.append((self.kind, kwargs.get("rate_limit")))
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(imggw_client, name, Recording)
    return seen


@pytest.mark.slow
def test_every_global_option_typed_after_the_command_beats_the_one_before(
    two_gateways: tuple[str, str], budgets: list[tuple[str, Any]]
) -> None:
    before, after = two_gateways
    run = imggw(
        "--base-url",
        before,
        "--surface",
        "alpha",
        "--rate",
        "1",
        "--query-rate",
        "2",
        "submit",
        "a cat",
        "--json",
        "--base-url",
        after,
        "--surface",
        "beta",
        "--rate",
        "3",
        "--query-rate",
        "4",
        env={"IMGGW_BASE_URL": before},
    )
    assert run.code == 0, run.err
    assert (created(before), created(after)) == (0, 1)
    assert run.records()[0]["surface"] == "beta"
    assert budgets == [("Client", RateLimit(submits_per_second=3, queries_per_second=4))]


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (["--rate", "2", "submit", "a cat"], RateLimit(submits_per_second=2)),
        (["submit", "a cat", "--query-rate", "10"], RateLimit(queries_per_second=10)),
        (
            ["--rate", "1", "--query-rate", "4", "submit", "a cat", "--rate", "3"],
            RateLimit(submits_per_second=3, queries_per_second=4),
        ),
        (
            ["submit", "a cat", "--rate", "0.5", "--query-rate", "2.5"],
            RateLimit(submits_per_second=0.5, queries_per_second=2.5),
        ),
        (["submit", "a cat"], None),
    ],
)
def test_rate_options_reach_the_client(
    budgets: list[tuple[str, Any]], args: list[str], limit: RateLimit | None
) -> None:
    run = imggw(*args, "--mock")
    assert run.code == 0, run.err
    assert budgets == [("Client", limit)]


def test_rate_options_reach_the_batch_client(
    budgets: list[tuple[str, Any]], tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog\n")
    run = imggw(
        "--rate",
        "50",
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--mock",
        "-q",
        "--query-rate",
        "100",
    )
    assert run.code == 0, run.err
    assert budgets == [("AsyncClient", RateLimit(submits_per_second=50, queries_per_second=100))]


@pytest.fixture(scope="module")
def untouched() -> Iterator[tuple[MockGateway, str]]:
    """One gateway for the module's refused options: none of them may send it anything (one
    served for each of the 44 cases cost 9 s)."""
    gw = MockGateway(api_keys=[CANARY])
    with gw.serve() as url:
        yield gw, url


@pytest.mark.parametrize(
    "value", ["0", "-1", "-0.5", "abc", "", "inf", "nan", "1e400", "2/s", "1e-300", "0.0001"]
)
@pytest.mark.parametrize("flag", ["--rate", "--query-rate"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_bad_rate_exits_2_with_one_line_and_sends_nothing(
    untouched: tuple[MockGateway, str], value: str, flag: str, where: str
) -> None:
    gw, url = untouched
    option = [flag, value]
    command = ["submit", "a cat", "--base-url", url]
    run = imggw(*(option + command if where == "before" else command + option))
    assert run.code == 2
    assert run.out == ""
    assert run.err == (
        f"error: {flag} must be a number of requests per second, at least 1/3600 (one an hour) "
        f"(got {value!r})\n"
    )
    assert gw.stats()["requests"] == {}


@pytest.mark.parametrize(
    "command",
    [[], ["generate"], ["submit"], ["status"], ["poll"], ["wait"], ["download"], ["batch"]],
)
def test_help_names_each_environment_variable_once(command: list[str]) -> None:
    text = imggw(*command, "--help").out
    assert text.count("IMGGW_BASE_URL") == 1
    assert "--rate N" in text
    assert "--query-rate N" in text
