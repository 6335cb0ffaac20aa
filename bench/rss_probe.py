#!/usr/bin/python3
"""Run a command and sample its anonymous memory.

usage: rss_probe.py [--interval-ms 20] [--log FILE] -- CMD [ARGS...]

Every interval (default 20 ms) reads RssAnon from /proc/PID/status of the
command and of all its descendants (summed), and keeps the maximum.  RssAnon
is the anonymous resident memory (heap, stacks, private buffers); unlike
GNU time's "maximum resident set size" it does not count file-backed pages,
so a cache that is written through mmap does not inflate it.

Prints one line on stdout when the command ends:
  rss_probe rc=RC wall_s=SECONDS peak_rss_anon_kb=KB samples=N
The command's own stdout/stderr go to --log (default: inherited stderr).
Exits with the command's exit status.
"""
import os
import subprocess
import sys
import time


def rss_anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def tree_rss_kb(root):
    total, stack, seen = 0, [root], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += rss_anon_kb(p)
        stack += children(p)
    return total


def main(argv):
    interval, log = 0.020, None
    while argv and argv[0] != "--":
        a = argv.pop(0)
        if a == "--interval-ms":
            interval = float(argv.pop(0)) / 1000.0
        elif a == "--log":
            log = argv.pop(0)
        else:
            sys.exit(f"rss_probe: unknown option {a}\n{__doc__}")
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.exit(__doc__)
    cmd = argv[1:]
    out = open(log, "w") if log else None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=out or sys.stderr, stderr=subprocess.STDOUT if out else None)
    peak, samples = 0, 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kb(proc.pid))
        samples += 1
        time.sleep(interval)
    wall = time.monotonic() - t0
    rc = proc.returncode
    print(f"rss_probe rc={rc} wall_s={wall:.3f} peak_rss_anon_kb={peak} samples={samples}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
