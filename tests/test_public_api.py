"""The package face: the exported names, their docs, and sync/async parity."""

from __future__ import annotations

import inspect

import pytest

import imggw_client
from imggw_client import AsyncClient, Client

PINNED = {
    "Client",
    "AsyncClient",
    "ImageRequest",
    "Submission",
    "Task",
    "TaskStatus",
    "TaskError",
    "DownloadedFile",
    "PollPolicy",
    "RetryPolicy",
    "RateLimit",
    "ImggwError",
    "ConfigurationError",
    "RequestValidationError",
    "APIError",
    "UnknownOutcomeError",
    "TaskFailedError",
    "WaitTimeoutError",
    "ResultExpiredError",
    "DownloadError",
}
# The APIError family: the DESIGN's status errors, plus ConflictError (409 in flight).
API_ERRORS = {
    "AuthenticationError",
    "InsufficientCreditsError",
    "NotFoundError",
    "InvalidRequestError",
    "IdempotencyConflictError",
    "RateLimitError",
    "ServerError",
    "PermissionDeniedError",
}
PINNED |= API_ERRORS
ADDED = {
    "APIConnectionError",
    "APITimeoutError",
    "BudgetService",
    "ClientClosedError",
    "ConflictError",
    "SyncBudgetService",
    "__version__",
}


def test_exported_names_are_exactly_the_pinned_set_plus_documented_additions() -> None:
    assert set(imggw_client.__all__) == PINNED | ADDED
    assert imggw_client.__all__ == sorted(imggw_client.__all__, key=str)
    for name in imggw_client.__all__:
        assert hasattr(imggw_client, name), name


def test_sdk_never_imports_cli_or_server_libraries() -> None:
    import subprocess
    import sys

    code = (
        "import sys, imggw_client, imggw_client._core.flows;"
        "bad = {'typer', 'rich', 'uvicorn'} & set(sys.modules);"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_error_tree_matches_the_design() -> None:
    e = imggw_client
    for name in PINNED | ADDED - {"__version__"}:
        obj = getattr(e, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, e.ImggwError), name
    for name in API_ERRORS | {"ConflictError"}:
        assert issubclass(getattr(e, name), e.APIError), name
    assert issubclass(e.RequestValidationError, ValueError)
    assert not issubclass(e.WaitTimeoutError, e.TaskFailedError)
    assert issubclass(e.APITimeoutError, e.APIConnectionError)


@pytest.mark.parametrize("name", sorted(PINNED | ADDED - {"__version__"}))
def test_public_names_have_docstrings_with_an_example(name: str) -> None:
    obj = getattr(imggw_client, name)
    doc = inspect.getdoc(obj) or ""
    assert doc, name
    assert "Example" in doc, name


PUBLIC_METHODS = ["submit", "get", "wait", "generate", "download", "close"]
# What other packages (the batch runner, the Dask driver, the CLI, the reference gateway) use
# instead of a client's privates; each documented on both clients.
SEAMS = ["make_http_client", "share_budget", "redact", "timeout", "retry", "poll"]


@pytest.mark.parametrize("cls", [Client, AsyncClient])
@pytest.mark.parametrize("name", SEAMS)
def test_the_seams_are_public_and_documented_with_an_example(cls: type, name: str) -> None:
    doc = inspect.getdoc(getattr(cls, name)) or ""
    assert "Example" in doc, (cls, name)


def test_sync_and_async_clients_have_the_same_public_methods_and_parameters() -> None:
    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    assert public(Client) == public(AsyncClient)
    assert set(PUBLIC_METHODS) <= public(Client)
    assert inspect.signature(Client.__init__) == inspect.signature(AsyncClient.__init__).replace(
        parameters=[
            p.replace(annotation=inspect.signature(Client.__init__).parameters[p.name].annotation)
            for p in inspect.signature(AsyncClient.__init__).parameters.values()
        ]
    )
    for name in PUBLIC_METHODS:
        sync_sig = inspect.signature(getattr(Client, name))
        async_sig = inspect.signature(getattr(AsyncClient, name))
        assert list(sync_sig.parameters) == list(async_sig.parameters), name
        for p_sync, p_async in zip(
            sync_sig.parameters.values(), async_sig.parameters.values(), strict=True
        ):
            assert (p_sync.kind, p_sync.default) == (p_async.kind, p_async.default), (name, p_sync)
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name
        assert inspect.getdoc(getattr(Client, name)), name
        assert inspect.getdoc(getattr(AsyncClient, name)), name


def test_client_signature_matches_the_design() -> None:
    sig = inspect.signature(Client)
    assert list(sig.parameters) == [
        "api_key",
        "base_url",
        "surface",
        "timeout",
        "max_retries",
        "retry",
        "poll",
        "rate_limit",
        "http_client",
        "transport",
    ]
    defaults = {k: p.default for k, p in sig.parameters.items()}
    assert defaults["surface"] == "beta"
    assert defaults["timeout"] == 30.0
    assert defaults["max_retries"] == 5
    assert defaults["retry"] is None
    assert defaults["poll"] == imggw_client.PollPolicy()
    assert defaults["rate_limit"] is None
    assert defaults["http_client"] is None
    assert defaults["transport"] is None
    submit = inspect.signature(Client.submit).parameters
    assert submit["aspect_ratio"].default == "auto"
    assert submit["resolution"].default == "1k"
    assert inspect.signature(Client.wait).parameters["timeout"].default == 600.0
    assert inspect.signature(Client.download).parameters["overwrite"].default is False


def test_task_status_values() -> None:
    assert [s.value for s in imggw_client.TaskStatus] == [
        "pending",
        "running",
        "succeeded",
        "failed",
    ]
    assert imggw_client.TaskStatus("running") == "running"


def test_policies_are_frozen_and_keyword_only() -> None:
    policy = imggw_client.RetryPolicy(max_attempts=3)
    with pytest.raises(AttributeError):
        policy.max_attempts = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        imggw_client.PollPolicy(1.0)  # type: ignore[misc]
