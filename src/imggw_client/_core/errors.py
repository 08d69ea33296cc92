"""The root of the error tree and the error the models raise: a module that imports only the
reason table.

``exceptions`` is their home and draws the whole tree; they live here so that ``models`` can
raise them without importing ``exceptions``, which names the models in its own annotations (the
import circle ``exceptions`` -> ``models`` -> ``exceptions``). Both keep
``imggw_client._core.exceptions`` as their ``__module__``: tracebacks and pickles name the
module that draws the tree.
"""

from __future__ import annotations

from typing import Any

from .reasons import INVALID_REQUEST

__all__ = ["ImggwError", "RequestValidationError", "add_note"]

_HOME = "imggw_client._core.exceptions"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (PEP 678), also on Python 3.10, which has no ``add_note`` but
    prints ``__notes__`` all the same once a traceback module that knows them shows it.
    """
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    notes = getattr(exc, "__notes__", None)
    try:
        if isinstance(notes, list):
            notes.append(note)
        else:
            exc.__notes__ = [note]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception that takes no attributes: nothing to do
        pass


def _rebuilt(cls: type[ImggwError], args: tuple[Any, ...]) -> ImggwError:
    """An error of ``cls`` with ``args``, its ``__init__`` not run: pickle then restores every
    field from the saved ``__dict__``."""
    return cls.__new__(cls, *args)


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

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross processes (a ProcessPoolExecutor's job, a Dask task): the default would
        # call ``__init__`` again with the message alone, which most subclasses refuse, and a
        # pool whose result cannot be read breaks. Every field (notes too) is in ``__dict__``.
        return (_rebuilt, (type(self), self.args), self.__dict__)

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
        code: str = INVALID_REQUEST.code,
        errors: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(f"{field}: {rule}", code=code)
        self.field = field
        self.rule = rule
        self.errors = errors if errors is not None else [(field, rule)]
