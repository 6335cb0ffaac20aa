#!/bin/bash
# Loader throughput of kiln (`kiln bench`) against the memcpy floor and the two Python peers, in one run.
# usage: bench/loader_bench.sh [N=4000]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Installs the Debian packages the peers need if missing (apt-get).
# Builds (or reuses) the corpus and the 3x224x224 float16 cache as verify_bench.sh does, and the
# peer's own LMDB ($KILN_BENCH_TMP/peer-lmdb-N, pylmdb_cache.py build, 2 processes); warms the page
# cache (cache shards, corpus files, peer LMDB); then one run each of
#   kiln bench CACHE --batch 256 --workers 2       (3 shuffled epochs + memcpy floor, under rss_probe.py)
#   pylmdb_cache.py read PEER_DB 2                 (one shuffled epoch, DataLoader batch 64, 2 workers)
#   torchvision_epoch.py CORPUS 2                  (one shuffled epoch, DataLoader batch 64, 2 workers)
# Every figure printed is parsed from those runs; a figure that does not parse is an error (exit 2).
# A benchmark, not a test: exits 0 whatever the figures, prints PASS/MISS per goal.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}
case $n in ''|*[!0-9]*) echo "usage: $0 [N=4000]" >&2; exit 2 ;; esac
[ $# -le 1 ] || { echo "usage: $0 [N=4000]" >&2; exit 2; }
mkdir -p "$tmp"
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
need_peers

# --- corpus and kiln cache, exactly as verify_bench.sh ---
src=$tmp/corpus-$n
corpus "$src" "$n"
cache=$tmp/cache-$n
bench_cache "$src" "$cache" "$tmp/loader-build-$n.log"
shopt -s nullglob
shards=("$cache"/shard-*.mdb)
[ ${#shards[@]} -gt 0 ] || { echo "no shards in $cache" >&2; exit 2; }

# --- the peer's own LMDB (its read mode reads only what its build wrote) ---
files=$(find "$src" -mindepth 2 -type f | wc -l)
peerdb=$tmp/peer-lmdb-$n
entries() { "$py" -c "import lmdb, sys; print(lmdb.open(sys.argv[1], readonly=True, lock=False).stat()['entries'])" "$1" 2>/dev/null || true; }
if [ "$(entries "$peerdb")" != "$files" ]; then   # reuse only a complete one
  echo "# building peer LMDB $peerdb (pylmdb_cache.py build, 2 processes) ..." >&2
  rm -rf "$peerdb" "$peerdb.tmp"
  "$py" "$bench/peers/pylmdb_cache.py" build "$src" "$peerdb.tmp" 2 >"$tmp/loader-peer-build-$n.log" 2>&1 \
    || { echo "peer build failed, log: $tmp/loader-peer-build-$n.log" >&2; tail -5 "$tmp/loader-peer-build-$n.log" >&2; exit 2; }
  mv "$peerdb.tmp" "$peerdb"
fi

# --- warm the page cache: kiln shards, corpus files, peer LMDB (read through lmdb: its data.mdb
#     is a sparse file the size of its 1 TiB map, so it is not cat'ed) ---
echo "# warming the page cache ..." >&2
for i in 1 2; do
  cat "${shards[@]}" >/dev/null
  find "$src" -type f -exec cat {} + >/dev/null
  "$py" -c "
import lmdb, sys
e = lmdb.open(sys.argv[1], readonly=True, lock=False)
with e.begin() as t:
    sum(len(v) for _, v in t.cursor())" "$peerdb"
done

load0=$(cut -d' ' -f1 /proc/loadavg)
die() { echo "loader_bench: $*" >&2; exit 2; }
need() { [ -n "$2" ] || die "could not parse $1"; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }

# --- kiln bench, under rss_probe.py for its peak RssAnon ---
echo "# kiln bench $cache --batch 256 --workers 2 ..." >&2
klog=$tmp/loader-kiln-$n.log
probe=$("$py" "$here/rss_probe.py" --log "$klog" -- "$kiln" bench "$cache" --batch 256 --workers 2) || true
k_rc=$(echo "$probe" | field rc); k_peak_kb=$(echo "$probe" | field peak_rss_anon_kb)
[ "$k_rc" = 0 ] || { echo "kiln bench failed (rc=${k_rc:-?}), log: $klog" >&2; tail -5 "$klog" >&2; exit 2; }
need "rss_probe peak_rss_anon_kb" "$k_peak_kb"
k_n=$(sed -n 's/^kiln bench .*: \([0-9]*\) samples of .*/\1/p' "$klog"); need "kiln sample count" "$k_n"
k_ring=$(sed -n 's/.* ring [0-9]* slots (\([0-9.]*\) MB).*/\1/p' "$klog"); need "kiln ring size" "$k_ring"
k_epochs=$(sed -n 's/^  epoch [0-9]*: \([0-9.]*\) samples\/s.*/\1/p' "$klog" | tr '\n' ' ')
need "kiln epoch samples/s" "$k_epochs"
k_floor=$(sed -n 's/^  memcpy floor .*: \([0-9.]*\) samples\/s.*/\1/p' "$klog"); need "kiln memcpy floor" "$k_floor"
k_ratio=$(sed -n 's/^  loader \/ floor = \([0-9.]*\).*/\1/p' "$klog"); need "kiln loader / floor" "$k_ratio"
k_rss=$(sed -n 's/^  RssAnon \([0-9.]*\) MB .*/\1/p' "$klog"); need "kiln RssAnon" "$k_rss"

# --- the peers, 2 workers each (both use DataLoader batch 64, which they do not let us change) ---
echo "# peer pylmdb_cache.py read ..." >&2
p_line=$("$py" "$bench/peers/pylmdb_cache.py" read "$peerdb" 2 2>"$tmp/loader-peer-read-$n.log" | grep pylmdb_read || true)
p_ips=$(echo "$p_line" | field images_per_s); p_n=$(echo "$p_line" | field images)
need "pylmdb_cache.py read images_per_s (log $tmp/loader-peer-read-$n.log)" "$p_ips"; need "pylmdb_cache.py read images" "$p_n"

echo "# peer torchvision_epoch.py ..." >&2
t_line=$("$py" "$bench/peers/torchvision_epoch.py" "$src" 2 2>"$tmp/loader-torchvision-$n.log" | grep torchvision_epoch || true)
t_ips=$(echo "$t_line" | field images_per_s); t_n=$(echo "$t_line" | field images)
need "torchvision_epoch.py images_per_s (log $tmp/loader-torchvision-$n.log)" "$t_ips"; need "torchvision_epoch.py images" "$t_n"
load1=$(cut -d' ' -f1 /proc/loadavg)

"$py" - "$n" "$k_n" "$k_ring" "$k_epochs" "$k_floor" "$k_ratio" "$k_rss" "$k_peak_kb" \
        "$p_ips" "$p_n" "$t_ips" "$t_n" "$load0" "$load1" <<'EOF'
import sys
a = sys.argv[1:]
n, k_n, ring = int(a[0]), int(a[1]), float(a[2])
epochs = [float(x) for x in a[3].split()]
floor, ratio, rss, peak = float(a[4]), float(a[5]), float(a[6]), int(a[7]) * 1024 / 1e6
p_ips, p_n, t_ips, t_n = float(a[8]), int(a[9]), float(a[10]), int(a[11])
best = max(epochs)
print(f"loader_bench: cache of {n} records (3x224x224 float16), page cache warm, shuffled, 2 workers/threads, "
      f"load average {a[12]} -> {a[13]}")
print(f"| {'what':<52} | {'samples':>7} | {'samples/s':>9} |")
print(f"| {'-'*52} | {'-'*7} | {'-'*9} |")
print(f"| {'kiln bench, batch 256, best of %d epochs' % len(epochs):<52} | {k_n:>7} | {best:>9.0f} |")
print(f"| {'  (epochs: ' + ', '.join('%.0f' % e for e in epochs) + ')':<52} | {'':>7} | {'':>9} |")
print(f"| {'memcpy floor, same records, same order, 2 threads':<52} | {k_n:>7} | {floor:>9.0f} |")
print(f"| {'peer pylmdb_cache.py read, batch 64, 2 workers':<52} | {p_n:>7} | {p_ips:>9.1f} |")
print(f"| {'peer torchvision_epoch.py, batch 64, 2 workers':<52} | {t_n:>7} | {t_ips:>9.1f} |")
# kiln bench prints RssAnon and the ring in MB of 1e6 bytes
print(f"kiln RssAnon: at end of run {rss:.1f} MB (kiln's figure), "
      f"peak {peak:.1f} MB (rss_probe.py); ring {ring:.1f} MB")
if not (k_n == p_n == t_n == n):
    print(f"WARNING: sample counts differ (N={n}, kiln {k_n}, pylmdb {p_n}, torchvision {t_n})")
print()
def goal(name, val, ok, target):
    print(f"{name} = {val:.2f} (goal {target}) {'PASS' if ok else 'MISS'}")
r_p, r_t = best / p_ips, best / t_ips
goal("kiln/pylmdb-read", r_p, r_p >= 8, ">= 8")
goal("kiln/torchvision", r_t, r_t >= 40, ">= 40")
goal("loader/floor", ratio, ratio >= 0.60, ">= 0.60")
extra = peak - ring
goal("peak RssAnon - ring, MB", extra, extra <= 100, "<= 100")
print(f"(with kiln's slowest epoch, {min(epochs):.0f} samples/s: kiln/pylmdb-read = {min(epochs)/p_ips:.2f}, "
      f"kiln/torchvision = {min(epochs)/t_ips:.2f})")
EOF
exit 0
