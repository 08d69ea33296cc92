"""Request limits per API key (``submit_limit`` / ``query_limit``, ``N/S``): a sliding window,
both surfaces together, 429 ``rate_limited`` with ``Retry-After``, and nothing changed."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from imggw_client import ConfigurationError
from imggw_client.mock import MockGateway, MockResponse

from .helpers import KEY, beta_body, call, query, submit, task_id


def limited(**kw: object) -> MockGateway:
    settings: dict[str, object] = {"manual_clock": True, "duration_min": 1, "duration_max": 1}
    return MockGateway(api_keys=[KEY, "other-key"], **{**settings, **kw})  # type: ignore[arg-type]


def refused(answer: MockResponse, retry_after: str | None) -> None:
    body = json.loads(answer.body)
    assert answer.status == 429
    assert body["error"]["code"] == "rate_limited"
    assert KEY not in body["error"]["message"]
    assert dict(answer.headers).get("retry-after") == retry_after


def test_at_most_n_submits_in_any_window_then_429_with_the_wait() -> None:
    gw = limited(submit_limit="3/10")
    assert [submit(gw).status for _ in range(3)] == [200, 200, 200]
    refused(submit(gw), "10")
    gw.advance(4)
    refused(submit(gw), "6")
    gw.advance(5.5)
    refused(submit(gw), "1")  # 0.5 s left: never less than 1
    gw.advance(0.5)  # the first three fall out of (t - 10, t]
    assert [submit(gw).status for _ in range(4)] == [200, 200, 200, 429]
    stats = gw.stats()
    assert (stats["tasks_created"], stats["rate_limited"]) == (6, 4)
    assert stats["billing"][next(iter(stats["billing"]))]["tasks"] == 6


def test_the_window_slides_rather_than_resets() -> None:
    gw = limited(submit_limit="2/10")
    submit(gw)  # t = 0
    gw.advance(5)
    submit(gw)  # t = 5
    gw.advance(5)
    assert submit(gw).status == 200  # t = 10: the first left the window
    gw.advance(2)
    refused(submit(gw), "3")  # t = 12: the one at 5 frees a slot at 15
    gw.advance(3)
    assert submit(gw).status == 200


def test_a_refused_request_changes_nothing() -> None:
    gw = limited(submit_limit="1/60")
    first = submit(gw, idem="a")
    refused(submit(gw, idem="b"), "60")  # no task, no key record...
    refused(submit(gw, idem="a"), "60")  # ...and no replay counted
    gw.advance(60)
    again = submit(gw, idem="b", prompt="another request")  # "b" was never bound
    assert (again.status, task_id(again)) == (200, "2")
    gw.advance(60)
    replay = submit(gw, idem="a")
    assert task_id(replay) == task_id(first)
    stats = gw.stats()
    assert (stats["tasks_created"], stats["replays"], stats["conflicts"]) == (2, 1, 0)
    assert stats["rate_limited"] == 2


def test_refused_requests_do_not_use_up_the_window() -> None:
    gw = limited(submit_limit="2/10")
    submit(gw)
    submit(gw)
    for _ in range(100):
        refused(submit(gw), "10")
    gw.advance(10)
    assert [submit(gw).status for _ in range(3)] == [200, 200, 429]


def test_both_surfaces_count_together_and_each_key_has_its_own_window() -> None:
    gw = limited(submit_limit="3/10")
    assert submit(gw, "beta").status == submit(gw, "alpha").status == 200
    assert submit(gw, "beta").status == 200
    alpha = submit(gw, "alpha")
    assert (alpha.status, json.loads(alpha.body)["code"]) == (429, 429)
    assert dict(alpha.headers)["retry-after"] == "10"
    other = call(gw, "POST", "/beta/v1/images/generations", beta_body(), key="other-key")
    assert other.status == 200


def test_queries_and_submits_have_separate_limits() -> None:
    gw = limited(query_limit="2/1")
    tid = task_id(submit(gw))
    assert query(gw, tid).status == 200
    assert query(gw, tid, "alpha").status == 404  # counted too: a query of this key
    refused(query(gw, tid), "1")
    assert submit(gw).status == 200  # no submit limit
    gw.advance(1)
    assert query(gw, tid).status == 200
    assert gw.stats()["rate_limited"] == 1


def test_unauthenticated_requests_are_not_counted_against_anyone() -> None:
    gw = limited(submit_limit="1/10")
    for _ in range(5):
        assert (
            call(gw, "POST", "/beta/v1/images/generations", beta_body(), key="wrong").status == 401
        )
    assert submit(gw).status == 200


def test_result_downloads_are_not_limited() -> None:
    gw = limited(query_limit="1/60")
    tid = task_id(submit(gw))
    gw.advance(1)
    url = json.loads(query(gw, tid).body)["data"]["result"]["images"][0]["url"][0]
    path = url.removeprefix("http://imggw.mock")
    assert [call(gw, "GET", path, key=None).status for _ in range(5)] == [200] * 5


def test_quirks_alpha_http200_and_no_retry_after() -> None:
    gw = limited(submit_limit="1/10", quirks=["alpha_http200", "no_retry_after"])
    submit(gw, "alpha")
    answer = submit(gw, "alpha")
    body = json.loads(answer.body)
    assert (answer.status, body["code"], body["data"]) == (200, 429, None)  # as the provider
    assert "retry-after" not in dict(answer.headers)
    beta = submit(gw, "beta")
    assert beta.status == 429
    assert "retry-after" not in dict(beta.headers)


def test_no_retry_after_also_covers_injected_429s() -> None:
    gw = limited(fault_rate=1.0, faults=["429"], quirks=["no_retry_after"])
    answer = submit(gw)
    assert answer.status == 429
    assert "retry-after" not in dict(answer.headers)


def test_the_window_holds_at_most_n_timestamps() -> None:
    gw = limited(submit_limit="5/1000", query_limit="3/1000")
    for _ in range(200):
        submit(gw)
        query(gw, "1")
        gw.advance(0.1)
    assert sorted(len(w) for w in gw._windows.values()) == [3, 5]
    assert gw.stats()["rate_limited"] == 195 + 197


def test_limits_can_change_on_the_fly() -> None:
    gw = limited(submit_limit="5/10")
    for _ in range(3):
        submit(gw)
    gw.configure(submit_limit="2/10")
    refused(submit(gw), "10")
    gw.configure(submit_limit=None)
    assert [submit(gw).status for _ in range(20)] == [200] * 20  # not counted meanwhile
    gw.configure(submit_limit="10/10")  # the window kept the newest two
    assert [submit(gw).status for _ in range(9)] == [200] * 8 + [429]


@pytest.mark.parametrize(
    "value",
    [
        "0/10",
        "-1/10",
        "1.5/10",
        "10",
        "10/0",
        "10/-1",
        "a/b",
        "10/inf",
        "10/nan",
        "",
        "/",
        "3/10/2",
        3,
    ],
)
def test_bad_limits_are_refused_with_a_clear_message(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        MockGateway(submit_limit=value)
    assert "submit_limit must be N/S" in str(info.value)
    with pytest.raises(ConfigurationError, match="query_limit must be N/S"):
        MockGateway(query_limit=value)


@pytest.mark.parametrize("value", ["1/1", "20/10", " 10 / 0.5 ", "100000/86400"])
def test_good_limits(value: str) -> None:
    MockGateway(submit_limit=value, query_limit=value)


def test_bad_limit_on_the_command_line_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "imggw_client.mock", "--port", "0", "--query-limit", "10/0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: query_limit must be N/S")
    assert "Traceback" not in done.stderr


def test_limits_over_a_real_socket() -> None:
    gw = MockGateway(submit_limit="2/60", query_limit="1/60", duration_min=0, duration_max=0)
    auth = {"Authorization": f"Bearer {KEY}"}
    with gw.serve() as url, httpx.Client(base_url=url, headers=auth) as http:
        answers = [http.post("/beta/v1/images/generations", json=beta_body()) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[2].json()["error"]["code"] == "rate_limited"
        assert 59 <= int(answers[2].headers["retry-after"]) <= 60
        assert http.get("/beta/v1/tasks/1").status_code == 200
        limited_query = http.get("/alpha/api/v1/jobs/recordInfo", params={"taskId": "1"})
        assert (limited_query.status_code, limited_query.json()["code"]) == (429, 429)
        stats = httpx.get(f"{url}/_mock/stats").json()
    assert (stats["tasks_created"], stats["rate_limited"]) == (2, 2)
