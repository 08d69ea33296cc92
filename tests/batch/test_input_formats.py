"""Input read as what it is (DESIGN 18, "Input"): CSV with a header row and RFC 4180 quoting,
a text file that looks like CSV refused before anything is sent, ``#hashtag`` lines submitted
as prompts and comment lines counted. Over loopback against the reference gateway, through the
command line where it is the user's way in; what the gateway receives is read off its wire."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imggw_client import PollPolicy, RetryPolicy
from imggw_client._core import spec
from imggw_client.batch import BatchInputError, BatchReport, plan_batch, run_batch
from imggw_client.mock import MockGateway, MockRequest, MockResponse
from imggw_client.mock import _serving as serving

from ..cli.helpers import CANARY, imggw, imggw_batch

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}

# A header, then quoted fields: an embedded comma, an embedded line break, doubled quotes; a
# blank row and a spreadsheet's row of empty cells between them; an empty cell (its column's
# default); columns in any order and any case; a row on the other surface.
CSV = (
    "Prompt,aspect_ratio,resolution,surface,id\r\n"
    '"a fox, in snow",16:9,2k,,fox\r\n'
    '"a poster that reads\r\n""OPEN LATE""",1:1,,,\r\n'
    "\r\n"
    ",,,,\r\n"
    "plain lighthouse, 3:2 ,4K,alpha,7\r\n"
)
SENT = [  # (surface, prompt, aspect_ratio, resolution) as the gateway receives them
    ("beta", "a fox, in snow", "16:9", "2k"),
    ("beta", 'a poster that reads\r\n"OPEN LATE"', "1:1", "1k"),
    ("alpha", "plain lighthouse", "3:2", "4K"),
]


pytestmark = pytest.mark.gateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.08)


class Wire:
    """Every submit the gateway receives: its surface and the request in its body."""

    def __init__(self, gw: MockGateway) -> None:
        self.submits: list[tuple[str, str, str, str]] = []
        self.requests = 0
        handle = gw.handle

        def spy(request: MockRequest) -> MockResponse:
            self.requests += 1
            if request.method == "POST":
                surface = serving.surface_of(request.path)
                body = json.loads(request.body)
                wire = spec.of(surface).request
                self.submits.append(
                    (
                        surface,
                        *(
                            _at(body, wire[part])
                            for part in ("prompt", "aspect_ratio", "resolution")
                        ),
                    )
                )
            return handle(request)

        gw.handle = spy  # type: ignore[method-assign]


def _at(body: dict[str, Any], dotted: str) -> str:
    value: Any = body
    for part in dotted.split("."):
        value = value[part]
    return str(value)


@pytest.fixture
def wire(gateway: MockGateway) -> Wire:
    return Wire(gateway)


def batch(gw: MockGateway, source: Any, out: Path, **kw: Any) -> BatchReport:
    return run_batch(source, out, client_factory=lambda: gw.async_client(**FAST), **kw)


