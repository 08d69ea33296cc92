"""Collect (issue 14): finished tasks whose links expire at staggered moments, too few download
slots to save them all in time, and what each download order loses.

Setup, in each run's own process: N tasks (10,000) are created through the in-process
reference gateway (``gateway.async_client()``, one after another, all of the same duration, so
they finish in the order of their ids) and left to finish. Then ``collect_tasks(ids.txt, out,
concurrency=C)`` collects them, through a thin transport around the gateway's
that gives each task's link its own expiry: a random permutation of moments spread over
``--span`` seconds, starting ``--lead`` seconds after the collect starts, so expiry order has
nothing to do with the order the tasks finished (the reference gateway signs every link for
the same ``link_ttl``, so it cannot stagger them by itself). Result links lose their signed
``Expires`` on the way (renamed, put back on the way in), so the only expiry the runner can
know is what the record states:

- earliest expiry first: each record states its task's ``expires_at``;
- finishing order (the baseline): the records state none, so the runner's queue falls back
  to the order in which it saw the tasks finished (all had finished: the input's order).

A link past its expiry answers 403 and a query hands out the same link again, so the runner's
one refresh fails too and the result is lost (``expired``). Every download that starts in time
holds its slot ``--latency`` seconds (the transport delays the bytes). The best possible
(given C slots of that duration from the moment the run's first download began) is earliest
deadline first over every task at once, skipping those already dead: with downloads of equal
length it saves the most. The runner keeps a bounded window of lines in flight (its
``MIN_IN_FLIGHT`` / ``IN_FLIGHT_PER_SLOT``), so the same model is also shown for
earliest-first within such a window, and for finishing order.

Beside them, in the same run: a batch that generates the same number of tasks (same slots,
latency and transport, links that do not expire), for CPU per task and peak RSS.

Run: python bench/collect.py [--tasks N] [--concurrency C] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEED = 7
TOLERANCE = 0.01  # of the tasks: what the model (equal downloads, no jitter) may be off by
DURATION = 0.05  # every task takes as long: they finish in the order they were created
MODES = {
    "known": "earliest expiry first",
    "unknown": "finishing order (baseline)",
    "generate": "batch, generate (same size)",
}


# ---------------------------------------------------------------------------- the schedule


def expiry_offsets(tasks: int, lead: float, span: float, seed: int = SEED) -> list[float]:
    """Seconds after the collect starts at which the link of the task on each input line (the
    i-th created) dies: evenly spread over ``span`` after ``lead``, in a random order."""
    ranks = list(range(tasks))
    random.Random(seed).shuffle(ranks)
    return [lead + span * rank / tasks for rank in ranks]


def simulate(
    deadlines: list[float], slots: int, hold: float, *, start: float, order: str, window: int
) -> int:
    """How many results a download order saves: ``slots`` slots, each download that starts
    before its line's deadline holds its slot ``hold`` seconds; one that would start too late
    fails at once. Lines enter a window of ``window`` lines in input order, one as another
    leaves; within it ``order`` is ``earliest`` (deadline) or ``finishing`` (input order)."""
    free = [start] * slots
    queue: list[tuple[float, int]] = []
    following = 0

    def admit() -> None:
        nonlocal following
        if following < len(deadlines):
            key = deadlines[following] if order == "earliest" else float(following)
            heapq.heappush(queue, (key, following))
            following += 1

    for _ in range(window):
        admit()
    saved = 0
    while queue:
        now = heapq.heappop(free)
        _, line = heapq.heappop(queue)
        if now < deadlines[line]:
            saved += 1
            now += hold
        heapq.heappush(free, now)
        admit()
    return saved


def runner_window(concurrency: int) -> tuple[int, str]:
    """The runner's window of lines in flight, from its own constants if they are still there."""
    try:
        from imggw_client.tracking import _loop

        low, per_slot = _loop.MIN_IN_FLIGHT, _loop.IN_FLIGHT_PER_SLOT
        source = "the tracker loop's MIN_IN_FLIGHT / IN_FLIGHT_PER_SLOT"
    except (ImportError, AttributeError):
        low, per_slot = 1024, 64
        source = "assumed 1024 / 64 per slot (the runner's constants moved)"
    return max(low, concurrency * per_slot), source


