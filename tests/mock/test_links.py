"""Signed result links: ``Expires`` (Unix seconds) and ``Signature`` on every link, fresh on
each query, valid for ``link_ttl``; dead or tampered links answer 403, files past retention 410."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from typing import Any

import httpx
import pytest

from imggw_client.mock import MockGateway

from .helpers import KEY, call, query, record, submit, task_id


def manual(**kw: Any) -> MockGateway:
    return MockGateway(manual_clock=True, duration_min=10, duration_max=10, **kw)


def link(gw: MockGateway, tid: str, surface: str = "beta") -> tuple[str, dict[str, Any]]:
    data = record(query(gw, tid, surface))
    if surface == "alpha":
        return json.loads(data["resultJson"])["resultUrls"][0], {}
    image = data["result"]["images"][0]
    return image["url"][0], image


def fetch(gw: MockGateway, url: str) -> int:
    return call(gw, "GET", url.removeprefix("http://imggw.mock"), key=None).status


def params(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


@pytest.mark.parametrize("surface", ["alpha", "beta"])
def test_every_link_is_signed_and_b_states_its_expiry(surface: str) -> None:
    made = time.time()
    gw = manual(retention=3600)
    tid = task_id(submit(gw, surface))
    gw.advance(10)
    url, image = link(gw, tid, surface)
    signed = params(url)
    assert set(signed) == {"Expires", "Signature"}
    assert len(signed["Signature"]) == 64
    expires = int(signed["Expires"])
    # The default TTL is the retention, counted from completion (t = 10 on the manual clock,
    # which the gateway maps to Unix time once, when it is made: between these two readings).
    assert made + 10 + 3600 <= expires <= math.ceil(time.time() + 10 + 3600)
    if surface == "beta":
        assert image["expires_at"] == expires
        assert isinstance(image["expires_at"], int)
    assert fetch(gw, url) == 200


def test_each_query_hands_out_a_fresh_link_valid_for_the_ttl() -> None:
    gw = manual(link_ttl=30, retention=100)
    tid = task_id(submit(gw))
    gw.advance(10)
    first, image = link(gw, tid)
    assert image["expires_at"] == int(params(first)["Expires"])
    gw.advance(29)
    assert fetch(gw, first) == 200
    second, _ = link(gw, tid)
    assert int(params(second)["Expires"]) - int(params(first)["Expires"]) in (29, 30)
    gw.advance(2)
    assert fetch(gw, first) == 403  # dead link, file still kept...
    assert fetch(gw, second) == 200  # ...and served through a fresh one
    gw.advance(70)  # t = 111: the file is gone, 410 whatever the link says
    assert fetch(gw, second) == 410
    assert fetch(gw, link(gw, tid)[0]) == 410


def test_links_never_outlive_the_retention() -> None:
    gw = manual(link_ttl=1000, retention=100)
    tid = task_id(submit(gw))
    gw.advance(50)
    url, image = link(gw, tid)
    gw.advance(50)
    _, later = link(gw, tid)
    assert image["expires_at"] == later["expires_at"]  # both end with the retention
    assert image["expires_at"] == int(params(url)["Expires"])


def test_tampered_links_answer_403() -> None:
    gw = manual(link_ttl=30)
    one, two = task_id(submit(gw)), task_id(submit(gw))
    gw.advance(10)
    url, _ = link(gw, one)
    other, _ = link(gw, two)
    base, signed = url.split("?")[0], params(url)
    later = {**signed, "Expires": str(int(signed["Expires"]) + 3600)}
    swapped = other.split("?")[0] + "?" + urllib.parse.urlencode(signed)
    for bad in (
        base,  # unsigned
        f"{base}?{urllib.parse.urlencode(later)}",  # a longer life, same signature
        swapped,  # another file, this signature
        f"{base}?Expires={signed['Expires']}",
        f"{base}?Signature={signed['Signature']}",
        f"{base}?Expires=soon&Signature={signed['Signature']}",
        f"{base}?Expires={signed['Expires']}&Signature={signed['Signature'].upper()}",
        f"{base}?Expires={signed['Expires']}&Signature=%C3%A9",
    ):
        assert fetch(gw, bad) == 403, bad
    assert fetch(gw, url) == fetch(gw, other) == 200


def test_a_signed_link_to_a_forgotten_task_is_404() -> None:
    gw = manual(link_ttl=30)
    tid = task_id(submit(gw))
    gw.advance(10)
    url, _ = link(gw, tid)
    gw.reset()  # forgets the task; the link's signature still holds
    assert fetch(gw, url) == 404


def test_advance_moves_link_expiry_over_a_real_socket() -> None:
    gw = MockGateway(manual_clock=True, duration_min=1, duration_max=1, link_ttl=60)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "imagegen-2", "prompt": "a cat", "size": "1:1", "resolution": "1k", "n": 1}
    with gw.serve() as base, httpx.Client(base_url=base) as http:
        http.post("/beta/v1/images/generations", json=body, headers=auth).raise_for_status()
        http.post("/_mock/advance", params={"seconds": 1}).raise_for_status()
        image = http.get("/beta/v1/tasks/1", headers=auth).json()["data"]["result"]["images"][0]
        url = image["url"][0]
        assert url.startswith(f"{base}/results/")
        assert http.get(url).status_code == 200
        http.post("/_mock/advance", params={"seconds": 61}).raise_for_status()
        gone = http.get(url)
        assert gone.status_code == 403
        assert "expired" in gone.text
        fresh = http.get("/beta/v1/tasks/1", headers=auth).json()["data"]["result"]["images"][0]
        assert fresh["expires_at"] - image["expires_at"] in (61, 62)
        assert http.get(fresh["url"][0]).status_code == 200
