"""One code per condition on both surfaces (DESIGN 18, issue 27 item 14): ``APIError.code`` on
surface A, whose envelope names no reason, is the reason code B sends for the same status, so
that code written against beta works on alpha."""

from __future__ import annotations

import pytest
import respx

from imggw_client import APIError, AsyncClient, AuthenticationError, Client, ImggwError
from imggw_client._core import reasons, spec, surfaces
from imggw_client._core.wire import Reply
from imggw_client.mock import MockGateway

from ..conftest import Driven, alpha_error, beta_error

pytestmark = pytest.mark.anyio

# DESIGN 18: the status, and the code B sends for it.
SAME_CODE = [
    (400, "invalid_request"),
    (422, "invalid_request"),
    (401, "unauthorized"),
    (402, "insufficient_credits"),
    (403, "forbidden"),
    (404, "task_not_found"),
    (409, "idempotency_in_progress"),
    (429, "rate_limited"),
    (500, "server_error"),
    (502, "server_error"),
    (503, "server_error"),
    (504, "server_error"),
]


@pytest.mark.parametrize(("status", "code"), SAME_CODE)
def test_the_table_is_the_design(status: int, code: str) -> None:
    reason = reasons.for_status(status)
    assert reason is not None
    assert reason.code == code
    assert reasons.BY_CODE[code] is reason  # one row of the reason table, spelled there


@pytest.mark.parametrize(("status", "code"), SAME_CODE)
@pytest.mark.parametrize("http_200", [False, True], ids=["http-status", "http-200"])
def test_an_alpha_error_reads_as_the_code_beta_sends(
    status: int, code: str, http_200: bool
) -> None:
    body = alpha_error(status, "refused", 200 if http_200 else status)
    alpha = surfaces.read_error("alpha", Reply(body.status_code, {}, body.content), now=0.0)
    body = beta_error(status, code)
    beta = surfaces.read_error("beta", Reply(body.status_code, {}, body.content), now=0.0)
    assert alpha is not None
    assert beta is not None
    assert (alpha.code, type(alpha)) == (beta.code, type(beta)) == (code, type(beta))


@pytest.mark.parametrize(("status", "code"), SAME_CODE)
@pytest.mark.parametrize("surface", ["alpha", "beta"])
def test_an_answer_naming_no_reason_reads_as_its_status(
    surface: spec.Surface, status: int, code: str
) -> None:
    """A proxy's page (no JSON at all) says only its status: the same code on both surfaces."""
    reply = Reply(status, {"content-type": "text/html"}, b"<html>Bad things</html>")
    err = surfaces.read_error(surface, reply, now=0.0)
    assert err is not None
    assert err.code == code


def test_a_reason_of_its_own_is_kept() -> None:
    """The idempotency reasons lead A's message, and a message of the reason table names its
    row: the SDK can tell the rule, so the status does not decide."""
    said = {
        "alpha": b'{"code":422,"msg":"idempotency_key_reused: no","data":null}',
        "beta": b'{"code":422,"error":{"code":"idempotency_key_reused","message":"no"}}',
    }
    for surface, body in said.items():
        err = surfaces.read_error(surface, Reply(422, {}, body), now=0.0)  # type: ignore[arg-type]
        assert err is not None
        assert err.code == "idempotency_key_reused"
    route = b'{"code":404,"msg":"No such route.","data":null}'
    err = surfaces.read_error("alpha", Reply(404, {}, route), now=0.0)
    assert err is not None
    assert err.code == reasons.NOT_FOUND.code


# ---------------------------------------------------------------------------- through a client


@pytest.mark.parametrize(("status", "code"), SAME_CODE)
async def test_a_query_refused_on_either_surface_has_one_code(
    client: Driven, respx_gateway: respx.MockRouter, status: int, code: str
) -> None:
    respx_gateway.get(spec.of("alpha").query_path).mock(
        return_value=alpha_error(status, "refused", status)
    )
    respx_gateway.get(url__regex=r"/beta/v1/tasks/\d+$").mock(return_value=beta_error(status, code))
    codes = []
    for surface in ("alpha", "beta"):
        with pytest.raises(ImggwError) as info:
            await client.get("7", surface=surface)
        err = info.value
        assert isinstance(err, APIError)
        assert err.status_code == status
        codes.append(err.code)
    assert codes == [code, code]


@pytest.mark.gateway(api_keys=["test-key"], credits=0.0)
@pytest.mark.parametrize("quirks", [(), ("alpha_http200",)], ids=["plain", "alpha-http200"])
async def test_the_reference_gateway_gives_one_code_on_both_surfaces(
    served_gateway: tuple[MockGateway, str], quirks: tuple[str, ...]
) -> None:
    """Over a socket: an unknown key, an unknown task, an empty balance."""
    gateway, url = served_gateway
    gateway.configure(quirks=quirks)
    seen: dict[str, list[str | None]] = {}
    for surface in ("alpha", "beta"):
        async with AsyncClient(api_key="not-a-key", base_url=url, surface=surface) as stranger:
            with pytest.raises(AuthenticationError) as refused:
                await stranger.get("1")
        with Client(api_key="test-key", base_url=url, surface=surface) as client:
            errors = [refused.value]
            for call in (lambda: client.get("999"), lambda: client.submit("a lighthouse")):
                with pytest.raises(APIError) as info:
                    call()
                errors.append(info.value)
        seen[surface] = [err.code for err in errors]
    assert (
        seen["alpha"] == seen["beta"] == ["unauthorized", "task_not_found", "insufficient_credits"]
    )
    assert gateway.stats()["tasks_created"] == 0
