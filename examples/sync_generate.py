"""Generate one image and save it, with the blocking client.

Needs IMGGW_API_KEY and IMGGW_BASE_URL (try `imggw mock serve` and its URL, key test-key).
Run: python examples/sync_generate.py "a lighthouse at dusk" --out out/
"""

from __future__ import annotations

import argparse

from imggw_client import Client


def main() -> None:
    parser = argparse.ArgumentParser(description="Generate one image.")
    parser.add_argument("prompt")
    parser.add_argument("--out", default="out")
    parser.add_argument("--surface", choices=["alpha", "beta"], default="beta")
    args = parser.parse_args()

    with Client(surface=args.surface) as client:
        task = client.generate(args.prompt, aspect_ratio="16:9", resolution="2k")
        print(f"task {task.id} succeeded; credits {task.credits}, cost {task.cost}")
        for saved in client.download(task, args.out):
            print(saved.path, saved.sha256)


if __name__ == "__main__":
    main()
