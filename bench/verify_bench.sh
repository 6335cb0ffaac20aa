#!/bin/bash
# `kiln verify --level full` against the cost of reading the shards (cat), page cache warm
# and cold (each shard's pages dropped with posix_fadvise DONTNEED before each run, as
# `kiln bench --cold` drops them).
# usage: bench/verify_bench.sh [N=4000]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Builds (or reuses) the 3x224x224 float16 cache of the corpus in $KILN_BENCH_TMP/cache-N,
# warms the page cache (cat shards twice), then best of 3 for each of cat and verify, interleaved;
# then best of 3 of each cold, interleaved.
# Each run's own CPU time and how busy the machine was are printed beside it (bench/timed.py):
# a cold run that keeps every core busy is bound by the CPU, not the disk.
# A benchmark, not a test: exits 0 whatever the figures, prints PASS/MISS for the goal.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}
case $n in ''|*[!0-9]*) echo "usage: $0 [N=4000]" >&2; exit 2 ;; esac
mkdir -p "$tmp"
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }

src=$tmp/corpus-$n
corpus "$src" "$n"
cache=$tmp/cache-$n
bench_cache "$src" "$cache" "$tmp/verify-build-$n.log"
shopt -s nullglob
shards=("$cache"/shard-*.mdb)
[ ${#shards[@]} -gt 0 ] || { echo "no shards in $cache" >&2; exit 2; }
bytes=$(cat "${shards[@]}" | wc -c)

cat "${shards[@]}" >/dev/null; cat "${shards[@]}" >/dev/null   # warm the page cache

# run KIND OUT CMD...: one run of CMD, its stdout to OUT and stderr to the log of KIND
# (bench/timed.py); its wall time, own CPU time and how busy the machine was are appended
# to the lists of KIND.
declare -A wall cpu busy
vrc=0
run() {
  local kind=$1 out=$2 w c b rc
  shift 2
  read -r w c b rc < <("$py" "$bench/timed.py" "$out" "$tmp/verify-$kind-$n.log" "$@")
  wall[$kind]+="$w "; cpu[$kind]+="$c "; busy[$kind]+="$b "
  [ "$rc" = 0 ] || vrc=$rc
}
verify=("$kiln" verify "$cache" --level full --threads 2 --progress none)
for i in 1 2 3; do
  run warm_cat /dev/null cat "${shards[@]}"
  run warm_verify "$tmp/verify-$n.out" "${verify[@]}"
done
drop() { "$py" -c "
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
" "${shards[@]}"; }
for i in 1 2 3; do
  drop; run cold_cat /dev/null cat "${shards[@]}"
  drop; run cold_verify "$tmp/verify-cold-$n.out" "${verify[@]}"
done

"$py" - "$n" "$bytes" "$vrc" "$(tail -1 "$tmp/verify-$n.out")" \
  "${wall[warm_cat]}" "${cpu[warm_cat]}" "${busy[warm_cat]}" \
  "${wall[warm_verify]}" "${cpu[warm_verify]}" "${busy[warm_verify]}" \
  "${wall[cold_cat]}" "${cpu[cold_cat]}" "${busy[cold_cat]}" \
  "${wall[cold_verify]}" "${cpu[cold_verify]}" "${busy[cold_verify]}" <<'EOF'
import sys
n, nbytes, vrc, last = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = {}
for i, kind in enumerate(("warm_cat", "warm_verify", "cold_cat", "cold_verify")):
    w, c, b = (list(map(float, a.split())) for a in sys.argv[5 + 3 * i:8 + 3 * i])
    k = min(range(len(w)), key=w.__getitem__)  # the best run, with its CPU figures
    runs[kind] = (w[k], c[k], b[k], w)
gb = nbytes / 1e9
names = {"warm_cat": "warm: cat CACHE/shard-*.mdb > /dev/null",
         "warm_verify": "warm: kiln verify CACHE --level full --threads 2",
         "cold_cat": "cold: cat", "cold_verify": "cold: kiln verify --level full --threads 2"}
print(f"verify_bench: cache of {n} records (3x224x224 float16), {gb:.2f} GB in shards, best of 3, interleaved")
print(f"| {'what':<48} | {'best s':>7} | {'GB/s':>6} | {'records/s':>9} | {'own CPU s':>9} | {'CPUs busy':>9} |")
print(f"| {'-'*48} | {'-'*7} | {'-'*6} | {'-'*9} | {'-'*9} | {'-'*9} |")
for kind, (t, c, b, _) in runs.items():
    print(f"| {names[kind]:<48} | {t:>7.3f} | {gb/t:>6.2f} | {n/t:>9.0f} | {c:>9.3f} | {b:>9.2f} |")
print("runs (s): " + "; ".join(k.replace("_", " ") + " " + " ".join(f"{x:.3f}" for x in r[3])
                              for k, r in runs.items()))
print(f"verify exit status {vrc}; last line: {last}")
print("own CPU: the command's user + system seconds; CPUs busy: the machine's during the run (1.0: all cores)")
cc, cv = runs["cold_cat"], runs["cold_verify"]
if cv[2] >= 0.9:
    print(f"note: the best cold verify kept the CPUs {cv[2]:.0%} busy, so it is bound by the CPU, not the "
          f"disk (this disk's reads cost this machine's CPU: a VM's, a loop device); the cold ratio "
          f"then weighs verify's own CPU ({cv[1]:.3f} s) against cat's ({cc[1]:.3f} s)")
print()
for what, r, goal in (("warm verify/cat", runs["warm_verify"][0] / runs["warm_cat"][0], 1.5),
                      ("cold verify/cat", cv[0] / cc[0], 1.2)):
    print(f"{what:<28} {r:>9.2f}   goal <= {goal:<5} {'PASS' if r <= goal and vrc == 0 else 'MISS'}")
EOF
exit 0