# ---------------------------------------------------------------------------- the run (child)


def _transport(gateway: Any, deadlines: dict[str, float], *, state: bool, latency: float) -> Any:
    """The gateway's in-process transport, with per-task link expiry: records of succeeded
    tasks carry their task's ``expires_at`` (``state``) or none, links carry no signed expiry;
    a result link past its task's expiry answers 403; a download in time is held ``latency``
    seconds. Unknown tasks (a generating batch's) never expire."""
    import anyio
    import httpx

    never = time.time() + 86_400.0

    class StaggeredLinks(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = gateway.transport()
            self.by_token: dict[str, float] = {}
            self.starts: list[float] = []  # when each download in time began
            self.refused = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            path = request.url.path
            if path.startswith("/results/"):
                return await self.result(request, path)
            response = await self.inner.handle_async_request(request)
            if request.method != "GET" or "/tasks/" not in path or response.status_code != 200:
                return response
            body = json.loads(response.content)
            data = body.get("data") or {}
            result = data.get("result")
            if not result:
                return response
            expires = deadlines.get(str(data.get("id")), never)
            for image in result.get("images", []):
                image.pop("expires_at", None)
                urls = []
                for url in image.get("url", []):
                    hidden = url.replace("?Expires=", "?e=")
                    self.by_token[hidden.split("/results/")[1].split(".png")[0]] = expires
                    urls.append(hidden)
                image["url"] = urls
                if state:
                    image["expires_at"] = expires
            return httpx.Response(200, json=body, request=request)

        async def result(self, request: httpx.Request, path: str) -> httpx.Response:
            token = path.removeprefix("/results/").removesuffix(".png")
            now = time.time()
            if now >= self.by_token.get(token, never):
                self.refused += 1
                return httpx.Response(403, text="forbidden: the link has expired", request=request)
            self.starts.append(now)
            await anyio.sleep(latency)
            params = dict(request.url.params)
            params["Expires"] = params.pop("e", "")
            signed = httpx.Request("GET", request.url.copy_with(params=params))
            answer = await self.inner.handle_async_request(signed)
            return httpx.Response(answer.status_code, headers=answer.headers,
                                  content=answer.content, request=request)  # fmt: skip

    return StaggeredLinks()


def child(mode: str, tasks: int, concurrency: int, latency: float, lead: float, span: float,
          work: Path) -> dict[str, Any]:  # fmt: skip
    import anyio
    import httpx

    from imggw_cli._batch_run import batch_display
    from imggw_cli._globals import Globals
    from imggw_cli._output import Output
    from imggw_client import AsyncClient, PollPolicy
    from imggw_client.batch import BatchProgress, collect_tasks, run_batch
    from imggw_client.mock import IN_PROCESS_URL, MockGateway

    gateway = MockGateway(duration_min=DURATION, duration_max=DURATION, seed=1)
    poll = PollPolicy(initial_interval=0.1, max_interval=0.3)
    work.mkdir(parents=True, exist_ok=True)
    source = work / "input.txt"
    if mode == "generate":
        source.write_text("".join(f"image {i}\n" for i in range(tasks)), encoding="utf-8")
    else:

        async def create() -> list[str]:
            async with gateway.async_client() as client:
                return [(await client.submit(f"image {i}")).task_id for i in range(tasks)]

        ids = anyio.run(create)
        source.write_text("".join(f"{task_id}\n" for task_id in ids), encoding="utf-8")
        time.sleep(DURATION + 0.2)  # every task finished, in the order of its id
    assert gateway.stats()["tasks_created"] == (0 if mode == "generate" else tasks)

    begin = time.time()
    deadlines: dict[str, float] = {}
    if mode != "generate":
        offsets = expiry_offsets(tasks, lead, span)
        deadlines = {task_id: begin + offset for task_id, offset in zip(ids, offsets, strict=True)}
    transport = _transport(gateway, deadlines, state=mode != "unknown", latency=latency)

    def make() -> AsyncClient:
        http = httpx.AsyncClient(transport=transport)
        return AsyncClient(api_key="test-key", base_url=IN_PROCESS_URL, http_client=http,
                           poll=poll)  # fmt: skip

    warned: list[float] = []
    most_waiting = [0]

    with batch_display(Output(Globals(quiet=False))) as show:

        def on_progress(progress: BatchProgress) -> None:
            show(progress)
            most_waiting[0] = max(most_waiting[0], progress.awaiting_download)
            if progress.at_risk and not warned:
                warned.append(progress.elapsed)

        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        started = time.perf_counter()
        driver = run_batch if mode == "generate" else collect_tasks
        report = driver(
            source,
            work / "out",
            concurrency=concurrency,
            client_factory=make,
            on_progress=on_progress,
        )
        seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu
    counts = report.counts
    saved = len(list((work / "out").glob("*.png")))
    assert saved == counts.get("saved", 0), (saved, counts)
    assert set(counts) <= {"saved", "expired"}, counts
    assert gateway.stats()["tasks_created"] == tasks  # a collect creates none
    starts = transport.starts
    return {
        "mode": mode,
        "tasks": tasks,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "saved": counts.get("saved", 0),
        "lost": counts.get("expired", 0),
        "first_download": (min(starts) - begin) if starts else None,
        "last_download": (max(starts) - begin) if starts else None,
        "refused": transport.refused,
        "warned_at": warned[0] if warned else None,
        "most_waiting": most_waiting[0],
    }


# ---------------------------------------------------------------------------- the parent


def run(tasks: int, concurrency: int, latency: float, lead: float, span: float) -> dict[str, Any]:
    window, window_source = runner_window(concurrency)
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as work:
            command = [sys.executable, __file__, "--child", mode, "--tasks", str(tasks),
                       "--concurrency", str(concurrency), "--latency", str(latency),
                       "--lead", str(lead), "--span", str(span),
                       "--work", str(Path(work) / "run")]  # fmt: skip
            log = Path(work) / "stderr.txt"  # the progress display, and any traceback
            with log.open("w") as stderr:
                done = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                      check=False)  # fmt: skip
            if done.returncode != 0:
                tail = log.read_text().splitlines()[-25:]
                raise SystemExit("\n".join([*tail, f"child failed (exit {done.returncode}): "
                                             f"{' '.join(command)}"]))  # fmt: skip
            runs[mode] = json.loads(done.stdout.splitlines()[-1])
    offsets = expiry_offsets(tasks, lead, span)
    for r in runs.values():
        r["cpu_ms_per_task"] = 1000 * r["cpu_seconds"] / tasks
        # What a slot really took per download (the delay, plus writing, syncing and the
        # event loop's turn): the pace the model then holds every order to.
        busy = (r["last_download"] or 0) - (r["first_download"] or 0)
        r["hold"] = max(latency, busy * concurrency / max(r["saved"] - concurrency, 1))
    for mode in ("known", "unknown"):
        r = runs[mode]
        start = r["first_download"] if r["first_download"] is not None else lead
        model = {}
        for name, order, size in (("best", "earliest", tasks), ("windowed", "earliest", window),
                                  ("finishing", "finishing", tasks)):  # fmt: skip
            model[name] = simulate(offsets, concurrency, r["hold"], start=start, order=order,
                                   window=size)  # fmt: skip
        r["model"] = model
    known, unknown, gen = runs["known"], runs["unknown"], runs["generate"]
    unavoidable = tasks - known["model"]["best"]
    targets = {
        "unavoidable_loss": unavoidable,
        "tolerance": TOLERANCE,
        "earliest_loses_only_unavoidable": known["lost"] <= unavoidable + TOLERANCE * tasks,
        "earliest_never_worse": known["lost"] <= unknown["lost"],
        "cpu_ratio": known["cpu_ms_per_task"] / gen["cpu_ms_per_task"],
        "rss_ratio": known["peak_rss_mib"] / gen["peak_rss_mib"],
    }
    return {"tasks": tasks, "concurrency": concurrency, "latency": latency, "lead": lead,
            "span": span, "window": window, "window_source": window_source, "runs": runs,
            "targets": targets}  # fmt: skip


