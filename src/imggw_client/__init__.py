"""imggw: the Python SDK for the imggw asynchronous image-generation gateway.

Example::

    from imggw_client import Client

    with Client() as client:                       # IMGGW_API_KEY, IMGGW_BASE_URL
        task = client.generate("a lighthouse at dusk", aspect_ratio="16:9")
        for f in client.download(task, "out/"):
            print(f.path, f.sha256)
"""

from ._async_client import AsyncClient
from ._client import Client
from ._config import PollPolicy, RetryPolicy
from ._exceptions import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
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
from ._version import __version__

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AsyncClient",
    "AuthenticationError",
    "Client",
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
    "RateLimitError",
    "RequestValidationError",
    "ResultExpiredError",
    "RetryPolicy",
    "ServerError",
    "Submission",
    "Task",
    "TaskError",
    "TaskFailedError",
    "TaskStatus",
    "UnknownOutcomeError",
    "WaitTimeoutError",
    "__version__",
]
