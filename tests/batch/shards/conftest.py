"""Shared pieces of the scale-out tests: a Dask LocalCluster of 2 worker processes on
127.0.0.1 (dashboard off), a local S3 server (moto) on 127.0.0.1, and reading an output folder
back through fsspec to check every file's sha256 from storage. Nothing leaves the loopback."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imggw_client import PollPolicy, RetryPolicy

KEY = "sk-scale-out-key-0001"
# Workers read the key from their own environment (it never travels in a task); S3 clients on
# workers find these placeholder credentials there too (moto accepts any; no real ones exist).
WORKER_ENV = {
    "IMGGW_API_KEY": KEY,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
FAST = {
    "poll": PollPolicy(initial_interval=0.05, max_interval=0.2),
    "retry": RetryPolicy(max_attempts=6, initial_backoff=0.02, max_backoff=0.2),
}


def write_prompts(path: Path, count: int, *, tag: str = "image") -> Path:
    path.write_text(
        "".join(
            json.dumps({"prompt": f"{tag} {i}", "aspect_ratio": "3:2"}) + "\n" for i in range(count)
        )
    )
    return path


@pytest.fixture(scope="session")
def worker_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in WORKER_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def cluster(worker_env: None) -> Iterator[Any]:
    """A LocalCluster of 2 single-threaded worker processes, for the whole session; its HTTP
    endpoints on 127.0.0.1 at a free port (with dashboard_address=None the scheduler would still
    take port 8787 on every interface)."""
    import distributed  # the dev extra installs it: missing is a failure, not a skip

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address="127.0.0.1:0",
        host="127.0.0.1",
        silence_logs=logging.ERROR,
    ) as local:
        yield local


@pytest.fixture
def dask_client(cluster: Any) -> Iterator[Any]:
    """A client of the session's cluster, both workers up (one may have been killed)."""
    import distributed

    with distributed.Client(cluster.scheduler_address) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(scope="session")
def s3(worker_env: None) -> Iterator[dict[str, Any]]:
    """A local S3 server (moto) on 127.0.0.1 with a bucket; yields fsspec storage options."""
    import s3fs  # noqa: F401 - the dev extra installs it: missing is a failure, not a skip
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}"}
    import fsspec

    fsspec.filesystem("s3", skip_instance_cache=True, **options).mkdir("imggw-test")
    try:
        yield options
    finally:
        server.stop()


def check_from_storage(
    dest: str, options: dict[str, Any] | None, lines: int
) -> list[dict[str, Any]]:
    """The merged manifest has every line, in order, succeeded; every file it lists is in the
    output folder with that sha256, read back from storage."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(dest, **(options or {}))
    fs.invalidate_cache()
    records = [json.loads(line) for line in fs.cat_file(f"{root}/manifest.jsonl").splitlines()]
    assert [r["line"] for r in records] == list(range(1, lines + 1))
    assert len({r["task_id"] for r in records}) == lines
    for record in records:
        assert record["status"] == "succeeded", record
        (file,) = record["files"]
        content = fs.cat_file(f"{root}/{file['path']}")
        assert len(content) == file["size"]
        assert hashlib.sha256(content).hexdigest() == file["sha256"]
    return records


def local_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    return {**base, "IMGGW_API_KEY": KEY, "PYTHONUNBUFFERED": "1", **extra}
