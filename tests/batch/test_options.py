"""The options of a run (``batch/_options.py``): checked once, each wrong one a clear error, and
the typed keywords (``RunOptions``) naming the same options as ``BatchOptions``."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, get_type_hints

import pytest

from imggw_client._core.exceptions import ConfigurationError, RequestValidationError
from imggw_client.batch._plan import LINE_TIMEOUT, BatchOptions, Caps, RunOptions


def test_the_keywords_and_the_options_are_the_same_names() -> None:
    assert set(get_type_hints(RunOptions)) == {f.name for f in fields(BatchOptions)}


def test_defaults_caps_time_and_keywords() -> None:
    options = BatchOptions()
    assert (options.concurrency, options.line_timeout, options.seconds) == (
        8,
        LINE_TIMEOUT,
        math.inf,
    )
    chosen = BatchOptions.of({"max_credits": 40, "max_failures": 3, "timeout": 60})
    assert chosen.caps == Caps(40, None, 3)
    assert chosen.seconds == 60.0
    assert BatchOptions.of(chosen.as_keywords()) == chosen


@pytest.mark.parametrize(
    ("options", "field", "says"),
    [
        ({"concurrency": 0}, "concurrency", "must be an integer >= 1"),
        ({"concurrency": True}, "concurrency", "must be an integer >= 1"),
        ({"timeout": math.inf}, "timeout", "must be a finite number of seconds >= 0"),
        ({"line_timeout": 0}, "line_timeout", "must be a finite number of seconds > 0"),
        ({"max_cost": -1}, "max_cost", "must be a number > 0, or None for no cap"),
        ({"max_failures": 1.5}, "max_failures", "must be an integer >= 1"),
        ({"format": "xml"}, "format", "must be one of jsonl, text, csv, or None"),
        ({"verify": "yes"}, "verify", "must be True or False"),
        ({"concurency": 4}, "concurency", "is not an option of a batch run (they are: "),
    ],
)
def test_each_wrong_option_is_one_clear_error(
    options: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(RequestValidationError) as raised:
        BatchOptions.of(options)
    assert raised.value.field == field
    assert says in raised.value.message


def test_an_unknown_surface_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="surface must be 'alpha' or 'beta'"):
        BatchOptions(surface="gamma")


def test_a_list_of_tasks_is_its_drivers_business_not_an_option() -> None:
    """DESIGN 19: ``collect_tasks`` (``download --from``) reads a list of tasks; no batch option
    turns a run into a collect."""
    assert "collect" not in {f.name for f in fields(BatchOptions)}
    assert "collect" not in get_type_hints(RunOptions)
    with pytest.raises(RequestValidationError, match="collect"):
        BatchOptions.of({"collect": True})
