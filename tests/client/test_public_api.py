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
# The request's choices as types (DESIGN 21): typing.Literal aliases, documented in the
# package's docstring (an alias has no docstring of its own).
TYPES = {"AspectRatio", "Resolution", "Surface"}
PINNED |= TYPES
ADDED = {
    "APIConnectionError",
    "APITimeoutError",
    "BudgetService",
    "ClientClosedError",
    "ConflictError",
    "SyncBudgetService",
    "__version__",
    "new_idempotency_key",
}
# The codes an error of the SDK's own carries in ``.code`` (values pinned: scripts compare them).
CODES = {
    "FILE_EXISTS": "file_exists",
    "WRITE_FAILED": "write_failed",
    "MISSING_API_KEY": "missing_api_key",
    "MISSING_BASE_URL": "missing_base_url",
}
ADDED |= set(CODES)


def test_exported_names_are_exactly_the_pinned_set_plus_documented_additions() -> None:
    assert set(imggw_client.__all__) == PINNED | ADDED
    assert imggw_client.__all__ == sorted(imggw_client.__all__, key=str)
    for name in imggw_client.__all__:
        assert hasattr(imggw_client, name), name


def test_sdk_never_imports_cli_or_server_libraries() -> None:
    import subprocess
    import sys

    code = (
        "import sys, imggw_client, imggw_client._core.flows, imggw_client.rules, imggw_client.text;"
        "bad = {'typer', 'rich', 'uvicorn'} & set(sys.modules);"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_error_tree_matches_the_design() -> None:
    e = imggw_client
    for name in (PINNED | ADDED) - {"__version__"} - set(CODES) - TYPES:
        obj = getattr(e, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, e.ImggwError), name
    for name in API_ERRORS | {"ConflictError"}:
        assert issubclass(getattr(e, name), e.APIError), name
    assert issubclass(e.RequestValidationError, ValueError)
    assert not issubclass(e.WaitTimeoutError, e.TaskFailedError)
    assert issubclass(e.APITimeoutError, e.APIConnectionError)


@pytest.mark.parametrize("name", sorted((PINNED | ADDED) - {"__version__"} - set(CODES) - TYPES))
def test_public_names_have_docstrings_with_an_example(name: str) -> None:
    obj = getattr(imggw_client, name)
    doc = inspect.getdoc(obj) or ""
    assert doc, name
    assert "Example" in doc, name


def test_the_type_aliases_are_literals_the_package_documents_with_an_example() -> None:
    from typing import Literal, get_origin

    package_doc = inspect.getdoc(imggw_client) or ""
    for name in sorted(TYPES):
        assert get_origin(getattr(imggw_client, name)) is Literal, name
        assert f"``{name}``" in package_doc, name
    assert "from imggw_client import AspectRatio, Resolution, Surface" in package_doc


def test_error_codes_keep_their_values_and_the_package_documents_them() -> None:
    package_doc = inspect.getdoc(imggw_client) or ""
    for name, value in CODES.items():
        assert getattr(imggw_client, name) == value
        assert f"``{name}``" in package_doc, name
    assert "imggw_client.FILE_EXISTS" in package_doc  # in the example


def test_a_new_idempotency_key_is_fresh_and_valid() -> None:
    from imggw_client._core import rules

    keys = {imggw_client.new_idempotency_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    assert all(not rules.check_idempotency_key(k) for k in keys)  # a key a submit takes


# Public modules beside the package face: each documented with an example, and each of their
# functions too (their constants are described in the module's docstring).
PUBLIC_MODULES = {
    "imggw_client.rules": [
        "ASPECT_RATIOS",
        "COMBINATIONS_TEXT",
        "RESOLUTIONS",
        "RESULT_ROOM",
        "Violation",
        "check_prompt",
    ],
    "imggw_client.text": ["printable", "redact_url", "strict_json"],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC_MODULES))
def test_public_modules_export_documented_names(module_name: str) -> None:
    import importlib

    module = importlib.import_module(module_name)
    assert module.__all__ == PUBLIC_MODULES[module_name]
    doc = inspect.getdoc(module) or ""
    assert "Example" in doc, module_name
    for name in module.__all__:
        obj = getattr(module, name)
        assert f"{name}" in doc, (module_name, name)
        if inspect.isfunction(obj):
            assert "Example" in (inspect.getdoc(obj) or ""), (module_name, name)


def test_the_rules_are_the_cores() -> None:
    from imggw_client import rules
    from imggw_client._core import rules as core

    assert rules.ASPECT_RATIOS == core.ASPECT_RATIOS
    assert len(rules.ASPECT_RATIOS) == 16
    assert rules.RESOLUTIONS == ("1k", "2k", "4k")
    assert rules.check_prompt is core.check_prompt
    assert [v.field for v in rules.check_prompt(" ")] == ["prompt"]


def test_the_mock_gateway_can_be_served_from_another_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from imggw_client import mock

    assert "main" in mock.__all__
    assert "Example" in (inspect.getdoc(mock.main) or "")
    assert mock.main(["--help"], prog="mytool gateway") == 0
    assert capsys.readouterr().out.startswith("usage: mytool gateway ")
    assert mock.main(["--port", "not-a-port"]) == 2


PUBLIC_METHODS = ["submit", "get", "wait", "generate", "download", "read", "close"]
# What other packages (the batch runner, the Dask driver, the CLI, the reference gateway) use
# instead of a client's privates; each documented on both clients.
SEAMS = [
    "make_http_client",
    "share_budget",
    "redact",
    "redact_url",
    "gateway_silent_for",
    "typical_durations",
    "learn_durations",
    "timeout",
    "retry",
    "poll",
    "default_headers",
    "with_options",
    "read",
    "open",
]


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
        "default_headers",
        "timeout",
        "max_retries",
        "retry",
        "poll",
        "rate_limit",
        "http_client",
        "transport",
        "journal",
        "idempotency_window",
    ]
    defaults = {k: p.default for k, p in sig.parameters.items()}
    assert defaults["journal"] is None
    assert defaults["idempotency_window"] is None  # IMGGW_IDEMPOTENCY_WINDOW, else 86400
    assert defaults["default_headers"] is None
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
    for name in ("wait", "generate"):  # the wait's deadline; timeout= its deprecated name
        params = inspect.signature(getattr(Client, name)).parameters
        assert params["wait_timeout"].default == 600.0, name
        assert params["timeout"].default is None, name
        assert params["extra_headers"].default is None, name
    for name in ("submit", "get"):
        assert inspect.signature(getattr(Client, name)).parameters["extra_headers"].default is None
    assert list(inspect.signature(Client.with_options).parameters) == [
        "self",
        "api_key",
        "base_url",
        "surface",
        "default_headers",
        "timeout",
        "max_retries",
        "retry",
        "poll",
        "idempotency_window",
    ]
    for cls in (Client, AsyncClient):
        read = inspect.signature(cls.read).parameters
        opened = inspect.signature(cls.open).parameters
        assert list(read) == list(opened) == ["self", "task", "index", "max_bytes", "timeout"]
        assert read["index"].default == opened["index"].default == 0
    assert inspect.iscoroutinefunction(AsyncClient.read)
    assert not inspect.iscoroutinefunction(AsyncClient.open)  # an async context manager
    assert inspect.signature(Client.download).parameters["overwrite"].default is False
    assert inspect.signature(Client.generate).parameters["on_submit"].default is None
    completed = inspect.signature(Client.as_completed).parameters
    assert list(completed) == ["self", "items", "timeout", "errors"]
    assert completed["timeout"].default is None
    assert completed["errors"].default == "yield"  # one task's error is that task's outcome
    unfinished = inspect.signature(Client.unfinished).parameters
    assert list(unfinished) == ["self", "resend_expired_keys"]
    assert unfinished["resend_expired_keys"].default is False
    assert inspect.isasyncgenfunction(AsyncClient.as_completed)
    assert inspect.isgeneratorfunction(Client.as_completed)
    assert inspect.iscoroutinefunction(AsyncClient.unfinished)


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