def manifest(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def events(stderr: str, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [record for record in found if record.get("event") == name]


# ---------------------------------------------------------------------------- 3: CSV


@pytest.mark.slow
def test_a_csv_file_runs_its_rows_and_the_gateway_receives_exactly_them(
    wire: Wire, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.csv"
    source.write_bytes(CSV.encode())
    out = tmp_path / "out"
    dry = imggw("batch", str(source), "-o", str(out), "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert (dry.records()[0]["total"], dry.records()[0]["to_submit"]) == (3, 3)
    run = imggw_batch(source, out, gateway_url, "--json")
    assert run.code == 0, run.err
    assert sorted(wire.submits) == sorted(SENT)  # the header is not a prompt; nothing else
    rows = run.records()
    assert [(r["line"], r["id"], r["status"]) for r in rows] == [
        (2, "fox", "succeeded"),
        (3, None, "succeeded"),
        (7, "7", "succeeded"),
    ]  # each record's first line
    assert rows[1]["prompt"] == 'a poster that reads\r\n"OPEN LATE"'


def test_a_tsv_file_and_format_csv_on_any_name_read_the_same_rows(
    gateway: MockGateway, wire: Wire, tmp_path: Path
) -> None:
    tsv = tmp_path / "prompts.tsv"
    tsv.write_text('prompt\taspect_ratio\n"a fox, in snow"\t16:9\nsunset, with a comma\t\n')
    named = tmp_path / "prompts.txt"
    named.write_text('prompt,aspect_ratio\n"a fox, in snow",16:9\n"sunset, with a comma",\n')
    for source, options in ((tsv, {}), (named, {"format": "csv"})):
        report = batch(gateway, source, tmp_path / f"out-{source.suffix[1:]}", **options)
        assert report.counts == {"saved": 2}
    assert sorted(wire.submits) == sorted(
        2
        * [("beta", "a fox, in snow", "16:9", "1k"), ("beta", "sunset, with a comma", "auto", "1k")]
    )


def test_a_csv_rerun_resumes_and_submits_nothing_twice(
    gateway: MockGateway, wire: Wire, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.csv"
    source.write_bytes(CSV.encode())
    out = tmp_path / "out"
    assert batch(gateway, source, out, timeout=0).counts == {"pending": 3}  # keys written, not sent
    assert wire.submits == []
    assert batch(gateway, source, out).counts == {"saved": 3}
    assert len(wire.submits) == 3
    # The same rows, the columns in another order and spaced by more blank rows: the same
    # lines (known by id, else by their place among the records), the same requests.
    moved = (
        "id,surface,resolution,aspect_ratio,prompt\n\n"
        'fox,,2k,16:9,"a fox, in snow"\n'
        ',,,1:1,"a poster that reads\r\n""OPEN LATE"""\n\n'
        "7,alpha,4K, 3:2 ,plain lighthouse\n"
    )
    source.write_bytes(moved.encode())
    again = batch(gateway, source, out)
    assert (again.counts, again.changed_count) == ({"saved": 3}, 0)
    assert len(wire.submits) == 3  # no second submit
    assert gateway.stats()["tasks_created"] == 3


@pytest.mark.slow
def test_a_bad_row_is_a_bad_line_and_a_bad_header_stops_the_input_whole(
    wire: Wire, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.csv"
    source.write_text(
        'prompt,aspect_ratio,resolution\na cat,1:1,1k\n"a dog",16:9\n'
        'an owl,1:1,1k,extra\n"a fish"x,1:1,1k\na fox,1:1,1k\n'
    )
    out = tmp_path / "out"
    refused = imggw_batch(source, out, gateway_url)
    assert refused.code == 2
    assert "line 3: 2 fields where the header row names 3: column 3 (resolution) missing" in (
        refused.err
    )
    assert "line 4: 4 fields where the header row names 3: column 4 is not in the header row" in (
        refused.err
    )
    assert "line 5: not a CSV row" in refused.err
    assert wire.requests == 0
    skipped = imggw_batch(
        source,
        out,
        gateway_url,
        "--skip-bad-lines",
        "--json",
    )
    assert skipped.code == 1  # as for JSONL: the bad lines are reported, the rest run
    assert sorted(p for _, p, _, _ in wire.submits) == ["a cat", "a fox"]
    assert [(r["line"], r["status"]) for r in skipped.records()] == [
        (2, "succeeded"),
        (3, "failed"),
        (4, "failed"),
        (5, "failed"),
        (6, "succeeded"),
    ]

    source.write_text("prompt,style\na cat,noir\n")
    header = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "h"),
        "--base-url",
        gateway_url,
        "--skip-bad-lines",
    )
    assert header.code == 2  # no row of it can be read: skipping lines cannot help
    assert "line 1: the header row names an unknown column 'style' (column 2)" in header.err
    assert len(wire.submits) == 2


@pytest.mark.parametrize(
    "text",
    [
        "prompt,aspect_ratio,resolution\na fox,16:9,2k\na cat,1:1,1k\n",  # a header row
        '"PROMPT"\na fox\n',  # a header of one column, quoted
        "a fox,16:9,2k\n# a note\na cat,1:1,1k\n",  # a table without its header row
        "a fox\t16:9\na cat\t1:1\n",  # one tab on every line
    ],
)
@pytest.mark.slow
def test_a_text_file_that_looks_like_csv_is_refused_before_anything_is_sent(
    wire: Wire, gateway_url: str, tmp_path: Path, text: str
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text(text)
    out = tmp_path / "out"
    refused = imggw_batch(source, out, gateway_url)
    assert refused.code == 2
    assert refused.err.count("\n") == 1
    assert "--format csv" in refused.err
    assert "nothing was sent" in refused.err
    dry = imggw("batch", str(source), "-o", str(out), "--dry-run")
    assert dry.code == 2
    assert "--format csv" in dry.err
    piped = imggw("batch", "-", "-o", str(out), "--base-url", gateway_url, stdin=text)
    assert piped.code == 2
    assert "--format csv" in piped.err
    assert wire.requests == 0
    assert not out.exists()  # refused before the folder was made
    told = imggw_batch(source, out, gateway_url, "--format", "text")
    assert told.code == 0, told.err  # said outright: every line is a prompt
    assert len(wire.submits) == len([x for x in text.splitlines() if not x.startswith("# ")])


def test_text_with_commas_here_and_there_is_still_prompts(
    gateway: MockGateway, wire: Wire, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("a fox, in snow\na cat\nan owl, at dusk, in fog\n")
    assert batch(gateway, source, tmp_path / "out").counts == {"saved": 3}
    assert len(wire.submits) == 3


# DESIGN 23: commas alone make no table; only a header row of our columns or a column of
# request fields on every line does.
COMMA_PROMPTS = {
    "one comma a line": ["a cat, watercolor", "a dog, oil on canvas", "an owl, at dusk"],
    "several commas a line": [
        "a cat, watercolor, soft light",
        "a dog, oil, 35mm, grain",
        "an owl, at dusk, in fog, wide",
    ],
    "a mix": [
        "a cat, watercolor",
        "a fox in snow",
        "a dog, oil, 35mm",
        '"Hello," said the fox, smiling',
        "an owl, 4k detail, in fog",
    ],
}


@pytest.mark.parametrize("prompts", COMMA_PROMPTS.values(), ids=COMMA_PROMPTS.keys())
def test_prompts_with_commas_are_sent_as_prompts(
    gateway: MockGateway, wire: Wire, tmp_path: Path, prompts: list[str]
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("".join(f"{p}\n" for p in prompts))
    assert plan_batch(source, tmp_path / "plan").total == len(prompts)
    assert batch(gateway, source, tmp_path / "out").counts == {"saved": len(prompts)}
    assert sorted(wire.submits) == sorted(("beta", p, "auto", "1k") for p in prompts)
    assert [r["prompt"] for r in manifest(tmp_path / "out")] == prompts


@pytest.mark.slow
def test_prompts_with_commas_on_standard_input_are_sent_as_prompts(
    wire: Wire, gateway_url: str, tmp_path: Path
) -> None:
    prompts = COMMA_PROMPTS["one comma a line"]
    run = imggw(
        "batch",
        "-",
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        gateway_url,
        "--json",
        stdin="".join(f"{p}\n" for p in prompts),
    )
    assert run.code == 0, run.err
    assert sorted(p for _, p, _, _ in wire.submits) == sorted(prompts)


TABLE_HINT = (
    "each line would be billed as literal text. To read it as CSV, add a first row naming its "
    "columns (prompt, aspect_ratio, resolution, surface, id) and pass --format csv "
    "(format='csv'); --format text sends every line as a prompt; nothing was sent"
)


@pytest.mark.parametrize(
    ("text", "separator", "first"),
    [
        ("a cat,1:1,1k\na dog,16:9,2k\n", "commas", "line 1: '1:1', an aspect ratio"),
        ("# cats\na cat, 1k\na dog , 4K\n", "commas", "line 2: '1k', a resolution"),
        ('"a cat, watercolor",3:2\n"a dog",beta\n', "commas", "line 1: '3:2', an aspect ratio"),
        ("a cat\talpha\na dog\tbeta\n", "tabs", "line 1: 'alpha', a surface"),
    ],
    ids=["ratio-and-resolution", "resolutions", "quoted", "tabs"],
)
def test_a_table_without_its_header_is_refused_saying_what_to_do(
    wire: Wire, tmp_path: Path, text: str, separator: str, first: str
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text(text)
    with pytest.raises(BatchInputError) as refused:
        plan_batch(source, tmp_path / "out")
    assert refused.value.message == (
        f"{source} is read as text, a prompt a line, but column 2 of every line (split at "
        f"{separator}) holds a request field, as a CSV table's rows do ({first}): {TABLE_HINT}"
    )
    assert wire.requests == 0
    assert not (tmp_path / "out").exists()


def test_a_header_line_is_refused_saying_what_to_do(wire: Wire, tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("prompt,aspect_ratio\na cat, watercolor\na dog, oil\n")
    with pytest.raises(BatchInputError) as refused:
        plan_batch(source, tmp_path / "out")
    assert refused.value.message == (
        f"{source} is read as text, a prompt a line, but its line 1 ('prompt,aspect_ratio') is "
        "the header row of a CSV table: every line would be billed as literal text, that one "
        "too. Pass --format csv (format='csv') or name it .csv; --format text sends every line "
        "as a prompt; nothing was sent"
    )
    assert wire.requests == 0


# ---------------------------------------------------------------------------- 17: comments


HASHTAGS = "# a note\n#hashtag sunset\n#\n#1 bestseller book cover\n  #\tindented note\na fox\n"


@pytest.mark.slow
def test_hashtag_lines_are_prompts_and_comment_lines_are_counted(
    wire: Wire, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text(HASHTAGS)
    out = tmp_path / "out"
    dry = imggw("batch", str(source), "-o", str(out), "--dry-run", "--json")
    assert dry.code == 0, dry.err
    plan = dry.records()[0]
    assert (plan["total"], plan["to_submit"], plan["comments"]) == (3, 3, 3)
    human = imggw("batch", str(source), "-o", str(out), "--dry-run")
    assert "comment lines (skipped): 3" in human.out

    run = imggw(
        "--log-format",
        "json",
        "batch",
        str(source),
        "-o",
        str(out),
        "--base-url",
        gateway_url,
        "--json",
    )
    assert run.code == 0, run.err
    assert sorted(p for _, p, _, _ in wire.submits) == [
        "#1 bestseller book cover",
        "#hashtag sunset",
        "a fox",
    ]
    assert [r["line"] for r in run.records()] == [2, 4, 6]
    (summary,) = events(run.err, "batch_summary")
    assert (summary["total"], summary["comments"]) == (3, 3)


@pytest.mark.slow
def test_the_summary_table_counts_comment_lines(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text(HASHTAGS)
    run = imggw("batch", str(source), "-o", str(tmp_path / "out"), "--base-url", gateway_url)
    assert run.code == 0, run.err
    assert "comment lines (skipped)" in run.err
    assert run.err.split("comment lines (skipped)")[1].split()[1] == "3"


def test_comments_are_counted_in_the_report_and_the_plan(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.json"  # read line by line: records and prompts
    source.write_text('# records\n{"prompt": "a cat", "id": "c"}\n#nofilter cat\n#\n')
    assert plan_batch(source, tmp_path / "out").comments == 2
    report = batch(gateway, source, tmp_path / "out")
    assert (report.counts, report.comments) == ({"saved": 2}, 2)
    assert [r["prompt"] for r in manifest(tmp_path / "out")] == ["a cat", "#nofilter cat"]


def test_a_jsonl_line_that_is_not_a_comment_says_how_one_is_written(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text('#---- cats\n{"prompt": "a cat"}\n')
    with pytest.raises(BatchInputError) as info:
        plan_batch(source, tmp_path / "out")
    assert "line 1: not a JSON object (a comment line begins with '# '" in info.value.message
