"""Task.expires_at: from the record where the gateway states it, else from the links' signed
expiry. Table-driven; garbage and tampered values give None, never an error."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from imggw_client._core import expiry, surfaces
from imggw_client._core.wire import Reply

WHEN = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
EPOCH = int(WHEN.timestamp())
CDN = "https://bucket.example/r/1.png"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # AWS SigV4: signed at X-Amz-Date, valid X-Amz-Expires seconds
        (
            f"{CDN}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20310506T060809Z&X-Amz-Expires=3600"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=abc",
            WHEN,
        ),
        (f"{CDN}?x-amz-date=20310506T060809Z&x-amz-expires=3600", WHEN),  # any case
        # GCS V4
        (
            f"{CDN}?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Date=20310506T070709Z"
            "&X-Goog-Expires=60&X-Goog-Signature=abc",
            WHEN,
        ),
        # CloudFront and S3 SigV2: Unix seconds
        (f"{CDN}?Expires={EPOCH}&Signature=abc&Key-Pair-Id=K", WHEN),
        (f"{CDN}?AWSAccessKeyId=A&Expires={EPOCH}&Signature=abc", WHEN),
        # Azure SAS: se in ISO 8601 UTC
        (f"{CDN}?sv=2022-11-02&se=2031-05-06T07%3A08%3A09Z&sr=b&sp=r&sig=abc", WHEN),
        # no signed expiry at all
        (CDN, None),
        (f"{CDN}?v=2", None),
        (f"{CDN}?se=2031-05-06T07:08:09Z", None),  # `se` without a SAS signature: not Azure
        # garbage and tampered values: unknown, never an error
        (f"{CDN}?X-Amz-Date=20310506T060809Z&X-Amz-Expires=soon", None),
        (f"{CDN}?X-Amz-Date=yesterday&X-Amz-Expires=3600", None),
        (f"{CDN}?X-Amz-Date=20310506T060809Z", None),
        (f"{CDN}?X-Amz-Date=20310506T060809Z&X-Amz-Expires=999999999", None),  # decades
        (f"{CDN}?X-Goog-Date=20311306T070709Z&X-Goog-Expires=60", None),  # month 13
        (f"{CDN}?Expires=-5", None),
        (f"{CDN}?Expires=1e400", None),
        (f"{CDN}?Expires=99999999999999999999", None),
        (f"{CDN}?Expires=", None),
        (f"{CDN}?se=not-a-date&sig=abc", None),
        (f"{CDN}?se=0001-01-01T00:00:00Z&sig=abc", None),
        ("http://[::1", None),  # not even a URL
        (f"{CDN}?X-Amz-Date=20310506T060809Z&X-Amz-Expires=%C2%B2", None),  # a superscript two
        (f"{CDN}?Expires=%C2%B2", None),
        (f"{CDN}?X-Amz-Date=99991231T235959Z&X-Amz-Expires=86400", None),  # past year 9999
        (f"{CDN}?se=9999-12-31T23:59:59-05:00&sig=a", None),  # past year 9999 once in UTC
    ],
)
def test_signed_links_carry_their_expiry(url: str, expected: datetime | None) -> None:
    assert expiry.from_url(url) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (EPOCH, WHEN),
        (float(EPOCH), WHEN),
        (str(EPOCH), WHEN),
        (EPOCH * 1000, WHEN),  # milliseconds
        ("2031-05-06T07:08:09Z", WHEN),
        ("2031-05-06T09:08:09+02:00", WHEN),
        ("2031-05-06T07:08:09", WHEN),  # no zone: UTC
        (None, None),
        (True, None),
        ("", None),
        ("tomorrow", None),
        ("2031-13-40T00:00:00Z", None),
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        ([EPOCH], None),
        ({"at": EPOCH}, None),
        ("9" * 500, None),
        (10**401, None),
        ("9999-12-31T23:59:59.9999999-05:00", None),  # .NET's "never", with an offset
        ("0001-01-01T00:00:00+01:00", None),
        ("\u00b2", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits
    ],
)
def test_stated_values_are_read_leniently(value: object, expected: datetime | None) -> None:
    assert expiry.from_record_value(value) == expected


def beta(result: Any) -> Reply:
    body = {"code": 200, "data": {"id": "1", "status": "completed", "result": result}}
    return Reply(200, {}, json.dumps(body).encode())


def alpha(result_json: Any) -> Reply:
    data = {"taskId": "1", "state": "success", "resultJson": json.dumps(result_json)}
    return Reply(200, {}, json.dumps({"code": 200, "msg": "ok", "data": data}).encode())


SIGNED_LATER = f"{CDN}?Expires={EPOCH + 3600}&Signature=x"


@pytest.mark.parametrize(
    ("surface", "reply", "expected"),
    [
        # surface B image objects state it (the provider's form): it wins over the signed link
        ("beta", beta({"images": [{"url": [SIGNED_LATER], "expires_at": EPOCH}]}), WHEN),
        ("beta", beta({"images": [{"url": [CDN], "expires_at": "2031-05-06T07:08:09Z"}]}), WHEN),
        # the earliest of several images
        (
            "beta",
            beta(
                {
                    "images": [
                        {"url": [CDN], "expires_at": EPOCH + 60},
                        {"url": [CDN + "?2"], "expires_at": EPOCH},
                    ]
                }
            ),
            WHEN,
        ),
        # nothing stated: the signed link's own expiry
        ("beta", beta({"images": [{"url": [f"{CDN}?Expires={EPOCH}&Signature=x"]}]}), WHEN),
        # stated but garbage, and no signed link: unknown
        ("beta", beta({"images": [{"url": [CDN], "expires_at": "soon"}]}), None),
        ("beta", beta({"images": [{"url": [CDN]}]}), None),
        # surface A: beside the URLs in resultJson, or on its image objects
        ("alpha", alpha({"resultUrls": [SIGNED_LATER], "expires_at": EPOCH}), WHEN),
        ("alpha", alpha({"images": [{"url": CDN, "expiresAt": EPOCH}]}), WHEN),
        (
            "alpha",
            alpha({"resultUrls": [f"{CDN}?X-Amz-Date=20310506T060809Z&X-Amz-Expires=3600"]}),
            WHEN,
        ),
        ("alpha", alpha({"resultUrls": [CDN]}), None),
        # no links at all: nothing to expire
        ("beta", beta({"images": [], "expires_at": EPOCH}), None),
    ],
)
def test_a_task_knows_when_its_links_die(surface: Any, reply: Reply, expected: datetime) -> None:
    task = surfaces.read_task(surface, reply, "1", now=0.0)
    assert task.expires_at == expected
    if expected is not None:
        assert task.expires_at is not None
        assert task.expires_at.tzinfo is not None  # aware, in UTC
        assert task.expires_at.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [10**401, "9" * 401, float("inf"), "1e999", "nan", [1], "²"])
def test_odd_numbers_in_a_record_are_unknown_never_an_error(value: object) -> None:
    data = {
        "id": "1",
        "status": "processing",
        "progress": value,
        "cost": value,
        "credits_cost": value,
    }
    task = surfaces.read_task(
        "beta",
        Reply(200, {}, json.dumps({"code": 200, "data": data}, default=str).encode()),
        "1",
        0.0,
    )
    assert (task.progress, task.cost, task.credits) == (None, None, None)
