"""Spend and failure guards: a batch never spends more than its owner allows, stops submitting
when its lines keep failing or the account runs dry, and never abandons what it paid for.
Over loopback against the reference gateway, through the command line where it is the user's
way in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, PollPolicy, RetryPolicy
from imggw_client._core import spec
from imggw_client.batch import BatchReport, plan_batch, run_batch, run_shard, status
from imggw_client.batch._admission import Charge, Spending, Verdict, reported, settles
from imggw_client.batch._plan import Caps
from imggw_client.batch.scale._folder import charges
from imggw_client.batch.scale._storage import open_storage
from imggw_client.mock import MockGateway, MockRequest, MockResponse, fingerprint

from ..cli.helpers import CANARY, imggw, imggw_batch
from ..loopback import serve_asgi

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


pytestmark = pytest.mark.gateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.06)


def prompts(path: Path, count: int, *, resolution: str | None = None) -> Path:
    if resolution is None:
        path.write_text("".join(f"prompt {i}\n" for i in range(count)))
    else:
        lines = [{"prompt": f"prompt {i}", "resolution": resolution} for i in range(count)]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def batch(url: str, source: Path, out: Path, **options: Any) -> BatchReport:
    factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
    return run_batch(source, out, client_factory=factory, **options)


def manifest(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def submits(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def billed(gw: MockGateway) -> float:
    return float(gw.stats()["billing"][fingerprint(CANARY)]["credits"])


# ---------------------------------------------------------------------------- spend caps


def test_a_cap_counts_what_lines_changed_or_removed_since_were_charged(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    # 4 credits a line at 1k; a cap of 12 holds for the folder, across reruns that change or
    # drop lines (--allow-changes): a changed line's row is made anew, its old task still paid.
    source = tmp_path / "in.txt"
    out = tmp_path / "out"
    source.write_text("a cat\na dog\na bird\n")
    assert batch(gateway_url, source, out, max_credits=12.0).exit_code == 0
    assert billed(gateway) == 12
    for edit in range(3):
        source.write_text(f"a cat\na dog, take {edit}\na bird\n")
        again = batch(gateway_url, source, out, max_credits=12.0, allow_changes=True)
        assert again.exit_code == 6  # stopped by the cap: nothing more may be paid for
        assert billed(gateway) == 12
    source.write_text("a fox\n")  # every line removed, one new
    assert batch(gateway_url, source, out, max_credits=12.0, allow_changes=True).exit_code == 6
    assert billed(gateway) == 12
    dry = plan_batch(source, out, max_credits=12.0, allow_changes=True)
    assert (dry.spent["credits"], dry.fit) == (12.0, 0)


def runs(url: str, tmp_path: Path, out: Path, *inputs: str) -> None:
    """A run of each input in turn into ``out``, each ending 0: the later ones with changes."""
    source = tmp_path / "in.txt"
    for n, text in enumerate(inputs):
        source.write_text(text)
        assert batch(url, source, out, allow_changes=n > 0).exit_code == 0


def test_a_dask_runs_guard_starts_from_all_the_folder_was_charged(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    # It started from the last plan's lines alone: a line changed twice and a line removed were
    # billed 12 credits the guard did not count, and a capped run on Dask would bill past it.
    out = tmp_path / "out"
    edits = [f"a cat\na dog, take {edit}\na bird\n" for edit in range(2)]
    runs(gateway_url, tmp_path, out, "a cat\na dog\na bird\n", *edits, "a cat\na dog, take 1\n")
    assert billed(gateway) == 20
    spent, prices = charges(open_storage(str(out)))
    assert spent.credits == 20
    assert prices == {"1k": Charge(4.0, 0.01)}


def test_a_line_changed_and_changed_back_is_counted_once(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    # Changed back, a line gets its first key again and its task is replayed, not billed: its
    # charge was counted both as replaced and in its row, and the cap stopped early.
    source, out = tmp_path / "in.txt", tmp_path / "out"
    lines = "a cat\na dog\na bird\n"
    runs(gateway_url, tmp_path, out, lines, "a cat\na dog, take 2\na bird\n", lines)
    assert billed(gateway) == 16
    source.write_text("a cat\na dog\na bird\na fox\n")
    assert batch(gateway_url, source, out, max_credits=20.0, allow_changes=True).exit_code == 0
    assert billed(gateway) == 20


@pytest.mark.slow
def test_a_cap_of_ten_tasks_makes_exactly_ten_and_a_rerun_resumes_under_a_raised_one(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 1000)  # 4 credits a line at 1k
    out = tmp_path / "out"
    first = imggw_batch(
        source,
        out,
        gateway_url,
        "--max-credits",
        "40",
        "-c",
        "8",
    )
    assert first.code == 6, first.err
    assert gateway.stats()["tasks_created"] == 10
    (stop,) = [line for line in first.err.splitlines() if "stopped by --max-credits" in line]
    assert "40 of 40 credits spent" in stop
    assert "raise --max-credits and run the same command again" in stop
    rows = manifest(out)
    assert sum(r["status"] == "succeeded" for r in rows) == 10  # what was paid for is saved
    assert len(list(out.glob("*.png"))) == 10
    again = imggw_batch(source, out, gateway_url, "--max-credits", "40")
    assert again.code == 6
    assert gateway.stats()["tasks_created"] == 10  # the same cap: nothing more
    more = imggw_batch(source, out, gateway_url, "--max-credits", "80")
    assert more.code == 6
    assert gateway.stats()["tasks_created"] == 20
    assert gateway.stats()["billing"][fingerprint(CANARY)]["credits"] == 80  # none billed twice
    assert len(list(out.glob("*.png"))) == 20
    status_run = imggw("batch", "status", str(out), "--json")
    record = status_run.records()[0]
    assert record["spent"] == {"credits": 80.0, "cost": 0.2}
    assert record["stopped_by"] == "max_credits"
    assert status_run.code == 6


def test_the_first_line_goes_alone_until_its_charge_is_known(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    events: list[str] = []
    gw = make_gateway()
    handle = gw.handle

    def log(request: MockRequest) -> MockResponse:
        answer = handle(request)
        if request.method == "POST":
            events.append("submit")
        elif request.method == "GET" and "tasks/" in request.path and answer.status == 200:
            events.append("charged" if b'"credits_cost"' in answer.body else "query")
        return answer

    gw.handle = log  # type: ignore[method-assign]
    with gw.serve() as url:
        report = batch(
            url, prompts(tmp_path / "in.txt", 6), tmp_path / "out", concurrency=6, max_credits=100
        )
    assert report.exit_code == 0
    assert events.count("submit") == 6
    assert events.index("charged") < events.index("submit", 1)  # the second submit waited
    assert events[0] == "submit"


def test_lines_are_estimated_at_the_price_seen_for_their_resolution(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    lines = [{"prompt": "first", "resolution": "4k", "aspect_ratio": "16:9"}]
    lines += [{"prompt": f"small {i}"} for i in range(6)]
    lines += [{"prompt": "big", "resolution": "4k", "aspect_ratio": "16:9"}]
    with gw.serve() as url:
        # 16 (4k) + 4 x 4 (1k) = 32 <= 33; a fifth 1k line (36) and the 4k line (48) do not fit.
        report = batch(
            url,
            jsonl(tmp_path / "in.jsonl", lines),
            tmp_path / "out",
            concurrency=1,
            max_credits=33,
        )
    assert report.stopped_by == "max_credits"
    assert report.exit_code == 6
    assert gw.stats()["tasks_created"] == 5
    assert report.credits == 32
    created = [r for r in manifest(tmp_path / "out") if r["task_id"] is not None]
    assert [r["resolution"] for r in created] == ["4k", "1k", "1k", "1k", "1k"]


@pytest.mark.slow
def test_a_gateway_that_states_no_charge_cannot_be_capped_and_stops_after_one_line(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway(quirks=["no_charge"])
    with gw.serve() as url:
        run = imggw(
            "batch",
            str(prompts(tmp_path / "in.txt", 5)),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            url,
            "--max-credits",
            "100",
        )
    assert run.code == 6
    assert gw.stats()["tasks_created"] == 1
    assert "the gateway reports no charge" in run.err
    assert len(list((tmp_path / "out").glob("*.png"))) == 1  # the one it made is saved


def test_a_cost_cap_on_a_surface_that_states_no_cost_stops_after_one_line(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    with gw.serve() as url:
        report = batch(
            url, prompts(tmp_path / "in.txt", 5), tmp_path / "out", surface="alpha", max_cost=1.0
        )
    assert report.stopped_by == "max_cost"
    assert "no cost" in report.stop_reason
    assert gw.stats()["tasks_created"] == 1


# Issue 27 item 1: many providers state a charge of 0 until a job ends. Taken as a price, it
# let 20 tasks (80 credits) through a cap of 12. Tasks long enough to be seen running at
# the command's own pace of polls.
@pytest.mark.slow
@pytest.mark.gateway(duration_min=2.5, duration_max=2.5, quirks=["charge_at_end"])
def test_a_gateway_stating_0_while_tasks_run_never_gets_a_credit_past_the_cap(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    gw, url = served_gateway
    run = imggw(
        "batch",
        str(prompts(tmp_path / "in.txt", 20)),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        url,
        "--max-credits",
        "12",
        "-c",
        "8",
    )
    assert run.code == 6, run.err
    assert gw.stats()["tasks_created"] == 3
    assert billed(gw) == 12
    assert len(list((tmp_path / "out").glob("*.png"))) == 3  # what was paid for is saved
    assert "12 of 12 credits spent" in run.err


@pytest.mark.parametrize("stated", ["-4", "-1e999", "1e999", '"NaN"', '"-16"'])
@pytest.mark.slow
def test_no_charge_a_gateway_states_while_tasks_run_gets_a_credit_past_the_cap(
    make_gateway: Callable[..., MockGateway], stated: str, tmp_path: Path
) -> None:
    # Negative, infinite (a number too large for a double) or not-a-number charges while tasks
    # run (as JSON tokens): clamped to 0 or to none stated, none of them a price, none of them
    # handing back room under the cap.
    gw = make_gateway(quirks=["charge_at_end"])
    handle, credits = gw.handle, spec.of("beta").record.credits

    def hostile(request: MockRequest) -> MockResponse:
        answer = handle(request)
        is_json = request.method == "GET" and answer.body.startswith(b"{")  # not an image
        record = json.loads(answer.body) if is_json else None
        data = record.get("data") if isinstance(record, dict) else None
        if isinstance(data, dict) and data.get(credits) == 0:  # running, under the quirk
            data[credits] = "__stated__"
            body = json.dumps(record).replace('"__stated__"', stated).encode()
            return MockResponse(answer.status, body, answer.headers)
        return answer

    gw.handle = hostile  # type: ignore[method-assign]
    with gw.serve() as url:
        report = batch(
            url, prompts(tmp_path / "in.txt", 20), tmp_path / "out", concurrency=8, max_credits=12
        )
    assert report.stopped_by == "max_credits"
    assert gw.stats()["tasks_created"] == 3
    assert billed(gw) == 12
    assert report.credits == 12


@pytest.mark.slow
def test_the_first_line_of_a_resolution_goes_only_when_the_cap_covers_its_worst_case(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    # Issue 27 item 2: the first 4k line was estimated at the 1k price (4) and cost 16: 21 tasks,
    # 96 credits under a cap of 90. A 4k task may cost 16x a 1k one: 80 + 64 > 90.
    gw = make_gateway(credits=200)
    lines = [{"prompt": f"small {i}"} for i in range(20)]
    lines += [{"prompt": f"big {i}", "resolution": "4k", "aspect_ratio": "16:9"} for i in range(10)]
    with gw.serve() as url:
        run = imggw(
            "batch",
            str(jsonl(tmp_path / "in.jsonl", lines)),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            url,
            "--max-credits",
            "90",
        )
    assert run.code == 6, run.err
    assert gw.stats()["tasks_created"] == 20
    assert billed(gw) == 80
    made = [r["resolution"] for r in manifest(tmp_path / "out") if r["task_id"] is not None]
    assert made == ["1k"] * 20


@pytest.mark.slow
def test_a_4k_line_whose_worst_case_fits_goes_alone_and_then_at_its_own_price(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    lines = [{"prompt": "small"}]
    lines += [{"prompt": f"big {i}", "resolution": "4k", "aspect_ratio": "16:9"} for i in range(3)]
    with gw.serve() as url:
        # 4 + 64 (the worst case of the first 4k line) <= 68; then at 16 each: 4 + 16 x 3 = 52.
        report = batch(
            url,
            jsonl(tmp_path / "in.jsonl", lines),
            tmp_path / "out",
            concurrency=4,
            max_credits=68,
        )
    assert report.exit_code == 0
    assert report.credits == 52
    with gw.serve() as url:  # a cap that does not cover the worst case: the 4k lines wait
        report = batch(
            url,
            jsonl(tmp_path / "in2.jsonl", lines),
            tmp_path / "out2",
            concurrency=4,
            max_credits=67,
        )
    assert report.stopped_by == "max_credits"
    assert report.credits == 4


# ---------------------------------------------------------------------------- failures, 402


@pytest.mark.slow
def test_max_failures_stops_submits_and_lets_lines_in_flight_finish(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    handle, answered = gw.handle, [0]

    def slow_after_three(request: MockRequest) -> MockResponse:
        # The fourth submit on answers a second late: the failing tasks end long before, so
        # the guard has seen them before more lines are let go.
        answer = handle(request)
        if request.method == "POST":
            answered[0] += 1
            if answered[0] > 3:
                return MockResponse(answer.status, answer.body, answer.headers, delay=1.0)
        return answer

    gw.handle = slow_after_three  # type: ignore[method-assign]
    lines = [{"prompt": f"bad {i} #fail:content_policy_violation"} for i in range(3)]
    lines += [{"prompt": f"good {i}"} for i in range(30)]
    with gw.serve() as url:
        report = batch(
            url,
            jsonl(tmp_path / "in.jsonl", lines),
            tmp_path / "out",
            concurrency=4,
            max_failures=2,
        )
    assert report.stopped_by == "max_failures"
    assert report.exit_code == 6
    assert "content_policy_violation" in report.stop_reason
    made = gw.stats()["tasks_created"]
    assert 3 <= made <= 3 + 4  # the failing three, and at most a window of submits after

    rows = manifest(tmp_path / "out")
    sent = [r for r in rows if r["task_id"] is not None]
    assert len(sent) == made
    # Every line that was sent finished: failed, or succeeded with its file saved.
    assert all(r["status"] in ("failed", "succeeded") for r in sent)
    for row in sent:
        if row["status"] == "succeeded":
            assert (tmp_path / "out" / row["files"][0]["path"]).is_file()
    assert all(r["status"] == "pending" for r in rows if r["task_id"] is None)


@pytest.mark.slow
def test_a_balance_that_runs_out_stops_submits_saves_what_was_made_and_a_top_up_resumes(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway(credits=20)  # five 1k tasks
    source = prompts(tmp_path / "in.txt", 9)
    out = tmp_path / "out"
    with gw.serve() as url:
        run = imggw_batch(source, out, url, "-c", "3")
        assert run.code == 6, run.err
        assert gw.stats()["tasks_created"] == 5
        assert "stopped by the gateway (insufficient_credits)" in run.err
        assert "top up the account" in run.err
        assert len(list(out.glob("*.png"))) == 5
        assert gw.stats()["balances"] == {next(iter(gw.stats()["balances"])): 0.0}
        gw.configure(credits=100)
        again = imggw_batch(source, out, url)
        assert again.code == 0, again.err
    assert gw.stats()["tasks_created"] == 9
    assert len(list(out.glob("*.png"))) == 9


class SlowRefusal:
    """An ASGI app over the reference gateway that holds the ``held``-th submit until the next
    one has arrived: the second submit in flight when the first 402 comes back."""

    def __init__(self, gw: MockGateway, held: int) -> None:
        self.app, self.held = gw.asgi(), held
        self.posts = 0
        self.next_arrived = anyio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.posts += 1
            if self.posts == self.held:
                with anyio.move_on_after(30):  # a guard against a hang, not a window
                    await self.next_arrived.wait()
            elif self.posts == self.held + 1:
                self.next_arrived.set()
        await self.app(scope, receive, send)


@pytest.mark.slow
def test_after_a_402_no_other_submit_is_sent(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    # Issue 27 item 19: 12 lines, -c 2, a balance for 6: all 12 submits went out, 6 refused.
    gw = make_gateway(credits=24)
    app = SlowRefusal(gw, held=7)
    out = tmp_path / "out"
    with serve_asgi(app) as url:
        run = imggw(
            "batch",
            str(prompts(tmp_path / "in.txt", 12)),
            "-o",
            str(out),
            "--base-url",
            url,
            "-c",
            "2",
        )
    assert run.code == 6, run.err
    # Six made, the seventh refused, and the eighth already on its way when that 402 came back.
    assert app.posts == 8
    assert submits(gw) == 8
    assert gw.stats()["tasks_created"] == 6
    assert len(list(out.glob("*.png"))) == 6
    rows = manifest(out)
    assert sum(r["status"] == "succeeded" for r in rows) == 6
    assert sum(r["status"] == "pending" for r in rows) == 6


# ---------------------------------------------------------------------------- dry run


@pytest.mark.slow
def test_a_dry_run_sends_nothing_and_says_what_a_run_would_do(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 12)
    out = tmp_path / "out"
    fresh = imggw_batch(source, out, gateway_url, "--dry-run", "--json")
    assert fresh.code == 0, fresh.err
    assert gateway.stats()["requests"] == {}
    assert not out.exists()  # nothing kept either
    (plan,) = fresh.records()
    pinned = {"total", "to_submit", "to_wait", "to_collect", "done", "changed", "bad", "estimate"}
    assert pinned <= set(plan)
    assert plan["total"] == plan["to_submit"] == 12
    assert plan["estimate"] is None  # no charge seen yet
    assert batch(gateway_url, source, out, max_credits=20).stopped_by == "max_credits"  # 5 made
    sent = gateway.stats()["requests"]
    capped = imggw(
        "batch", str(source), "-o", str(out), "--dry-run", "--json", "--max-credits", "40"
    )
    assert capped.code == 0, capped.err
    assert gateway.stats()["requests"] == sent  # still nothing sent
    (plan,) = capped.records()
    assert (plan["to_submit"], plan["done"]) == (7, 5)
    assert plan["estimate"] == {"credits": 28.0, "cost": 0.07}
    assert plan["spent"] == {"credits": 20.0, "cost": 0.05}
    assert plan["fit"] == 5  # 20 + 5 x 4 = 40
    human = imggw("batch", str(source), "-o", str(out), "--dry-run", "--max-credits", "40")
    assert "under the cap: 5 of the 7 lines to submit fit" in human.out
    assert "nothing was sent" in human.out


def test_a_dry_run_refuses_what_a_run_refuses(tmp_path: Path) -> None:
    bad = jsonl(tmp_path / "in.jsonl", [{"prompt": "ok"}, {"nope": 1}])
    run = imggw("batch", str(bad), "-o", str(tmp_path / "out"), "--dry-run")
    assert run.code == 2
    assert "line 2" in run.err
    assert not (tmp_path / "out").exists()
    plan = plan_batch(bad, tmp_path / "out", skip_bad_lines=True)
    assert (plan.total, plan.bad, plan.to_submit) == (2, 1, 1)


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-credits", "0"),
        ("--max-credits", "-4"),
        ("--max-cost", "lots"),
        ("--max-failures", "0"),
        ("--max-failures", "1.5"),
        ("--max-cost", "nan"),
    ],
)
def test_a_bad_limit_is_one_line_and_exit_2(flag: str, value: str, tmp_path: Path) -> None:
    run = imggw(
        "batch",
        str(prompts(tmp_path / "in.txt", 2)),
        "-o",
        str(tmp_path / "out"),
        flag,
        value,
        "--mock",
    )
    assert run.code == 2
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"error: {flag} must be")
    assert not (tmp_path / "out").exists()


def test_the_sdk_refuses_a_bad_limit_before_anything_is_made(tmp_path: Path) -> None:
    for options in ({"max_credits": 0}, {"max_cost": -1.0}, {"max_failures": 0}):
        with pytest.raises(ValueError, match=next(iter(options))):
            run_batch(
                prompts(tmp_path / "in.txt", 1),
                tmp_path / "out",
                client_factory=lambda: AsyncClient(api_key="k", base_url="http://x"),
                **options,
            )


# ---------------------------------------------------------------------------- shards, Dask


@pytest.mark.slow
def test_shard_processes_each_hold_their_share_of_the_cap(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 40)
    factory = lambda: AsyncClient(api_key=CANARY, base_url=gateway_url, **FAST)  # noqa: E731
    reports = [
        run_shard(
            source, tmp_path / "out", index=i, count=2, client_factory=factory, max_credits=40
        )
        for i in (1, 2)
    ]
    assert [r.stopped_by for r in reports] == ["max_credits", "max_credits"]
    assert gateway.stats()["tasks_created"] == 10  # 20 credits each: 5 + 5
    assert status(tmp_path / "out").spent == Charge(40.0, 0.1)


@pytest.mark.dask  # starts a LocalCluster of its own
@pytest.mark.slow
def test_a_dask_run_holds_one_cap_for_every_shard(
    gateway: MockGateway, gateway_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imggw_client.batch import ClientSpec, run_sharded

    monkeypatch.setenv("IMGGW_API_KEY", CANARY)  # the workers' own environment has the key
    source = prompts(tmp_path / "in.txt", 40)
    report = run_sharded(
        source,
        tmp_path / "out",
        workers=2,
        shard_size=10,
        concurrency=2,
        max_credits=40,
        client=ClientSpec(base_url=gateway_url, poll=FAST["poll"], retry=FAST["retry"]),
        cluster_options={"silence_logs": 40},
    )
    assert report.stopped_by == "max_credits"
    assert report.exit_code == 6
    assert gateway.stats()["tasks_created"] == 10  # one count across the four shards
    assert status(tmp_path / "out").spent == Charge(40.0, 0.1)
    assert len(list((tmp_path / "out").glob("*.png"))) == 10


# ---------------------------------------------------------------------------- the pure guard


def test_the_guard_never_passes_its_cap_with_lines_in_flight() -> None:
    spending = Spending(Caps(max_credits=10))
    assert spending.admit("a", "1k") is Verdict.GO
    assert spending.admit("b", "1k") is Verdict.WAIT  # alone until its charge is known
    spending.charged("a", "1k", Charge(), Charge(4.0, 0.01), final=False)
    assert spending.admit("b", "1k") is Verdict.GO  # 4 + 4 <= 10
    assert spending.admit("c", "1k") is Verdict.WAIT  # 4 + 4 + 4 > 10, b may be given back
    spending.release("b")  # refused: nothing charged
    assert spending.admit("c", "1k") is Verdict.GO
    spending.charged("c", "1k", Charge(), Charge(4.0, 0.01), final=True)
    assert spending.admit("d", "1k") is Verdict.STOP  # 8 + 4 > 10, nothing in flight
    assert spending.stopped_by == "max_credits"
    assert spending.charged_total == Charge(8.0, 0.02)


def test_a_charge_of_0_while_running_is_no_price_and_keeps_the_line_in_flight() -> None:
    spending = Spending(Caps(max_credits=12))
    assert spending.admit("a", "1k") is Verdict.GO
    spending.charged("a", "1k", Charge(), Charge(0.0, 0.0), final=False)
    assert spending.prices == {}
    assert spending.admit("b", "1k") is Verdict.WAIT
    spending.charged("a", "1k", Charge(0.0, 0.0), Charge(4.0, 0.01), final=True)
    assert [spending.admit(x, "1k") for x in "bcd"] == [Verdict.GO, Verdict.GO, Verdict.WAIT]
    # A charge that drops while its task runs hands no room back.
    spending.charged("b", "1k", Charge(), Charge(4.0), final=False)
    spending.charged("b", "1k", Charge(4.0), Charge(-50.0), final=False)
    assert spending.charged_total.credits == 8.0
    assert spending.admit("d", "1k") is Verdict.WAIT  # 8 + 4 (c) + 4 > 12


def test_a_failed_task_charged_0_is_no_price() -> None:
    spending = Spending(Caps(max_credits=100))
    spending.admit("a", "1k")
    spending.charged("a", "1k", Charge(), Charge(0.0), final=True, failed=True)
    assert spending.prices == {}
    assert spending.admit("b", "1k") is Verdict.GO  # the estimate was given back: b goes alone
    assert spending.admit("c", "1k") is Verdict.WAIT


def test_an_unpriced_resolution_is_estimated_at_the_most_it_could_cost() -> None:
    spending = Spending(Caps(max_credits=1000), prices={"1k": Charge(4.0, 0.01)})
    assert spending.estimate("2k") == Charge(16.0, 0.04)
    assert spending.estimate("4k") == Charge(64.0, 0.16)
    spending = Spending(Caps(max_credits=1000), prices={"1k": Charge(4.0), "2k": Charge(10.0)})
    assert spending.estimate("4k") == Charge(64.0)  # the higher of 16 x 4 and 4 x 10
    spending = Spending(Caps(max_credits=1000), prices={"4k": Charge(16.0)})
    assert spending.estimate("1k") == Charge(16.0)  # a smaller one costs at most as much
    spending = Spending(Caps(max_credits=70), prices={"1k": Charge(4.0)})
    assert spending.admit("a", "4k") is Verdict.GO  # 64 <= 70
    assert spending.admit("b", "4k") is Verdict.WAIT  # alone until its price is known
    assert spending.admit("c", "1k") is Verdict.GO  # 64 + 4 <= 70
    assert spending.admit("d", "1k") is Verdict.WAIT


def test_charges_are_clamped_and_only_final_or_positive_ones_settle() -> None:
    assert Charge(-4.0, float("nan")).clamped() == Charge(0.0, None)
    assert Charge(float("inf"), 0.01).clamped() == Charge(None, 0.01)
    assert reported(Charge(4.0), Charge(0.0), final=False) == Charge(4.0)
    assert reported(Charge(4.0), Charge(0.0), final=True) == Charge(0.0)
    assert not settles(Charge(0.0, 0.0), final=False)
    assert not settles(Charge(4.0, 0.0), final=False)
    assert settles(Charge(4.0, 0.01), final=False)
    assert settles(Charge(0.0), final=True)
    assert not settles(Charge(), final=True)
    spending = Spending(Caps(max_credits=10), spent=Charge(-100.0), prices={"1k": Charge(-4.0)})
    assert spending.charged_total.credits == 0.0
    assert spending.prices == {"1k": Charge(0.0)}


def test_a_charge_reported_twice_counts_once() -> None:
    spending = Spending(Caps(max_credits=8))
    spending.admit("a", "1k")
    spending.charged("a", "1k", Charge(), Charge(4.0), final=False)
    spending.charged("a", "1k", Charge(4.0), Charge(4.0), final=True)  # again, at the end
    assert spending.charged_total.credits == 4.0
    assert spending.admit("b", "1k") is Verdict.GO


# ---------------------------------------------------------------------------- Ctrl-C


# No task ever finishes (the gateway's clock moves only when told): the guard stops the
# submits from the charges stated while tasks run, never from a task that finished.
@pytest.mark.slow
@pytest.mark.gateway(manual_clock=True)
def test_ctrl_c_while_a_stopped_run_drains_is_130_and_bills_nothing_more(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    env.update(IMGGW_API_KEY=CANARY, PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "imggw_cli",
            "batch",
            str(prompts(tmp_path / "in.txt", 20)),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            url,
            "--max-credits",
            "12",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stderr is not None
    seen: list[str] = []
    # A run that never says it stopped is killed: the test fails instead of waiting on it.
    watchdog = threading.Timer(60, child.kill)
    watchdog.start()
    try:
        for line in child.stderr:  # the display says when the guard stopped the submits
            seen.append(line)
            if "stopped by max_credits" in line:
                break
    finally:
        watchdog.cancel()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert any("stopped by max_credits" in line for line in seen), seen
    assert child.returncode == 130
    assert "run the same command to resume" in err
    assert gw.stats()["tasks_created"] == 3


# ---------------------------------------------------------------------------- the guard itself


@pytest.mark.anyio
async def test_a_guard_held_here_and_one_asked_elsewhere_agree_step_by_step() -> None:
    from imggw_client.batch._admission import LocalGuard, RemoteGuard, handle

    here = LocalGuard(Spending(Caps(max_credits=10, max_failures=2)))
    held = Spending(Caps(max_credits=10, max_failures=2))
    asked: list[str] = []

    async def ask(**message: Any) -> dict[str, object]:
        asked.append(str(message["action"]))
        # As the scheduler's handler gets it: what crosses the wire, not the objects.
        return handle(held, **json.loads(json.dumps(message)))

    there = RemoteGuard(ask)
    for guard in (here, there):
        assert await guard.admit("a", "1k")
        await guard.flying("old", "1k")
        await guard.charged("a", "1k", Charge(), Charge(4.0, 0.01), final=True)
        await guard.release("old")
        assert await guard.admit("b", "1k")  # 4 spent + 4 for b <= 10
        await guard.failed("content_policy")
        await guard.failed("content_policy")  # the second failure arms max_failures
        assert not await guard.admit("c", "1k")
    assert (here.spending.stopped_by, held.stopped_by) == ("max_failures", "max_failures")
    assert here.spending.charged_total == held.charged_total == Charge(4.0, 0.01)
    state = await there.state()
    assert (state.stopped_by, state.why) == ("max_failures", here.spending.why)
    assert asked[:3] == ["admit", "flying", "charged"]
    await there.out_of_credits()  # already stopped: the first guard's word stands
    assert held.stopped_by == "max_failures"


@pytest.mark.anyio
async def test_a_line_waiting_for_the_first_price_goes_once_it_is_charged() -> None:
    from imggw_client.batch._admission import LocalGuard

    guard = LocalGuard(Spending(Caps(max_credits=100)))
    assert await guard.admit("first", "1k")  # nothing charged yet: one line finds the price
    admitted: list[bool] = []

    async def second() -> None:
        admitted.append(await guard.admit("second", "1k"))

    async with anyio.create_task_group() as group:
        group.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert admitted == []  # it waits for the first line's charge
        await guard.charged("first", "1k", Charge(), Charge(4.0, 0.01), final=False)
    assert admitted == [True]
