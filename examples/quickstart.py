"""Generate one image against the bundled reference gateway (in-process: no key, no network)
and save it as a PNG.

Run: python examples/quickstart.py ["a prompt"] [--out DIR]
"""

from __future__ import annotations

import argparse

from imggw_client import PollPolicy
from imggw_client.mock import MockGateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="a lighthouse at dusk")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    gateway = MockGateway(duration_min=0.5, duration_max=1.5, image_size=512)
    with gateway.client(poll=PollPolicy(initial_interval=0.2, max_interval=0.5)) as client:
        task = client.generate(
            args.prompt,
            aspect_ratio="16:9",
            on_update=lambda t: print(f"  {t.status.value:<9} {t.progress or 0:>3}%"),
        )
        for saved in client.download(task, args.out, overwrite=True):
            print(f"saved {saved.path} ({saved.size} bytes, sha256 {saved.sha256[:12]}...)")


if __name__ == "__main__":
    main()
