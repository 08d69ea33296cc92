"""Which hosts a result download's redirect may not lead to (``_core/origins.py``): loopback,
private and link-local addresses in every form a resolver reads, and local names."""

from __future__ import annotations

import pytest

from imggw_client._core.origins import internal_host, refused_redirect

INTERNAL = {
    "127.0.0.1": "loopback",
    "127.1": "loopback",  # the C resolver's short forms
    "0x7f000001": "loopback",
    "2130706433": "loopback",
    "0177.0.0.1": "loopback",
    "0.0.0.0": "loopback",
    "0": "loopback",
    "::1": "loopback",
    "[::1]": "loopback",
    "::ffff:127.0.0.1": "loopback",
    "2002:7f00:1::": "loopback",  # 6to4 of 127.0.0.1
    "localhost": "loopback",
    "LOCALHOST.": "loopback",
    "api.localhost": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fd00::1": "private",
    "100.64.0.1": "private",
    "169.254.169.254": "link-local",  # the clouds' metadata address
    "fe80::1%eth0": "link-local",
    "metadata.google.internal": "local name",
    "printer.local": "local name",
    "router.home.arpa": "local name",
    "intranet": "local name",
}
PUBLIC = ["8.8.8.8", "cdn.example.com", "1e100.net", "2606:4700::1111", "cafe.example", "s3.test"]


@pytest.mark.parametrize(("host", "kind"), INTERNAL.items())
def test_internal_hosts_are_told_in_every_form(host: str, kind: str) -> None:
    assert internal_host(host) == kind


@pytest.mark.parametrize("host", PUBLIC)
def test_public_hosts_are_not_internal(host: str) -> None:
    assert internal_host(host) is None


def test_a_redirect_is_refused_only_when_it_leaves_the_origin_for_an_internal_host() -> None:
    link = ("http", "127.0.0.1", 8000)
    assert refused_redirect(link, ("http", "127.0.0.1", 8000)) is None  # its own origin
    assert refused_redirect(link, ("http", "127.0.0.1", 9000)) == "loopback"  # another port
    assert refused_redirect(link, ("https", "127.0.0.1", 8000)) == "loopback"  # another scheme
    cdn = ("https", "cdn.example", 443)
    assert refused_redirect(cdn, ("https", "CDN.example.", 443)) is None
    assert refused_redirect(cdn, ("https", "s3.example", 443)) is None  # a public host
    assert refused_redirect(cdn, ("http", "169.254.169.254", 80)) == "link-local"
    assert refused_redirect(cdn, ("http", "localhost", 80)) == "loopback"
