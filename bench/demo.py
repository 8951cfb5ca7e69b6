"""`make demo`: start a local cluster, run the main job against it, print a summary, stop it.

Run as ``python -m bench.demo [--dev-dir DIR] [--keep]``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from broker.devcluster import DevCluster, DevClusterSpec


def fencepost(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise SystemExit(f"fencepost {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dev-dir", default=".fencepost-demo", help="run directory of the demo cluster")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args(argv)

    dev = DevCluster(Path(args.dev_dir))
    if dev.running():
        dev.down()
    started = time.monotonic()
    dev.up(DevClusterSpec(cluster="demo", bookies=0, brokers=0), progress=print)
    try:
        print(f"cluster up in {time.monotonic() - started:.1f}s")
        print(fencepost("dev", "status", "--dev-dir", args.dev_dir))
        view = json.loads(fencepost("status", "--dev-dir", args.dev_dir, "--json"))
        print(f"cluster {view['cluster']} ({view['cluster_id']}): {len(view['bookies'])} bookies registered")
    finally:
        if not args.keep:
            dev.down()
            print("cluster stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
