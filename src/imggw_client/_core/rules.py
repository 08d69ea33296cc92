"""The request rules of SPEC 2.4 and 8: the one source of truth for the SDK and the gateway.

Each check returns :class:`Violation` values instead of raising, so that the client can raise a
:class:`RequestValidationError` and the reference gateway can answer with an error body, from the
same facts: the field, the rule (text that never echoes the prompt) and a stable reason code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, NamedTuple, get_args

from . import reasons, spec

# The request's enumerations as types (exported as ``imggw_client.AspectRatio`` and
# ``Resolution``): a type checker refuses a ratio or resolution the gateway would. The tuples
# below are read from them, so each value is spelled once.
AspectRatio = Literal[
    "auto",
    "1:1",
    "3:2",
    "2:3",
    "4:3",
    "3:4",
    "5:4",
    "4:5",
    "16:9",
    "9:16",
    "2:1",
    "1:2",
    "3:1",
    "1:3",
    "21:9",
    "9:21",
]
# Either case, as ImageRequest accepts them (stored and sent in each surface's own case).
Resolution = Literal["1k", "2k", "4k", "1K", "2K", "4K"]
ASPECT_RATIOS: tuple[str, ...] = get_args(AspectRatio)
RESOLUTIONS: tuple[str, ...] = tuple(r for r in get_args(Resolution) if r.islower())
# Pixels of an image of each resolution, in 1k images: what its price and its file may grow
# by from a 1k one (a 2k image has twice the side of a 1k one).
PIXELS = {"1k": 1, "2k": 4, "4k": 16}
# The room a result of each resolution may plausibly need: a 1k PNG is about 1 to 3 MB and a
# 4K one up to a few tens of MB. A folder with less free space would take the task's money and
# then fail to save its image.
RESULT_ROOM = {res: (4 << 20) * n for res, n in PIXELS.items()}
PROMPT_MAX_CHARS = 20_000
BODY_MAX_BYTES = 256 * 1024
IDEMPOTENCY_KEY_MAX_CHARS = 255
# The contract says digits without a leading zero; a file name must hold one too (the result
# files are named after it), so an id of more than 64 digits, which no gateway hands out, is not
# one.
TASK_ID_MAX_DIGITS = 64
TASK_ID_REGEX = f"[1-9][0-9]{{0,{TASK_ID_MAX_DIGITS - 1}}}"
TASK_ID_PATTERN = re.compile(TASK_ID_REGEX)
SURFACES: tuple[str, ...] = get_args(spec.Surface)
INVALID_SURFACE = "invalid_surface"

# Combination rules (SPEC 2.4), stated per aspect ratio, in the order of ASPECT_RATIOS.
ONLY_1K: tuple[str, ...] = ("auto", "5:4", "4:5", "3:1", "1:3", "9:21")
NO_4K: tuple[str, ...] = ("1:1",)
COMBINATIONS_TEXT = f"{', '.join(ONLY_1K)} require 1k; {', '.join(NO_4K)} allows no 4k"

# The contract's prompt pattern ``\S`` is a JSON Schema pattern, so ECMA-262 decides what is
# whitespace: WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP U+FEFF, category Zs) and LineTerminator
# (LF, CR, U+2028, U+2029). Python's own ``\s`` differs (it counts U+001C..U+001F and U+0085,
# not U+FEFF), so the class is spelled out; the same text is the OpenAPI document's pattern,
# read alike by ECMA-262 and Python engines.
ECMA_WHITESPACE = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NON_BLANK_PATTERN = f"[^{ECMA_WHITESPACE}]"
_NON_BLANK = re.compile(NON_BLANK_PATTERN)
# Surrogate code points are not Unicode scalar values: a JSON escape such as "\ud800" can carry
# one, but no UTF-8 encoder can send it on, so such text is refused, never billed.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")
# The Idempotency-Key rule as a JSON Schema (ECMA-262) pattern, for the OpenAPI document.
IDEMPOTENCY_KEY_PATTERN = "^[!-~](?:[ -~]*[!-~])?$"

# The reason codes of the rules (rows of the table in ``reasons``), shared by
# RequestValidationError.code and the gateway's error bodies.
INVALID_PROMPT = reasons.INVALID_PROMPT.code
INVALID_ASPECT_RATIO = reasons.INVALID_ASPECT_RATIO.code
INVALID_RESOLUTION = reasons.INVALID_RESOLUTION.code
UNSUPPORTED_COMBINATION = reasons.UNSUPPORTED_COMBINATION.code
INVALID_IDEMPOTENCY_KEY = reasons.INVALID_IDEMPOTENCY_KEY.code
INVALID_TASK_ID = reasons.INVALID_TASK_ID.code
BODY_TOO_LARGE = reasons.BODY_TOO_LARGE.code


class Violation(NamedTuple):
    field: str
    rule: str
    code: str


def check_prompt(prompt: object) -> list[Violation]:
    """Checks a prompt: text of 1 to 20,000 code points, valid Unicode, with a character
    outside ECMA-262 whitespace (the contract's ``\\S``).

    Example::

        check_prompt("\\ufeff")   # [Violation('prompt', 'must contain a non-whitespace ...', ...)]
        check_prompt("\\x1c")     # [] : not whitespace in ECMA-262
    """
    if not isinstance(prompt, str):
        return [Violation("prompt", "must be a string", INVALID_PROMPT)]
    if not 1 <= len(prompt) <= PROMPT_MAX_CHARS:
        rule = f"must be 1 to {PROMPT_MAX_CHARS} characters long (got {len(prompt)})"
        return [Violation("prompt", rule, INVALID_PROMPT)]
    if _SURROGATE.search(prompt):
        rule = "must be valid Unicode text (no surrogate code points)"
        return [Violation("prompt", rule, INVALID_PROMPT)]
    if not _NON_BLANK.search(prompt):
        return [Violation("prompt", "must contain a non-whitespace character", INVALID_PROMPT)]
    return []


def check_image(
    aspect_ratio: object, resolution: object, *, resolutions: tuple[str, ...] | None = None
) -> list[Violation]:
    """Checks the enumerations and the combination rules. ``resolution`` is accepted in either
    case unless ``resolutions`` names the exact wire forms allowed (the gateway is strict)."""
    found: list[Violation] = []
    if not isinstance(aspect_ratio, str) or aspect_ratio not in ASPECT_RATIOS:
        rule = f"must be one of {', '.join(ASPECT_RATIOS)}"
        found.append(Violation("aspect_ratio", rule, INVALID_ASPECT_RATIO))
    if resolutions is not None:
        if not isinstance(resolution, str) or resolution not in resolutions:
            rule = f"must be one of {', '.join(resolutions)}"
            found.append(Violation("resolution", rule, INVALID_RESOLUTION))
    elif not isinstance(resolution, str) or resolution.lower() not in RESOLUTIONS:
        rule = "must be one of 1k, 2k, 4k (either case)"
        found.append(Violation("resolution", rule, INVALID_RESOLUTION))
    if found:
        return found
    assert isinstance(aspect_ratio, str)
    res = str(resolution).lower()
    if aspect_ratio in ONLY_1K and res != "1k":
        rule = f"aspect ratio {aspect_ratio} requires 1k"
        found.append(Violation("resolution", rule, UNSUPPORTED_COMBINATION))
    elif aspect_ratio in NO_4K and res == "4k":
        rule = f"aspect ratio {aspect_ratio} does not allow 4k"
        found.append(Violation("resolution", rule, UNSUPPORTED_COMBINATION))
    return found


def check_request(prompt: object, aspect_ratio: object, resolution: object) -> list[Violation]:
    """Every rule of SPEC 2.4 and 8 for one image request (SDK form, resolution either case)."""
    return check_prompt(prompt) + check_image(aspect_ratio, resolution)


def check_idempotency_key(key: object) -> list[Violation]:
    if not isinstance(key, str) or not key:
        rule = "must be a non-empty string"
    elif len(key) > IDEMPOTENCY_KEY_MAX_CHARS:
        rule = f"must be at most {IDEMPOTENCY_KEY_MAX_CHARS} characters"
    # Header values lose leading and trailing spaces in transit, which would change the key.
    elif not _PRINTABLE_ASCII.fullmatch(key) or key != key.strip():
        rule = "must be printable ASCII without leading or trailing spaces"
    else:
        return []
    return [Violation("idempotency_key", rule, INVALID_IDEMPOTENCY_KEY)]


# A header's name is an HTTP token; its value printable ASCII (spaces and tabs inside): what
# every HTTP stack sends as given, so a caller's header cannot split a request or be altered.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# The headers a caller may not set: the key (api_key=) and the submit's idempotency key
# (idempotency_key=), which keeps a retried submit from being billed twice.
PROTECTED_HEADERS: Mapping[str, str] = {
    spec.AUTHORIZATION_HEADER.lower(): "api_key=",
    spec.IDEMPOTENCY_HEADER.lower(): "idempotency_key=",
}
# Headers that frame the request itself: one a caller set would contradict the body the SDK
# sends (a wrong Content-Length is a broken request, retried as an unknown outcome).
FRAMING_HEADERS = frozenset({"content-length", "content-type", "host", "transfer-encoding"})
INVALID_HEADERS = "invalid_headers"


def check_headers(headers: object, field: str) -> list[Violation]:
    """Checks headers a caller adds to the gateway's requests (``default_headers``,
    ``extra_headers``): a mapping of header names (HTTP tokens) to printable ASCII values,
    none of them one the SDK sets for the protocol's sake (the key, the idempotency key).
    The rule names the header, never its value (it may be a secret).
    """
    if not isinstance(headers, Mapping):
        return [Violation(field, "must be a mapping of header names to values", INVALID_HEADERS)]
    found: list[Violation] = []
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            rule = "has a header name that is not an HTTP token (letters, digits, -, ...)"
        elif name.lower() in PROTECTED_HEADERS:
            rule = (
                f"may not set {name}: the SDK sets it (pass "
                f"{PROTECTED_HEADERS[name.lower()]} instead)"
            )
        elif name.lower() in FRAMING_HEADERS:
            rule = f"may not set {name}: the HTTP stack sets it for the body it sends"
        elif not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            rule = f"has a value for {name} that is not printable ASCII text"
        else:
            continue
        found.append(Violation(field, rule, INVALID_HEADERS))
    return found


def check_task_id(task_id: object) -> list[Violation]:
    if not isinstance(task_id, str) or not TASK_ID_PATTERN.fullmatch(task_id):
        rule = (
            f"must be a positive decimal number without leading zeros, at most "
            f"{TASK_ID_MAX_DIGITS} digits"
        )
        return [Violation("task_id", rule, INVALID_TASK_ID)]
    return []


def check_task_identity(task_id: object, surface: object) -> list[Violation]:
    """Checks a ``Task``'s id and surface before they name a file or a request: a task may be
    built from stored data (a JSON file, a database), which is no proof it came from a
    gateway. Only ASCII digits name a file, so an id such as ``"../x"``, an absolute path,
    a NUL or a Unicode digit lookalike can never leave the folder it is saved in.
    """
    found = [Violation("task.id", v.rule, v.code) for v in check_task_id(task_id)]
    if not isinstance(surface, str) or surface not in SURFACES:
        rule = f"must be one of {', '.join(SURFACES)}"
        found.append(Violation("task.surface", rule, INVALID_SURFACE))
    return found
