"""Runs one of the benchmark ASGI apps under uvicorn in its own process, so that the server
does not share the measuring process's interpreter lock. Prints the port, then serves."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import uvicorn

if __name__ == "__main__":
    app = sys.argv[1]
    with socket.socket() as probe:  # an ephemeral port, free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    print(port, flush=True)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="error", lifespan="off", access_log=False
    )
    uvicorn.Server(config).run()
