"""The commands a message names to go on: a wait resumed, a paid result saved, a submit sent
again with its key, the journal collected, a batch run again. Each carries what the next run
needs of what this one was given (the folder, the surface, a base URL typed on the command
line), quoted for a shell, so that it runs as pasted.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ._globals import DEFAULT_SURFACE, Globals, SurfaceChoice

SURFACES = [choice.value for choice in SurfaceChoice]


def quoted(*words: str | Path) -> str:
    """``words`` as one shell line, each quoted where a shell would split or expand it."""
    return " ".join(shlex.quote(str(word)) for word in words)


def _gateway(options: Globals) -> list[str]:
    """``--base-url URL`` when it was typed: the next command is typed anew, while one from
    IMGGW_BASE_URL is in its environment again."""
    if options.base_url and options.typed("base_url"):
        return ["--base-url", options.base_url]
    return []


def wait_command(task_id: str, surface: str, output: Path | None, options: Globals) -> str:
    """What picks a task up: one that also saves its results when the command was to save them
    (``poll`` only waits), so that nothing is submitted, or paid, again."""
    if output is not None:
        words = ["download", task_id, "--wait", "--surface", surface, "-o", str(output)]
    else:
        words = ["poll", task_id, "--surface", surface]
    return quoted("imggw", *words, *_gateway(options))


def save_command(task_id: str, surface: str, output: Path | None, options: Globals) -> str:
    """What saves a finished task's results; ``output`` None: ``-o DIR``, a folder for the user
    to choose."""
    folder = "DIR" if output is None else shlex.quote(str(output))
    head = quoted("imggw", "download", task_id, "--surface", surface, "-o")
    return " ".join([head, folder, *map(shlex.quote, _gateway(options))])


def resend_command(
    command: str,
    surface: str,
    request: tuple[str, str],
    key: str,
    output: Path | None,
    options: Globals,
) -> str:
    """A submit (of ``submit`` or ``generate``) sent again with its key: the gateway replays
    the task it may have made instead of billing a second one. The prompt is never repeated."""
    aspect_ratio, resolution = request
    folder = ["-o", str(output)] if output is not None else []
    words = [
        "--surface",
        surface,
        "--aspect-ratio",
        aspect_ratio,
        "--resolution",
        resolution,
        "--idempotency-key",
        key,
        *folder,
        *_gateway(options),
    ]
    return f"imggw {shlex.quote(command)} PROMPT {quoted(*words)}"


def collect_command(output: Path, options: Globals) -> str:
    """``imggw tasks collect`` into the same folder, waiting for what still runs."""
    return quoted("imggw", "tasks", "collect", "-o", str(output), "--wait", *_gateway(options))


def batch_command(dest: str) -> str:
    """A batch run again on its folder: on the input its run.json records (FILE when it
    records none: standard input, or a folder made before runs kept it), with the file name
    template it records (a rerun with another is refused) and on the surface it was made on
    (another is refused)."""
    recorded = recorded_run(dest)
    surface, name = recorded.get("surface"), recorded.get("name")
    chosen = [] if surface is None or surface == DEFAULT_SURFACE else ["--surface", surface]
    if name is not None and name != DEFAULT_NAME:
        chosen += ["--name", name]
    source = recorded.get("input")
    return f"imggw batch {quoted(source) if source else 'FILE'} {quoted('-o', dest, *chosen)}"


DEFAULT_NAME = "{task_id}-{index}"  # a batch's file names when no --name is given
RECORDED_TEXT = 4096  # the longest recorded template or input path taken


def recorded_run(dest: str) -> dict[str, str]:
    """What a batch folder's run.json records that a rerun goes by (docs/batches.md): its
    ``surface``, its file name template (``name``) and its input's path (``input``), each only
    when it is there and of its form; empty when the file is missing or cannot be read.
    Whoever can write the folder chose these: a surface must be one, the rest is text of a
    bounded length (a template is checked again as --name is; a path is quoted)."""
    import json

    from imggw_client.batch import StorageError, open_storage

    try:
        raw = json.loads(open_storage(dest).read("run.json") or b"{}")
    except (StorageError, ValueError, OSError):  # the command is named without it
        return {}
    if not isinstance(raw, dict):
        return {}
    found: dict[str, str] = {}
    if raw.get("surface") in SURFACES:
        found["surface"] = raw["surface"]
    for field in ("name", "input"):
        value = raw.get(field)
        if isinstance(value, str) and 0 < len(value) <= RECORDED_TEXT and "\0" not in value:
            found[field] = value
    return found


def merge_command(dest: str) -> str:
    """``imggw batch merge`` of a sharded run's folder."""
    return quoted("imggw", "batch", "merge", dest)
