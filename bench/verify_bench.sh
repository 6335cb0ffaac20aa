#!/bin/bash
# `kiln verify --level full` against the cost of reading the shards (cat), page cache warm.
# usage: bench/verify_bench.sh [N=4000]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Builds (or reuses) the 3x224x224 float16 cache of the corpus in $KILN_BENCH_TMP/cache-N,
# warms the page cache (cat shards twice), then best of 3 for each of cat and verify.
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

now() { date +%s.%N; }
best() { "$py" -c "import sys; print(min(map(float, sys.argv[1:])))" "$@"; }
cat_t=(); ver_t=(); vrc=0
for i in 1 2 3; do
  t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
  cat_t+=("$("$py" -c "print($t1-$t0)")")
  t0=$(now); "$kiln" verify "$cache" --level full --threads 2 >"$tmp/verify-$n.log" 2>&1 || vrc=$?; t1=$(now)
  ver_t+=("$("$py" -c "print($t1-$t0)")")
done
bc=$(best "${cat_t[@]}"); bv=$(best "${ver_t[@]}")

"$py" - "$n" "$bytes" "$bc" "$bv" "$vrc" "${cat_t[*]}" "${ver_t[*]}" "$(tail -1 "$tmp/verify-$n.log")" <<'EOF'
import sys
n, nbytes, bc, bv, vrc, ct, vt, last = sys.argv[1:]
nbytes, bc, bv, vrc = int(nbytes), float(bc), float(bv), int(vrc)
gb = nbytes / 1e9
print(f"verify_bench: cache of {n} records (3x224x224 float16), {gb:.2f} GB in shards, page cache warm, best of 3")
print(f"| {'what':<44} | {'best s':>7} | {'GB/s':>6} | {'records/s':>9} |")
print(f"| {'-'*44} | {'-'*7} | {'-'*6} | {'-'*9} |")
print(f"| {'cat CACHE/shard-*.mdb > /dev/null':<44} | {bc:>7.3f} | {gb/bc:>6.2f} | {int(n)/bc:>9.0f} |")
print(f"| {'kiln verify CACHE --level full --threads 2':<44} | {bv:>7.3f} | {gb/bv:>6.2f} | {int(n)/bv:>9.0f} |")
print(f"runs (s): cat {ct}; verify {vt}")
print(f"verify exit status {vrc}; last line: {last}")
r = bv / bc
print()
print(f"{'verify/cat':<28} {r:>9.2f}   goal {'<= 2.0':<8} {'PASS' if r <= 2.0 and vrc == 0 else 'MISS'}")
EOF
exit 0
