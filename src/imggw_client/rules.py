"""The request rules of the gateway contract, as data: what :class:`~imggw_client.ImageRequest`
checks before anything is sent, for code that offers the choices or checks input itself (a
form, a command line).

- ``ASPECT_RATIOS``: the 16 aspect ratios, ``"auto"`` first;
- ``RESOLUTIONS``: ``"1k"``, ``"2k"``, ``"4k"`` (a request may give them in either case);
- ``RESULT_ROOM``: the bytes of free space a result of each resolution may need (4, 16 and
  64 MiB): what ``imggw generate`` and a batch check before paying for one;
- ``COMBINATIONS_TEXT``: the combination rules in one phrase, for a help text;
- :func:`check_prompt`: a prompt's violations, each a ``Violation(field, rule, code)`` whose
  ``rule`` says what is wrong without quoting the prompt (an empty list: the prompt is fine).

Example::

    from imggw_client import rules

    rules.ASPECT_RATIOS        # ('auto', '1:1', '3:2', ..., '9:21')
    rules.COMBINATIONS_TEXT    # 'auto, 5:4, 4:5, 3:1, 1:3, 9:21 require 1k; 1:1 allows no 4k'
    for violation in rules.check_prompt("   "):
        print(f"the prompt {violation.rule}")   # the prompt must contain a non-whitespace ...
"""

from ._core.rules import (
    ASPECT_RATIOS,
    COMBINATIONS_TEXT,
    RESOLUTIONS,
    RESULT_ROOM,
    Violation,
    check_prompt,
)

__all__ = [
    "ASPECT_RATIOS",
    "COMBINATIONS_TEXT",
    "RESOLUTIONS",
    "RESULT_ROOM",
    "Violation",
    "check_prompt",
]
