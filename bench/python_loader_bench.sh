#!/bin/bash
# The Python module kiln against `kiln bench` (the C++ loader alone) and against tools/kiln_torch.py
# through a DataLoader with 2 workers, on the same cache, in one run.
# usage: bench/python_loader_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP, KILN (as bench/common.sh), KILN_PYTHONPATH (default
#      <repo>/build/python: where the built module is)
# Builds (or reuses) the corpus and the 3x224x224 float16 cache exactly as loader_bench.sh does,
# warms the page cache, then ROUNDS interleaved rounds (A B C A B C) of
#   A  kiln bench CACHE --batch 256 --workers 2                  (3 shuffled epochs)
#   B  python_epochs.py module CACHE --batch 256 --workers 2     (kiln.Loader, 3 shuffled epochs)
#   C  python_epochs.py kiln_torch CACHE --batch 256 --workers 2 (DataLoader, 2 shuffled epochs)
# Each run's figure is its best epoch; the ratios use the best run of each. RSS beyond the ring:
# kiln.Loader's peak RssAnon less the process's RssAnon before the loader (Python + torch) and
# less the ring, the worst of the B runs. Every figure printed is parsed from those runs; a
# figure that does not parse is an error (exit 2). A benchmark, not a test: exits 0 whatever
# the figures, prints PASS/MISS per goal.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}
rounds=${2:-2}
usage() { echo "usage: $0 [N=4000] [ROUNDS=2]" >&2; exit 2; }
case $n in ''|*[!0-9]*) usage ;; esac
case $rounds in ''|*[!0-9]*|0) usage ;; esac
[ $# -le 2 ] || usage
export PYTHONPATH=${KILN_PYTHONPATH:-$repo/build/python}
mkdir -p "$tmp"
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
"$py" -c "import kiln" 2>/dev/null \
  || { echo "no Python module kiln under $PYTHONPATH (build with KILN_WITH_PYTHON)" >&2; exit 2; }

src=$tmp/corpus-$n
corpus "$src" "$n"
cache=$tmp/cache-$n
bench_cache "$src" "$cache" "$tmp/pyloader-build-$n.log"
shopt -s nullglob
shards=("$cache"/shard-*.mdb)
[ ${#shards[@]} -gt 0 ] || { echo "no shards in $cache" >&2; exit 2; }
echo "# warming the page cache ..." >&2
cat "${shards[@]}" >/dev/null; cat "${shards[@]}" >/dev/null

die() { echo "python_loader_bench: $*" >&2; exit 2; }
best_epoch() { sed -n 's/^ *epoch [0-9]*: \([0-9.]*\) samples\/s.*/\1/p' "$1" | sort -g | tail -1; }
load0=$(cut -d' ' -f1 /proc/loadavg)
a_rates=() b_rates=() c_rates=() b_extra=() b_ring=()
for r in $(seq 1 "$rounds"); do
  echo "# round $r: kiln bench ..." >&2
  log=$tmp/pyloader-kiln-$r.log
  "$kiln" bench "$cache" --batch 256 --workers 2 >"$log" 2>&1 || die "kiln bench failed, log: $log"
  v=$(best_epoch "$log"); [ -n "$v" ] || die "no epoch rate in $log"; a_rates+=("$v")

  echo "# round $r: kiln.Loader (python_epochs.py module) ..." >&2
  log=$tmp/pyloader-module-$r.log
  "$py" "$here/python_epochs.py" module "$cache" --batch 256 --workers 2 >"$log" 2>&1 \
    || die "python_epochs.py module failed, log: $log"
  v=$(best_epoch "$log"); [ -n "$v" ] || die "no epoch rate in $log"; b_rates+=("$v")
  v=$(sed -n 's/^rss .*beyond_ring_mb=\([-0-9.]*\).*/\1/p' "$log"); [ -n "$v" ] || die "no rss in $log"
  b_extra+=("$v"); b_ring+=("$(sed -n 's/^rss .*ring_mb=\([0-9.]*\) .*/\1/p' "$log")")

  echo "# round $r: kiln_torch.py DataLoader, 2 workers ..." >&2
  log=$tmp/pyloader-kiln_torch-$r.log
  "$py" "$here/python_epochs.py" kiln_torch "$cache" --batch 256 --workers 2 >"$log" 2>&1 \
    || die "python_epochs.py kiln_torch failed, log: $log"
  v=$(best_epoch "$log"); [ -n "$v" ] || die "no epoch rate in $log"; c_rates+=("$v")
done
load1=$(cut -d' ' -f1 /proc/loadavg)
samples=$(sed -n 's/^kiln bench .*: \([0-9]*\) samples of .*/\1/p' "$tmp/pyloader-kiln-1.log")

"$py" - "$n" "$samples" "${a_rates[*]}" "${b_rates[*]}" "${c_rates[*]}" "${b_extra[*]}" \
        "${b_ring[*]}" "$load0" "$load1" <<'EOF'
import sys
a = sys.argv[1:]
n, samples = int(a[0]), a[1]
A, B, C = ([float(v) for v in s.split()] for s in a[2:5])
extra, ring = [float(v) for v in a[5].split()], [float(v) for v in a[6].split()]
print(f"python_loader_bench: cache of {n} records (3x224x224 float16), page cache warm, shuffled, "
      f"batch 256, 2 workers, {len(A)} interleaved rounds, load average {a[7]} -> {a[8]}")
print(f"| {'what (best epoch of each run, samples/s)':<46} | " +
      " | ".join(f"round {i + 1:>2}" for i in range(len(A))) + " |")
print(f"| {'-' * 46} | " + " | ".join("-" * 8 for _ in A) + " |")
for name, xs in (("A kiln bench (C++ loader)", A), ("B kiln.Loader from Python", B),
                 ("C kiln_torch.py DataLoader, 2 workers", C)):
    print(f"| {name:<46} | " + " | ".join(f"{x:>8.0f}" for x in xs) + " |")
print(f"kiln.Loader RssAnon beyond Python+torch and the ring ({ring[0]:.1f} MB), per round: "
      + ", ".join(f"{x:.1f} MB" for x in extra))
print()
def goal(name, val, ok, target):
    print(f"{name} = {val:.2f} (goal {target}) {'PASS' if ok else 'MISS'}")
r_a, r_c = max(B) / max(A), max(B) / max(C)
goal("python-module / kiln-bench", r_a, r_a >= 0.85, ">= 0.85")
goal("python-module / kiln_torch-DataLoader-2-workers", r_c, r_c >= 5, ">= 5")
goal("RSS beyond the ring, MB", max(extra), max(extra) <= 100, "<= 100")
print("(per round, python-module / kiln-bench: " +
      ", ".join(f"{b / x:.2f}" for b, x in zip(B, A)) + ")")
EOF
exit 0
