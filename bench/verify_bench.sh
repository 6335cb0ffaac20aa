#!/bin/bash
# `kiln verify --level full` against the cost of reading the shards (cat), page cache warm
# and cold (each shard's pages dropped with posix_fadvise DONTNEED before each run, as
# `kiln bench --cold` drops them).
# usage: bench/verify_bench.sh [N=4000]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Builds (or reuses) the 3x224x224 float16 cache of the corpus in $KILN_BENCH_TMP/cache-N,
# warms the page cache (cat shards twice), then best of 3 for each of cat and verify, interleaved;
# then best of 3 of each cold, interleaved.
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
drop() { "$py" -c "
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
" "${shards[@]}"; }
ccat_t=(); cver_t=()
for i in 1 2 3; do
  drop; t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
  ccat_t+=("$("$py" -c "print($t1-$t0)")")
  drop; t0=$(now); "$kiln" verify "$cache" --level full --threads 2 >"$tmp/verify-cold-$n.log" 2>&1 || vrc=$?; t1=$(now)
  cver_t+=("$("$py" -c "print($t1-$t0)")")
done
cbc=$(best "${ccat_t[@]}"); cbv=$(best "${cver_t[@]}")

"$py" - "$n" "$bytes" "$bc" "$bv" "$vrc" "${cat_t[*]}" "${ver_t[*]}" "$(tail -1 "$tmp/verify-$n.log")" \
  "$cbc" "$cbv" "${ccat_t[*]}" "${cver_t[*]}" <<'EOF'
import sys
n, nbytes, bc, bv, vrc, ct, vt, last, cbc, cbv, cct, cvt = sys.argv[1:]
nbytes, bc, bv, vrc, cbc, cbv = int(nbytes), float(bc), float(bv), int(vrc), float(cbc), float(cbv)
gb = nbytes / 1e9
print(f"verify_bench: cache of {n} records (3x224x224 float16), {gb:.2f} GB in shards, best of 3, interleaved")
print(f"| {'what':<44} | {'best s':>7} | {'GB/s':>6} | {'records/s':>9} |")
print(f"| {'-'*44} | {'-'*7} | {'-'*6} | {'-'*9} |")
for what, t in (("warm: cat CACHE/shard-*.mdb > /dev/null", bc),
                ("warm: kiln verify CACHE --level full --threads 2", bv),
                ("cold: cat", cbc), ("cold: kiln verify --level full --threads 2", cbv)):
    print(f"| {what:<44} | {t:>7.3f} | {gb/t:>6.2f} | {int(n)/t:>9.0f} |")
print(f"runs (s): warm cat {ct}; warm verify {vt}; cold cat {cct}; cold verify {cvt}")
print(f"verify exit status {vrc}; last line: {last}")
print()
for what, r, goal in (("warm verify/cat", bv / bc, 1.5), ("cold verify/cat", cbv / cbc, 1.2)):
    print(f"{what:<28} {r:>9.2f}   goal <= {goal:<5} {'PASS' if r <= goal and vrc == 0 else 'MISS'}")
EOF
exit 0
