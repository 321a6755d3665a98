"""Peak memory of `draftsync demo` across all its processes (the CLI, Prefect's API, the servers: vLLM's API
server and engine core when it serves with vLLM).

Samples the process tree every 0.2 s and sums PSS (proportional set size, so shared pages are not
counted twice) and RSS. Prints JSON with the engine the demo served with (from its demo.json).
`--make` runs `make demo` in this checkout instead, installs included (what a fresh clone does), and reports
the whole tree's peak and, apart, the peak of the story itself (`draftsync demo` and its children).
Usage: python bench/demo_memory.py [--workdir DIR] [--engine auto|vllm|reference] [--make]
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


def story_process(root: psutil.Process) -> psutil.Process | None:
    """`draftsync demo` itself under `make demo` (not its `--prepare` step), once it has started."""
    for proc in root.children(recursive=True):
        try:
            argv = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "demo" in argv and "--prepare" not in argv and any(a.endswith("draftsync") for a in argv):
            return proc
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".draftsync-bench")
    parser.add_argument("--engine", default="auto", choices=("auto", "vllm", "reference"))
    parser.add_argument("--make", action="store_true", help="run `make demo` here (installs, work dir .draftsync)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.make:
        command, workdir = ["make", "demo"], Path(".draftsync")
    else:
        command = [sys.executable, "-m", "draftsync.cli", "--workdir", args.workdir, "demo", "--engine", args.engine]
        workdir = Path(args.workdir)
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = psutil.Process(child.pid)
    story = None if args.make else root
    peak = {"all": [0, 0, 0], "story": [0, 0, 0]}
    while child.poll() is None:
        story = story if story is not None and story.is_running() else story_process(root)
        try:
            for name, proc in (("all", root), ("story", story)):
                if proc is not None:
                    peak[name] = [max(a, b) for a, b in zip(peak[name], tree_memory(proc), strict=True)]
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    summary = workdir / "demo.json"
    demo = json.loads(summary.read_text()) if summary.exists() else {}
    result = {
        "command": " ".join(command[2:] if not args.make else command),
        "engine": demo.get("engine"),
        "exit_code": child.returncode,
        "wall_s": round(time.perf_counter() - started, 1),
        "demo_timings_s": demo.get("timings_s"),
    }
    for name, (pss, rss, count) in peak.items():
        prefix = "" if name == "story" else "make_demo_"
        if name == "all" and not args.make:
            continue
        result |= {
            f"{prefix}peak_pss_mb": round(pss / 2**20),
            f"{prefix}peak_rss_sum_mb": round(rss / 2**20),
            f"{prefix}peak_processes": count,
        }
    from harness import emit_json  # bench/ is the script's folder, first on sys.path

    emit_json(result, None)


if __name__ == "__main__":
    main()