def show(result: dict[str, Any]) -> None:
    tasks, c, hold = result["tasks"], result["concurrency"], result["latency"]
    lead, span, window = result["lead"], result["span"], result["window"]
    runs, t = result["runs"], result["targets"]
    print(f"collect: {tasks:,} finished tasks on the in-process gateway, -c {c} download slots, "
          f"each download held {1000 * hold:g} ms ({c / hold:.0f}/s at most: {tasks * hold / c:.0f}"
          f" s for all); link expiries spread over {lead:g}-{lead + span:g} s after the collect "
          f"starts, in a random order (seed {SEED}) unrelated to the order the tasks finished; "
          "a dead link answers 403 and its refresh gets the same link")  # fmt: skip
    print(f"  model (what each order saves with {c} slots, each download holding its slot as "
          "long as this run's did ('hold'), from its first download on): 'best' earliest expiry "
          f"first over all tasks; 'window' the same within {window:,} lines in flight "
          f"({result['window_source']}); 'finish.' finishing order")  # fmt: skip
    print(f"{'run':<30}{'wall s':>7}{'saved':>8}{'lost':>7}  {'best':>6}{'window':>8}"
          f"{'finish.':>8}  {'hold ms':>7}{'1st dl s':>9}{'CPU ms/task':>12}"
          f"{'peak RSS MiB':>13}")  # fmt: skip
    for mode, label in MODES.items():
        r = runs[mode]
        if mode == "generate":
            model = f"{'':>6}{'':>8}{'':>8}"
            lost = "-"
        else:
            m = r["model"]
            model = f"{m['best']:>6,}{m['windowed']:>8,}{m['finishing']:>8,}"
            lost = f"{r['lost']:,}"
        first = "-" if r["first_download"] is None else f"{r['first_download']:.2f}"
        print(f"{label:<30}{r['seconds']:>7.1f}{r['saved']:>8,}{lost:>7}  {model}  "
              f"{1000 * r['hold']:>7.1f}{first:>9}{r['cpu_ms_per_task']:>12.2f}"
              f"{r['peak_rss_mib']:>13.1f}")  # fmt: skip
    known, unknown = runs["known"], runs["unknown"]
    warned = known["warned_at"]
    print(f"  earliest-first: the display warned of results at risk "
          f"{'after ' + format(warned, '.1f') + ' s' if warned is not None else 'never'}; "
          f"at most {known['most_waiting']:,} results waited for a slot "
          f"(finishing order: {unknown['most_waiting']:,})")  # fmt: skip
    unavoidable = t["unavoidable_loss"]
    only = "met" if t["earliest_loses_only_unavoidable"] else "MISSED"
    never = "met" if t["earliest_never_worse"] else "MISSED"
    print(f"targets: earliest-first loses none the schedule allows (lost {known['lost']:,}, "
          f"unavoidable {unavoidable:,}, model tolerance {t['tolerance']:.0%} of the tasks): "
          f"{only}; never more than finishing order "
          f"({known['lost']:,} vs {unknown['lost']:,}): {never}")  # fmt: skip
    print(f"collect against a generating batch of the same size: CPU per task "
          f"{t['cpu_ratio']:.2f}x, peak RSS {t['rss_ratio']:.2f}x")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=None, help="tasks to collect [10000]")
    parser.add_argument("--concurrency", type=int, default=4, help="download slots [4]")
    parser.add_argument("--latency", type=float, default=0.02,
                        help="seconds each download holds its slot [0.02]")  # fmt: skip
    parser.add_argument("--lead", type=float, default=3.0,
                        help="seconds from the start to the first expiry [3]")  # fmt: skip
    parser.add_argument("--span", type=float, default=None,
                        help="seconds over which expiries spread [0.9 x the time to download "
                        "all at full speed]")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2,000 tasks")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tasks = args.tasks or (2000 if args.quick else 10_000)
    span = args.span if args.span is not None else 0.9 * tasks * args.latency / args.concurrency
    if args.child:
        print(json.dumps(child(args.child, tasks, args.concurrency, args.latency, args.lead,
                               span, Path(args.work))))  # fmt: skip
        return 0
    result = run(tasks, args.concurrency, args.latency, args.lead, span)
    if args.json:
        print(json.dumps(result))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
