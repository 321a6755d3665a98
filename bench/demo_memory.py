"""Peak memory of `draftsync demo` across all its processes (the CLI, Prefect's API, the servers: vLLM's API
server, engine core and worker processes when it serves with vLLM).

Samples the process tree every 0.2 s and sums PSS (proportional set size, so shared pages are not
counted twice) and RSS. Prints JSON with the engine the demo served with (from its demo.json).
Usage: python bench/demo_memory.py [--workdir DIR] [--engine auto|vllm|reference]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(pss bytes, rss bytes, process count) of root and its descendants right now."""
    pss = rss = count = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
        count += 1
    return pss, rss, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".draftsync-bench")
    parser.add_argument("--engine", default="auto", choices=("auto", "vllm", "reference"))
    args = parser.parse_args()
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "draftsync.cli", "--workdir", args.workdir, "demo", "--engine", args.engine],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = psutil.Process(child.pid)
    peak_pss = peak_rss = peak_procs = 0
    while child.poll() is None:
        try:
            pss, rss, count = tree_memory(root)
        except psutil.NoSuchProcess:
            break
        peak_pss, peak_rss, peak_procs = max(peak_pss, pss), max(peak_rss, rss), max(peak_procs, count)
        time.sleep(0.2)
    summary = Path(args.workdir) / "demo.json"
    print(
        json.dumps(
            {
                "command": f"draftsync demo --engine {args.engine}",
                "engine": json.loads(summary.read_text()).get("engine") if summary.exists() else None,
                "exit_code": child.returncode,
                "wall_s": round(time.perf_counter() - started, 1),
                "peak_pss_mb": round(peak_pss / 2**20),
                "peak_rss_sum_mb": round(peak_rss / 2**20),
                "peak_processes": peak_procs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
