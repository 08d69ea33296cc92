"""Wire facts live in two modules only, and the tables there say what the code does.

The rule: no module under ``src/`` other than ``imggw_client/_core/spec.py`` and
``imggw_client/_core/reasons.py`` contains a string literal (docstrings and the fixed parts of
f-strings included) equal to a wire fact: a path of either surface or of the reference
gateway's own routes (or any literal starting with a surface's path prefix), a model, a header
name (either case), a field name specific to the wire, a wire state, or a reason code. The facts
are collected from ``spec`` and ``reasons`` themselves, so a fact added there is guarded at once.
Words that are wire facts and also the project's own words with another meaning are listed in
``SHARED_WORDS`` and checked nowhere; a literal that is a fact in one place only for a stated
reason is listed in ``ALLOWED``, each with that reason.

The rest checks the data against the code that derives from it: every reason, written by the
gateway codec and read back by the client codec, is classified for retry as its row says; every
state the gateway writes reads back as the status it was written for.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from imggw_client import TaskStatus
from imggw_client._core import attempts, reasons, spec, surfaces
from imggw_client._core.wire import Reply
from imggw_client.mock import _serving as serving

SRC = Path(__file__).resolve().parents[2] / "src"
HOMES = {"imggw_client/_core/spec.py", "imggw_client/_core/reasons.py"}

# Wire facts that are also plain words of the project with another meaning: ImageRequest's
# fields and the rules' field names (model, prompt, resolution, aspect_ratio, n, size), the
# CLI's and the manifest's JSON fields and the ledger's columns (id, task_id, status, state,
# progress, result, cost, error, code, message, data, input, url, urls, images, expires_at),
# and the values of TaskStatus, which B's states share (pending, failed).
SHARED_WORDS = frozenset(
    {
        "model",
        "prompt",
        "resolution",
        "aspect_ratio",
        "n",
        "size",
        "input",
        "id",
        "task_id",
        "status",
        "state",
        "progress",
        "result",
        "cost",
        "error",
        "code",
        "message",
        "data",
        "url",
        "urls",
        "images",
        "expires_at",
        "pending",
        "failed",
    }
)

# (file under src/, literal): why it may stand there.
ALLOWED: dict[tuple[str, str], str] = {
    (
        "imggw_client/_core/surfaces.py",
        "cancelled",
    ): "the SDK's own TaskError code for a cancelled task (DESIGN 8), not the wire state",
    (
        "imggw_client/mock/_gateway.py",
        "rate_limited",
    ): "the /_mock/stats counter of requests refused by a limit: a field of the stats JSON",
    (
        "imggw_client/_journal/schema.py",
        "submitted",
    ): "a ledger state's name in ledgers written before the states were renamed (it was beta's "
    "wire word, with another meaning): read only to move those rows to the new name",
    (
        "imggw_client/tracking/_store.py",
        "not_found",
    ): "the error code ledgers and manifests have always kept for an item whose task the "
    "gateway does not know (the wire says task_not_found): a pinned manifest value",
    (
        "imggw_client/_core/states.py",
        "not_found",
    ): "the journal's state (and event) of a task the gateway no longer knows, the same word "
    "as the manifests' error code above (DESIGN 22 pins State.NOT_FOUND)",
    (
        "imggw_cli/_journal.py",
        "not_found",
    ): "the --json event of a collect's task in the journal's not_found state, named as that state",
    (
        "imggw_cli/_output.py",
        "submitted",
    ): "the CLI's progress label before the first query; imggw_cli/ is reworked separately",
}


def wire_facts() -> dict[str, str]:
    """Every wire fact spelled in ``spec`` and ``reasons``, with its kind."""
    facts: dict[str, str] = {}

    def add(kind: str, *values: object) -> None:
        for value in values:
            if isinstance(value, str) and value not in SHARED_WORDS:
                facts.setdefault(value, kind)

    for wire in spec.SPECS.values():
        add("path", wire.prefix, wire.submit_path, wire.query_path)
        add("model", wire.model)
        for path in wire.request.values():
            add("field", path, *path.split("."))
        add("field", wire.task_id_param[1], wire.submit_answer.task_id)
        if wire.submit_answer.status is not None:
            add("field", wire.submit_answer.status[0])
            add("state", wire.submit_answer.status[1])
        for part in (wire.record, wire.envelope):
            add("field", *(getattr(part, f.name) for f in dataclasses.fields(part)))
        add("state", *wire.states, *wire.written.values(), *wire.quirk_states.values())
    add(
        "path",
        spec.RESULTS_PREFIX,
        spec.OPENAPI_PATH,
        spec.CONTROL_PREFIX,
        spec.STATS_PATH,
        spec.RESET_PATH,
        spec.ADVANCE_PATH,
    )
    headers = (
        spec.IDEMPOTENCY_HEADER,
        spec.REPLAYED_HEADER,
        spec.AUTHORIZATION_HEADER,
        spec.RETRY_AFTER_HEADER,
    )
    add("header", *headers, *(h.lower() for h in headers))
    add(
        "field",
        spec.RESULT_URLS,
        *spec.RESULT_URL_KEYS,
        spec.RESULT_IMAGES,
        spec.IMAGE_URL,
        spec.IMAGE_EXPIRES_AT,
        spec.LINK_EXPIRES,
        spec.LINK_SIGNATURE,
    )
    add("reason", *reasons.BY_CODE)
    return facts


def spelled_facts() -> list[str]:
    facts = wire_facts()
    prefixes = tuple(wire.prefix + "/" for wire in spec.SPECS.values())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name in HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            kind = facts.get(text) or ("path" if text.startswith(prefixes) else None)
            if kind is not None and (name, text) not in ALLOWED:
                found.append(f"src/{name}:{node.lineno}: {kind} {text!r}")
    return found


def test_the_facts_are_collected() -> None:
    facts = wire_facts()
    for fact in (
        "/beta/v1/tasks/{id}",
        "taskId",
        "resultJson",
        "creditsConsumed",
        "failCode",
        "failMsg",
        "credits_cost",
        "resultUrls",
        "waiting",
        "generating",
        "success",
        "fail",
        "processing",
        "completed",
        "queuing",
        "in_progress",
        "submitted",
        "idempotency_key_reused",
        "insufficient_credits",
        "Idempotency-Key",
    ):
        assert fact in facts, fact


@pytest.mark.slow
def test_no_module_outside_the_spec_spells_a_wire_fact() -> None:
    found = spelled_facts()
    assert not found, (
        "wire facts spelled outside _core/spec.py and _core/reasons.py:\n" + "\n".join(found)
    )


def test_every_allowance_says_why() -> None:
    assert all(why.strip() for why in ALLOWED.values())
    facts = wire_facts()
    for _, literal in ALLOWED:
        assert literal in facts, f"{literal!r} is no wire fact: the allowance is not needed"


# ---------------------------------------------------------------------------- the tables


@pytest.mark.parametrize("reason", reasons.REASONS, ids=lambda r: r.code)
@pytest.mark.parametrize("surface", list(spec.SPECS))
def test_each_reason_reads_back_and_is_retried_as_its_row_says(
    surface: spec.Surface, reason: reasons.Reason
) -> None:
    status, body = serving.error_body(surface, serving.refuse(reason))
    err = surfaces.read_error(surface, Reply(status, {}, body), now=0.0)
    assert err is not None
    assert err.status_code == reason.status
    # An envelope without a string reason (A) carries the reasons that lead its message; the
    # others are known by the table's own message (DESIGN 18): one code on both surfaces.
    assert err.code == reason.code
    verdict = attempts.classify(err)
    assert (verdict.retry, verdict.unknown) == (reason.retry.retried, reason.retry.unknown)


def test_the_reasons_that_decide_can_be_carried_by_every_envelope() -> None:
    deciding = [r for r in reasons.REASONS if r.decides]
    assert deciding
    for wire in spec.SPECS.values():
        if isinstance(wire.envelope, spec.MessageEnvelope):
            assert all(r.code.startswith(wire.envelope.leading_reasons) for r in deciding)


def test_the_reason_table_is_the_documentation() -> None:
    assert len(reasons.BY_CODE) == len(reasons.REASONS)
    assert reasons.__doc__ is not None
    for reason in reasons.REASONS:
        assert f"``{reason.code}``" in reasons.__doc__


@pytest.mark.parametrize("surface", list(spec.SPECS))
def test_every_state_is_a_task_status_and_written_states_read_back(surface: spec.Surface) -> None:
    wire = spec.of(surface)
    assert {TaskStatus(status) for status in wire.states.values()} == set(TaskStatus)
    assert set(wire.written) == {status.value for status in TaskStatus}
    for status, state in [*wire.written.items(), *wire.quirk_states.items()]:
        assert surfaces.task_status(surface, state) is TaskStatus(status)
    for state in spec.CANCELLED_STATES:
        assert surfaces.task_status(surface, state) is TaskStatus.FAILED


@pytest.mark.parametrize("surface", list(spec.SPECS))
def test_paths_belong_to_their_surface(surface: spec.Surface) -> None:
    wire = spec.of(surface)
    assert wire.prefix == "/" + surface
    for path in (wire.submit_path, wire.query_path):
        assert path.startswith(wire.prefix + "/")
        assert serving.surface_of(path) == surface
    where, name = wire.task_id_param
    assert ("{" + name + "}" in wire.query_path) is (where == "path")
