"""Runs a command once and prints what it cost: wall seconds, its own CPU
seconds (user + system, the kernel's accounting of a waited-for child) and
how busy the machine's CPUs were meanwhile (/proc/stat: 1.0 = every core
busy; idle and iowait are not busy), then its exit status, on one line.

usage: timed.py OUT ERR CMD...   (CMD's stdout goes to the file OUT, its stderr to ERR;
                                  either may be /dev/null)

A read of a "cold" file whose disk copies on this machine's CPUs (a VM's
virtual disk, a loop device) shows as a busy machine: such a run is bound by
the CPU, and comparing two of them compares their CPU costs.
"""
import resource
import subprocess
import sys
import time


def ticks():
    # user nice system idle iowait irq softirq steal; guest and guest_nice
    # (the fields after) are counted in user and nice already.
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: timed.py OUT ERR CMD...")
    b0, a0 = ticks()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    with open(sys.argv[1], "w") as out, open(sys.argv[2], "w") as err:
        rc = subprocess.run(sys.argv[3:], stdout=out, stderr=err).returncode
    w1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b1, a1 = ticks()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{w1 - w0:.4f} {cpu:.4f} {(b1 - b0) / max(a1 - a0, 1):.3f} {rc}")


if __name__ == "__main__":
    main()
