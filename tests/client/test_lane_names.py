"""Redis lane names come from the key's slow fingerprint (DESIGN 18): whoever reads the store
pays PBKDF2's 100,000 rounds per guessed key, as for a batch's run id, not one sha256."""

from __future__ import annotations

import hashlib
from unittest import mock

import pytest

from imggw_client import Client, RateLimit
from imggw_client._base_client import key_fingerprint
from imggw_client._core import shared_budget
from imggw_client._core.config import resolve_settings
from imggw_client._rate_store import AsyncStoreBudget

pytest.importorskip("redis")

KEY = "sk-lane-canary-0c4f1e"
BASE = "https://gw.example"


def settings() -> object:
    return resolve_settings(
        KEY,
        BASE,
        surface="alpha",
        timeout=5.0,
        max_retries=0,
        retry=None,
        poll=None,
        rate_limit=RateLimit(store="redis://127.0.0.1:9/0"),
    )


def test_a_lane_is_named_from_the_slow_fingerprint_not_a_fast_hash_of_the_key() -> None:
    lanes = AsyncStoreBudget(settings()).keys  # type: ignore[arg-type]
    slow = key_fingerprint(KEY)
    for kind, (name, flying) in lanes.items():
        assert name == shared_budget.lane_key(slow, BASE, kind)
        assert flying == shared_budget.flying_key(name)  # named from the lane: no key in it
        assert KEY not in flying
        fast = hashlib.sha256(KEY.encode()).hexdigest()
        old = hashlib.sha256(f"imggw-budget\n{BASE}\n{KEY}".encode()).hexdigest()
        for quick in (fast, old):
            assert quick[:32] not in name
        assert KEY not in name
    # A client's copies share one budget: the fingerprint is worked out once for them all.
    with mock.patch("imggw_client._rate_store.key_fingerprint", wraps=key_fingerprint) as slow_fp:
        client = Client(
            api_key=KEY, base_url=BASE, rate_limit=RateLimit(store="redis://127.0.0.1:9/0")
        )
        copy = client.with_options(timeout=3.0)
        copy.close()
        client.close()
    assert slow_fp.call_count == 1
