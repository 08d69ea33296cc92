"""ImageRequest and the core rules: every rule of SPEC 2.4 and 8, named, prompt never echoed."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imggw_client import ImageRequest, RequestValidationError
from imggw_client._core import rules

RATIOS = list(rules.ASPECT_RATIOS)
ONLY_1K = ["auto", "5:4", "4:5", "3:1", "1:3", "9:21"]
# ECMA-262 WhiteSpace and LineTerminator, from the standard's own list: what \S does not match.
ECMA_SPACE = {"\t", "\v", "\f", " ", "\u00a0", "\ufeff", "\n", "\r", "\u2028", "\u2029"} | {
    chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Zs"
}


def ecma_blank(text: str) -> bool:
    return all(c in ECMA_SPACE for c in text)


def allowed(ratio: str, res: str) -> bool:
    res = res.lower()
    if ratio in ONLY_1K:
        return res == "1k"
    if ratio == "1:1":
        return res != "4k"
    return True


def test_the_sixteen_ratios_and_three_resolutions() -> None:
    assert len(RATIOS) == 16
    assert set(RATIOS) == {
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
    }


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("res", ["1k", "2k", "4k", "1K", "2K", "4K"])
def test_combination_rules(ratio: str, res: str) -> None:
    if allowed(ratio, res):
        req = ImageRequest("a cat", aspect_ratio=ratio, resolution=res)
        assert req.resolution == res.lower()
        assert req.aspect_ratio == ratio
    else:
        with pytest.raises(RequestValidationError) as info:
            ImageRequest("a cat", aspect_ratio=ratio, resolution=res)
        assert info.value.field == "resolution"
        assert info.value.code == "unsupported_combination"
        assert ratio in info.value.rule


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ("", "1 to 20000"),
        ("x" * 20001, "1 to 20000"),
        ("   \n\t ", "non-whitespace"),
        (None, "string"),
        (42, "string"),
    ],
)
def test_prompt_rules(prompt: object, fragment: str) -> None:
    with pytest.raises(RequestValidationError) as info:
        ImageRequest(prompt)  # type: ignore[arg-type]
    assert (info.value.field, info.value.code) == ("prompt", "invalid_prompt")
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_prompt_limits_count_characters_not_bytes() -> None:
    assert ImageRequest("é" * 20000).prompt == "é" * 20000
    assert ImageRequest("x").prompt == "x"


@pytest.mark.parametrize("ratio", ["7:5", "1:1 ", "AUTO", "", None, 16])
def test_unknown_aspect_ratio(ratio: object) -> None:
    with pytest.raises(RequestValidationError) as info:
        ImageRequest("a cat", aspect_ratio=ratio)  # type: ignore[arg-type]
    assert (info.value.field, info.value.code) == ("aspect_ratio", "invalid_aspect_ratio")


@pytest.mark.parametrize("res", ["8k", "1", "", "1k ", None, 1])
def test_unknown_resolution(res: object) -> None:
    with pytest.raises(RequestValidationError) as info:
        ImageRequest("a cat", resolution=res)  # type: ignore[arg-type]
    assert (info.value.field, info.value.code) == ("resolution", "invalid_resolution")


def test_all_violations_are_listed_and_the_prompt_is_never_echoed() -> None:
    secret_prompt = "my secret prompt " * 2000  # too long
    with pytest.raises(RequestValidationError) as info:
        ImageRequest(secret_prompt, aspect_ratio="7:5", resolution="9k")
    err = info.value
    assert [f for f, _ in err.errors] == ["prompt", "aspect_ratio", "resolution"]
    text = str(err) + repr(err) + " ".join(r for _, r in err.errors)
    assert "secret" not in text


def test_repr_does_not_show_the_prompt() -> None:
    req = ImageRequest("private words")
    assert "private" not in repr(req)
    assert "13 chars" in repr(req)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("k", True),
        ("a" * 255, True),
        ("order-17/line 3", True),
        ("a" * 256, False),
        ("", False),
        (" leading", False),
        ("trailing ", False),
        ("tab\there", False),
        ("new\nline", False),
        ("ünïcode", False),
        (17, False),
    ],
)
def test_idempotency_key_rules(key: object, ok: bool) -> None:
    assert (rules.check_idempotency_key(key) == []) is ok


@pytest.mark.parametrize(
    ("task_id", "ok"),
    [
        ("1", True),
        ("1234567890123", True),
        ("0", False),
        ("012", False),
        ("-1", False),
        ("1a", False),
        ("../1", False),
        ("", False),
        (12, False),
    ],
)
def test_task_id_rule(task_id: object, ok: bool) -> None:
    assert (rules.check_task_id(task_id) == []) is ok


@given(
    prompt=st.text(max_size=50),
    ratio=st.sampled_from([*RATIOS, "7:5", "auto ", ""]),
    res=st.sampled_from(["1k", "2k", "4k", "1K", "2K", "4K", "8k", ""]),
)
def test_image_request_accepts_exactly_the_valid_requests(
    prompt: str, ratio: str, res: str
) -> None:
    valid = (
        len(prompt) >= 1
        and not ecma_blank(prompt)
        and ratio in RATIOS
        and res.lower() in ("1k", "2k", "4k")
        and allowed(ratio, res)
    )
    try:
        ImageRequest(prompt, ratio, res)
    except RequestValidationError:
        assert not valid
    else:
        assert valid


def test_unchecked_skips_validation() -> None:
    req = ImageRequest.unchecked("", "7:5", "8K")
    assert (req.prompt, req.aspect_ratio, req.resolution) == ("", "7:5", "8K")


# Every ECMA-262 WhiteSpace and LineTerminator character, and characters Python calls
# whitespace (or not) where ECMA-262 disagrees.
BLANK = [
    "\t",
    "\v",
    "\f",
    " ",
    "\u00a0",
    "\ufeff",
    "\n",
    "\r",
    "\u2028",
    "\u2029",
    "\u1680",
    "\u2000",
    "\u2005",
    "\u200a",
    "\u202f",
    "\u205f",
    "\u3000",
    "\v\f\t\r\n \ufeff",
]
NOT_BLANK = ["\u001c", "\u001d", "\u001e", "\u001f", "\u0085", "\u180e", "\u200b", "\ufeffx\ufeff"]


@pytest.mark.parametrize(
    ("prompt", "ok"), [(c, False) for c in BLANK] + [(c, True) for c in NOT_BLANK]
)
def test_the_non_whitespace_rule_is_ecma_262s_backslash_s(prompt: str, ok: bool) -> None:
    """The contract's \\S is a JSON Schema pattern: ECMA-262 decides, not Python's str.isspace."""
    assert (rules.check_prompt(prompt) == []) is ok
    if ok:
        assert ImageRequest(prompt).prompt == prompt
    else:
        with pytest.raises(RequestValidationError) as info:
            ImageRequest(prompt)
        assert (info.value.field, info.value.code) == ("prompt", "invalid_prompt")
        assert "non-whitespace" in info.value.rule


@pytest.mark.slow
def test_whitespace_is_exactly_ecma_262s_for_every_code_point() -> None:
    pattern = re.compile(rules.NON_BLANK_PATTERN)
    blank = {chr(c) for c in range(sys.maxunicode + 1) if not pattern.match(chr(c))}
    assert blank == ECMA_SPACE


@pytest.mark.parametrize("prompt", ["\ud800", "a cat \udfff", "\udc00\ud83d", "x" * 100 + "\ud83d"])
def test_text_with_surrogate_code_points_is_refused(prompt: str) -> None:
    assert [v.code for v in rules.check_prompt(prompt)] == ["invalid_prompt"]
    with pytest.raises(RequestValidationError) as info:
        ImageRequest(prompt)
    assert "surrogate" in info.value.rule
    assert "x" * 50 not in str(info.value)  # never echoed
    assert ImageRequest("a fox \U0001f98a").prompt  # characters beyond the BMP are fine


@given(
    st.one_of(
        st.text(max_size=8),
        st.text(alphabet=st.characters(max_codepoint=127)),
        st.sampled_from(["a\n", " a", "a ", "a b", "~", "\x7f", "a" * 255, "a" * 256]),
    )
)
def test_the_idempotency_key_pattern_states_the_rule(key: str) -> None:
    """The OpenAPI document's pattern says what the rule says, read as ECMA-262 reads it (where
    ``$`` is the end of the text; Python's ``$`` also matches before a final newline)."""
    ecma = rules.IDEMPOTENCY_KEY_PATTERN.replace("$", r"\Z")
    by_pattern = 1 <= len(key) <= 255 and re.search(ecma, key) is not None
    assert by_pattern is (rules.check_idempotency_key(key) == [])


def test_task_ids_are_digits_without_a_leading_zero_and_at_most_64_of_them() -> None:
    from imggw_client._core.rules import TASK_ID_MAX_DIGITS, check_task_id

    assert check_task_id("1") == []
    assert check_task_id("9" * TASK_ID_MAX_DIGITS) == []
    for bad in ("0", "0123", "", "12a", " 1", "1" * (TASK_ID_MAX_DIGITS + 1), "1" * 5000):
        (violation,) = check_task_id(bad)
        assert violation.field == "task_id"
        assert violation.code == "invalid_task_id"
