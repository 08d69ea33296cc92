"""The root of the error tree and the error the models raise: a module that imports nothing.

``_exceptions`` is their public home and draws the whole tree; they live here so that
``_models`` can raise them without importing ``_exceptions``, which names the models in its
own annotations (the import circle ``_exceptions`` -> ``_models`` -> ``_exceptions``).
Both keep ``imggw_client._exceptions`` as their ``__module__``: tracebacks and pickles name the
public home, as they did before the move.

Example::

    from imggw_client._exceptions import RequestValidationError   # the same class
"""

from __future__ import annotations

__all__ = ["ImggwError", "RequestValidationError"]

_HOME = "imggw_client._exceptions"


class ImggwError(Exception):
    """Base of every error the SDK raises.

    Every error carries ``message`` and, where they apply, ``status_code`` (HTTP status, or the
    body code on surface A), ``code`` (the gateway's stable reason code) and ``surface``.

    Example::

        try:
            client.get("12345")
        except imggw_client.ImggwError as err:
            print(err.code, err.message)
    """

    __module__ = _HOME

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        surface: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        self.surface = surface

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, status_code={self.status_code!r}, "
            f"code={self.code!r}, surface={self.surface!r})"
        )


class RequestValidationError(ImggwError, ValueError):
    """A request broke a rule of the gateway contract; nothing was sent.

    ``field`` names the offending field (``prompt``, ``aspect_ratio``, ``resolution``,
    ``idempotency_key``, ``task_id``, ...), ``rule`` says which rule, and ``code`` is the same
    stable reason code the reference gateway answers with (``invalid_prompt``,
    ``unsupported_combination``, ...). ``errors`` lists every ``(field, rule)`` found. The prompt
    is never echoed.

    Example::

        try:
            ImageRequest("a cat", aspect_ratio="auto", resolution="4k")
        except RequestValidationError as err:
            assert err.field == "resolution"
    """

    __module__ = _HOME

    def __init__(
        self,
        field: str,
        rule: str,
        *,
        code: str = "invalid_request",
        errors: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(f"{field}: {rule}", code=code)
        self.field = field
        self.rule = rule
        self.errors = errors if errors is not None else [(field, rule)]
