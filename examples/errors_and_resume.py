"""Handle every outcome: a slow task is waited on again (never resubmitted), an unknown submit
outcome is retried with its key (never billed twice), failures are reported.

Needs IMGGW_API_KEY and IMGGW_BASE_URL.
Run: python examples/errors_and_resume.py "a lighthouse" --first-wait 1
"""

from __future__ import annotations

import argparse
import sys

from imggw_client import (
    AuthenticationError,
    Client,
    ImggwError,
    RequestValidationError,
    Task,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)


def generate(client: Client, prompt: str, first_wait: float) -> Task:
    try:
        sub = client.submit(prompt)
    except UnknownOutcomeError as err:
        # The gateway may have created the task: the same request, key and surface make this
        # retry safe (the gateway replays the task instead of billing a second one).
        print(f"outcome unknown; retrying with key {err.idempotency_key}", file=sys.stderr)
        sub = client.submit(err)
    print(f"submitted task {sub.task_id}", file=sys.stderr)
    try:
        return client.wait(sub, wait_timeout=first_wait)
    except WaitTimeoutError as err:
        # Not a failure: the task is still running. Wait on the same task (on its own
        # surface); never resubmit.
        seen = err.last_task.status.value if err.last_task else "unknown"
        print(f"still {seen} after {first_wait}s; waiting on task {err.task_id}", file=sys.stderr)
        return client.wait(err, wait_timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description="Error handling and resuming a wait.")
    parser.add_argument("prompt")
    parser.add_argument("--first-wait", type=float, default=5.0)
    args = parser.parse_args()
    try:
        with Client() as client:
            task = generate(client, args.prompt, args.first_wait)
    except RequestValidationError as err:
        print(f"fix the request: {err.field}: {err.rule}", file=sys.stderr)
        return 2
    except AuthenticationError:
        print("check IMGGW_API_KEY", file=sys.stderr)
        return 4
    except TaskFailedError as err:
        print(f"the task failed: {err.code}: {err.task.error.message if err.task.error else ''}",
              file=sys.stderr)  # fmt: skip
        return 1
    except ImggwError as err:
        print(f"gateway trouble: {err.message}", file=sys.stderr)
        return 5
    print(task.id, task.status.value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
