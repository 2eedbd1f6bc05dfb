"""Seconds from a command's last line of output to the end of its process: what its exit costs.

    python benchmarks/exit_time.py [--runs 3] -- grpo-lightning fit --config trainer/cpu ...

Runs the command ``--runs`` times, one after another, and prints for each its exit status, when its
last line came (seconds since it started) and how long its process took to end after that.
"""

from __future__ import annotations

import argparse
import subprocess
import time


def exit_time(command: list[str]) -> tuple[int, float, float]:
    """``(status, seconds to the last line, seconds from it to the process's end)`` of one run of ``command``."""
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last = started
    for _ in process.stdout:
        last = time.time()
    process.wait()
    return process.returncode, last - started, time.time() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    for run in range(1, args.runs + 1):
        status, last_line, exit_s = exit_time(command)
        print(f"run {run}: status {status}, last line at {last_line:.2f} s, ended {exit_s:.2f} s after it", flush=True)


if __name__ == "__main__":
    main()
