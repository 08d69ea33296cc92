"""Idempotency, task lifecycle, results and retention, faults and control, on the manual clock."""

from __future__ import annotations

import json

import pytest

from imggw_client.mock import FAULT_KINDS, ManualClock, MockGateway, fingerprint

from .helpers import KEY, call, png_size, query, record, submit, task_id


def manual(**kw: object) -> MockGateway:
    settings: dict[str, object] = {"manual_clock": True, "duration_min": 10, "duration_max": 10}
    return MockGateway(api_keys=[KEY, "other-key"], seed=3, **{**settings, **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- idempotency


def test_same_key_same_body_replays_the_first_task_without_billing() -> None:
    gw = manual()
    first = submit(gw, idem="order-1")
    again = submit(gw, idem="order-1")
    assert task_id(first) == task_id(again) == "1"
    assert ("idempotent-replayed", "true") in again.headers
    assert ("idempotent-replayed", "true") not in first.headers
    stats = gw.stats()
    assert (stats["tasks_created"], stats["replays"]) == (1, 1)
    assert stats["billing"][fingerprint(KEY)]["tasks"] == 1


def test_whitespace_does_not_make_a_different_body() -> None:
    gw = manual()
    body = {"model": "imagegen-2", "prompt": "a cat", "size": "1:1", "resolution": "1k", "n": 1}
    call(gw, "POST", "/beta/v1/images/generations", raw=json.dumps(body).encode(), idem="k")
    spaced = json.dumps(body, indent=4, sort_keys=True).encode()
    answer = call(gw, "POST", "/beta/v1/images/generations", raw=spaced, idem="k")
    assert (answer.status, gw.stats()["replays"]) == (200, 1)


def test_same_key_different_body_is_422() -> None:
    gw = manual()
    submit(gw, idem="k")
    answer = submit(gw, idem="k", prompt="a dog")
    body = json.loads(answer.body)
    assert (answer.status, body["error"]["code"]) == (422, "idempotency_key_reused")
    assert gw.stats()["conflicts"] == 1
    assert gw.stats()["tasks_created"] == 1


def test_keys_are_scoped_per_api_key() -> None:
    gw = manual()
    submit(gw, idem="k")
    call(
        gw,
        "POST",
        "/beta/v1/images/generations",
        {"model": "imagegen-2", "prompt": "a cat", "size": "16:9", "resolution": "2k", "n": 1},
        key="other-key",
        idem="k",
    )
    assert gw.stats()["tasks_created"] == 2


@pytest.mark.parametrize(("first", "then"), [("beta", "alpha"), ("alpha", "beta")])
def test_a_key_reused_on_the_other_surface_is_a_conflict(first: str, then: str) -> None:
    """Keys belong to the API key, not to a surface. The same prompt on the other surface is
    still another wire request: refused, never a second task."""
    gw = manual()
    original = submit(gw, first, idem="k")
    crossed = submit(gw, then, idem="k")
    body = json.loads(crossed.body)
    assert crossed.status == 422
    if then == "beta":
        assert body["error"]["code"] == "idempotency_key_reused"
    else:
        assert body["msg"].startswith("idempotency_key_reused")
    assert submit(gw, then, idem="k", prompt="a dog").status == 422
    retry = submit(gw, first, idem="k")  # the identical retry on the first surface still replays
    assert (retry.status, task_id(retry)) == (200, task_id(original))
    stats = gw.stats()
    assert (stats["tasks_created"], stats["conflicts"], stats["replays"]) == (1, 2, 1)


def test_no_key_means_no_idempotency() -> None:
    gw = manual()
    submit(gw)
    submit(gw)
    assert gw.stats()["tasks_created"] == 2


def test_in_flight_key_is_409_with_retry_after_then_replays() -> None:
    gw = manual(fault_rate=1.0, faults=["latency"], latency=5.0)
    first = submit(gw, idem="k")
    assert first.status == 200
    assert first.delay > 0  # the adapter holds this answer back...
    gw.configure(fault_rate=0.0)  # faults off for the rest of the story
    second = submit(gw, idem="k")  # ...and meanwhile the key is in flight
    body = json.loads(second.body)
    assert (second.status, body["error"]["code"]) == (409, "idempotency_in_progress")
    retry_after = dict(second.headers)["retry-after"]
    assert 1 <= int(retry_after) <= 5
    gw.advance(5)
    third = submit(gw, idem="k")
    assert (third.status, task_id(third)) == (200, task_id(first))
    stats = gw.stats()
    assert (stats["tasks_created"], stats["conflicts"], stats["replays"]) == (1, 1, 1)


def test_keys_expire_after_the_window() -> None:
    gw = manual(idempotency_ttl=60)
    assert task_id(submit(gw, idem="k")) == "1"
    gw.advance(59)
    assert task_id(submit(gw, idem="k")) == "1"
    gw.advance(2)
    assert task_id(submit(gw, idem="k")) == "2"  # a fresh request now


# ---------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("surface", ["alpha", "beta"])
def test_tasks_move_through_the_states_with_rising_progress(surface: str) -> None:
    gw = manual()
    tid = task_id(submit(gw, surface))
    key = "state" if surface == "alpha" else "status"
    seen: list[tuple[str, int]] = []
    for _ in range(11):
        data = record(query(gw, tid, surface))
        seen.append((data[key], data["progress"]))
        gw.advance(1)
    states = [s for s, _ in seen]
    progress = [p for _, p in seen]
    assert progress == sorted(progress)
    assert progress[0] == 0
    assert progress[-1] == 100
    if surface == "alpha":
        assert states[0] == "waiting"
        assert "generating" in states
        assert states[-1] == "success"
    else:
        assert states[0] == "pending"
        assert "processing" in states
        assert states[-1] == "completed"


def test_durations_come_from_config_and_seed() -> None:
    def finish_times(seed: int) -> list[float]:
        gw = MockGateway(seed=seed, manual_clock=True, duration_min=1, duration_max=9)
        ids = [task_id(submit(gw)) for _ in range(5)]
        done: dict[str, float] = {}
        for step in range(100):
            for tid in ids:
                if tid not in done and record(query(gw, tid))["status"] == "completed":
                    done[tid] = step * 0.1
            gw.advance(0.1)
        assert len(done) == 5
        assert all(0.9 <= t <= 9.1 for t in done.values())
        return [done[t] for t in ids]

    assert finish_times(7) == finish_times(7)
    assert finish_times(7) != finish_times(8)


def test_results_are_real_pngs_of_the_aspect_ratio_without_auth() -> None:
    gw = manual(image_size=96)
    tid = task_id(submit(gw, size="16:9"))
    gw.advance(10)
    url = record(query(gw, tid))["result"]["images"][0]["url"][0]
    assert url.startswith("http://imggw.mock/results/")
    token = url.rsplit("/", 1)[1]
    assert len(token) >= 36  # 128-bit token + .png
    image = call(gw, "GET", url.removeprefix("http://imggw.mock"), key=None)
    assert image.status == 200
    assert ("content-type", "image/png") in image.headers
    assert png_size(image.body) == (96, 54)


def test_results_can_be_padded_to_a_size_and_stay_valid_pngs() -> None:
    import zlib

    gw = manual(result_size=100_000)
    tid = task_id(submit(gw))
    gw.advance(10)
    path = record(query(gw, tid))["result"]["images"][0]["url"][0].removeprefix("http://imggw.mock")
    first = call(gw, "GET", path, key=None).body
    assert len(first) == 100_000
    assert first == call(gw, "GET", path, key=None).body  # the same bytes every time
    assert first.endswith(b"IEND\xaeB`\x82")
    offset, kinds = 8, []
    while offset < len(first):  # every chunk's CRC holds
        length = int.from_bytes(first[offset : offset + 4], "big")
        kind = first[offset + 4 : offset + 8]
        data = first[offset + 8 : offset + 8 + length]
        crc = int.from_bytes(first[offset + 8 + length : offset + 12 + length], "big")
        assert zlib.crc32(kind + data) == crc
        kinds.append(kind)
        offset += 12 + length
    assert kinds == [b"IHDR", b"IDAT", b"paDd", b"IEND"]


def test_result_links_expire_after_retention() -> None:
    gw = manual(retention=100)
    tid = task_id(submit(gw, "alpha"))
    gw.advance(10)
    data = record(query(gw, tid, "alpha"))
    url = json.loads(data["resultJson"])["resultUrls"][0]
    path = url.removeprefix("http://imggw.mock")
    gw.advance(99)
    assert call(gw, "GET", path, key=None).status == 200
    gw.advance(2)
    assert call(gw, "GET", path, key=None).status == 410


def test_fail_tag_and_failure_rate() -> None:
    gw = manual()
    plain = task_id(submit(gw, prompt="a cat #fail"))
    coded = task_id(submit(gw, prompt="a cat #fail:nsfw_detected"))
    alpha = task_id(submit(gw, "alpha", prompt="#fail:content_policy_violation"))
    gw.advance(10)
    assert record(query(gw, plain))["error"] == {
        "code": "generation_failed",
        "message": "The image could not be generated.",
    }
    failed = record(query(gw, coded))
    assert (failed["status"], failed["error"]["code"]) == ("failed", "nsfw_detected")
    assert failed["result"] is None
    a = record(query(gw, alpha, "alpha"))
    assert (a["state"], a["failCode"]) == ("fail", "content_policy_violation")
    assert "content policy" in a["failMsg"]
    everyone = manual(failure_rate=1.0)
    ids = [task_id(submit(everyone)) for _ in range(5)]
    everyone.advance(10)
    assert {record(query(everyone, t))["status"] for t in ids} == {"failed"}


def test_billing_is_per_task_and_per_key() -> None:
    gw = manual()
    submit(gw, resolution="1k", size="16:9")
    submit(gw, "alpha", resolution="4K", aspect_ratio="16:9")
    billing = gw.stats()["billing"][fingerprint(KEY)]
    assert billing == {"tasks": 2, "credits": 20.0, "cost": 0.05}


# ---------------------------------------------------------------------------- faults


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind(kind: str) -> None:
    gw = manual(fault_rate=1.0, faults=[kind], latency=2.0, retry_after=7)
    answer = submit(gw, idem="k")
    stats = gw.stats()
    assert stats["faults"] == {kind: 1}
    created = stats["tasks_created"]
    if kind == "reset":
        assert (answer.drop, created) == (True, 0)
    elif kind == "lost":
        assert (answer.drop, created) == (True, 1)  # committed, then the answer is lost
    elif kind == "latency":
        assert (answer.status, created) == (200, 1)
        assert 0 < answer.delay <= 2.0
    elif kind == "429":
        assert (answer.status, created) == (429, 0)
        assert dict(answer.headers)["retry-after"] == "7"
    elif kind == "malformed":
        assert (answer.status, created) == (200, 1)
        with pytest.raises(json.JSONDecodeError):
            json.loads(answer.body)
    else:
        assert (answer.status, created) == (int(kind), 0)
        assert json.loads(answer.body)["code"] == int(kind)


def test_malformed_results_are_cut_short() -> None:
    gw = manual()
    tid = task_id(submit(gw))
    gw.advance(10)
    path = record(query(gw, tid))["result"]["images"][0]["url"][0].removeprefix("http://imggw.mock")
    gw.configure(fault_rate=1.0, faults=["malformed"])
    answer = call(gw, "GET", path, key=None)
    assert answer.truncate


def test_faults_follow_the_seed() -> None:
    def pattern(seed: int) -> list[int]:
        gw = MockGateway(seed=seed, fault_rate=0.5, faults=["503"])
        return [submit(gw).status for _ in range(30)]

    assert pattern(1) == pattern(1)
    assert pattern(1) != pattern(2)
    assert 5 < pattern(1).count(503) < 25


# ---------------------------------------------------------------------------- control


def test_stats_reset_and_advance_routes() -> None:
    gw = manual()
    submit(gw)
    query(gw, "1")
    stats = json.loads(call(gw, "GET", "/_mock/stats", key=None).body)
    assert isinstance(stats["tasks_created"], int)
    assert isinstance(stats["replays"], int)
    assert isinstance(stats["conflicts"], int)
    assert stats["requests"] == {
        "POST /beta/v1/images/generations": 1,
        "GET /beta/v1/tasks/{id}": 1,
    }
    assert json.loads(call(gw, "POST", "/_mock/advance", query={"seconds": "2.5"}).body) == {
        "clock": 2.5
    }
    assert call(gw, "POST", "/_mock/advance", query={"seconds": "-1"}).status == 400
    assert call(gw, "POST", "/_mock/advance", query={"seconds": "x"}).status == 400
    assert call(gw, "POST", "/_mock/reset").status == 200
    assert gw.stats()["tasks_created"] == 0
    assert query(gw, "1").status == 404
    assert task_id(submit(gw)) == "1"


def test_configure_validates_and_keeps_state() -> None:
    from imggw_client import ConfigurationError

    gw = manual()
    submit(gw)
    gw.configure(quirks=["beta_no_code"], api_keys=["new-key"])
    assert query(gw, "1").status == 401  # the old key is gone...
    assert gw.stats()["tasks_created"] == 1  # ...the tasks are not
    with pytest.raises(ConfigurationError):
        gw.configure(fault_rate=7)
    with pytest.raises(ConfigurationError):
        gw.configure(manual_clock=False)


def test_advance_needs_the_manual_clock() -> None:
    gw = MockGateway()
    assert call(gw, "POST", "/_mock/advance", query={"seconds": "1"}).status == 400
    with pytest.raises(RuntimeError):
        gw.advance(1)


def test_an_injected_clock() -> None:
    clock = ManualClock(100.0)
    gw = MockGateway(clock=clock, duration_min=5, duration_max=5)
    tid = task_id(submit(gw))
    clock.advance(5)
    assert record(query(gw, tid))["status"] == "completed"


def test_openapi_document() -> None:
    import jsonschema

    doc = json.loads(call(MockGateway(), "GET", "/openapi.json", key=None).body)
    assert doc["info"]["version"] == "1.0.0-stage3a2"
    assert set(doc["paths"]) == {
        "/alpha/api/v1/jobs/createTask",
        "/alpha/api/v1/jobs/recordInfo",
        "/beta/v1/images/generations",
        "/beta/v1/tasks/{id}",
        "/results/{file}",
    }
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)  # raises if a schema is invalid
    beta = doc["paths"]["/beta/v1/images/generations"]["post"]
    assert {"200", "401", "409", "413", "422", "429", "500"} <= set(beta["responses"])


@pytest.mark.parametrize(
    "settings",
    [
        {"api_keys": []},
        {"duration_min": 5, "duration_max": 1},
        {"failure_rate": 2},
        {"faults": ["meteor"]},
        {"quirks": ["weird"]},
        {"image_size": 0},
    ],
)
def test_bad_settings(settings: dict[str, object]) -> None:
    from imggw_client import ConfigurationError

    with pytest.raises(ConfigurationError):
        MockGateway(**settings)  # type: ignore[arg-type]
