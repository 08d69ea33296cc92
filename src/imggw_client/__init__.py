"""imggw: the Python SDK for the imggw asynchronous image-generation gateway.

Example::

    from imggw_client import Client

    with Client() as client:                       # IMGGW_API_KEY, IMGGW_BASE_URL
        task = client.generate("a lighthouse at dusk", aspect_ratio="16:9")
        for f in client.download(task, "out/"):
            print(f.path, f.sha256)
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from ._async_client import AsyncClient
    from ._client import Client
    from ._config import PollPolicy, RateLimit, RetryPolicy
    from ._core.budget import BudgetService, SyncBudgetService
    from ._exceptions import (
        APIConnectionError,
        APIError,
        APITimeoutError,
        AuthenticationError,
        ClientClosedError,
        ConfigurationError,
        ConflictError,
        DownloadError,
        IdempotencyConflictError,
        ImggwError,
        InsufficientCreditsError,
        InvalidRequestError,
        NotFoundError,
        PermissionDeniedError,
        RateLimitError,
        RequestValidationError,
        ResultExpiredError,
        ServerError,
        TaskFailedError,
        UnknownOutcomeError,
        WaitTimeoutError,
    )
    from ._models import DownloadedFile, ImageRequest, Submission, Task, TaskError, TaskStatus

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AsyncClient",
    "AuthenticationError",
    "BudgetService",
    "Client",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "DownloadError",
    "DownloadedFile",
    "IdempotencyConflictError",
    "ImageRequest",
    "ImggwError",
    "InsufficientCreditsError",
    "InvalidRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "PollPolicy",
    "RateLimit",
    "RateLimitError",
    "RequestValidationError",
    "ResultExpiredError",
    "RetryPolicy",
    "ServerError",
    "Submission",
    "SyncBudgetService",
    "Task",
    "TaskError",
    "TaskFailedError",
    "TaskStatus",
    "UnknownOutcomeError",
    "WaitTimeoutError",
    "__version__",
]

# Where each public name lives. Loading on first use (PEP 562) keeps light entry points, such
# as ``imggw --help``, from paying for httpx and pydantic.
_HOMES = {
    "AsyncClient": "._async_client",
    "Client": "._client",
    "PollPolicy": "._config",
    "RateLimit": "._config",
    "RetryPolicy": "._config",
    "BudgetService": "._core.budget",
    "SyncBudgetService": "._core.budget",
    **dict.fromkeys(
        ["DownloadedFile", "ImageRequest", "Submission", "Task", "TaskError", "TaskStatus"],
        "._models",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_HOMES.get(name, "._exceptions"), __name__)
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
