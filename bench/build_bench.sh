#!/bin/bash
# Cache-build throughput of kiln against its peer and the decode floor, in one run.
# usage: bench/build_bench.sh [N=4000] [--big]
#   N      corpus size (made once with bench/make_corpus.sh, reused)
#   --big  also measure peak RssAnon of a kiln build over a 10x corpus (slow)
#   KILN_BENCH_REPS  runs of kiln and of the peer, interleaved, best kept (default 2)
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Installs the Debian packages the peer and the floor probe need if missing (apt-get).
# A benchmark, not a test: exits 0 whatever the figures, prints PASS/MISS per goal.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=4000; big=0
for a in "$@"; do
  case $a in
    --big) big=1 ;;
    ''|*[!0-9]*) echo "usage: $0 [N=4000] [--big]" >&2; exit 2 ;;
    *) n=$a ;;
  esac
done
mkdir -p "$tmp"
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }

corpus "$tmp/corpus-$n" "$n"
src=$tmp/corpus-$n

need_peers
# decode floor probe (bench/limits/decode_floor.cc), compiled once into $tmp/decode_floor
floor_probe

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }

kiln_build() {  # kiln_build SRC OUT LOG -> prints "wall peak_kb written"
  local s=$1 o=$2 log=$3 line
  rm -rf "$o"
  line=$("$py" "$here/rss_probe.py" --log "$log" -- "$kiln" build "$s" "$o" \
         --resize 256 --crop 224 --dtype float16 --norm imagenet --threads 2 --progress none) || true
  local rc wall peak written
  rc=$(echo "$line" | field rc); wall=$(echo "$line" | field wall_s); peak=$(echo "$line" | field peak_rss_anon_kb)
  written=$(sed -n 's/.*kiln build: \([0-9]*\) written.*/\1/p' "$log" | tail -1)
  if [ "$rc" != 0 ] || [ -z "$written" ]; then
    echo "kiln build failed (rc=$rc), log: $log" >&2; tail -5 "$log" >&2; echo "0 0 0"; return
  fi
  echo "$wall $peak $written $(du -sb "$o" | cut -f1)"
}

# Each side runs $reps times, interleaved (kiln, peer, kiln, peer, ...), and
# keeps its best run: the first build after a while pays for fresh page-cache
# pages (sys time 2.4 s instead of 1.0 s for the same kiln build, seen here),
# and a build after another's output was deleted gets its pages back.
reps=${KILN_BENCH_REPS:-2}
k_wall=0; k_peak=0; k_n=0; k_bytes=0; p_ips=0; p_n=0
for r in $(seq "$reps"); do
  echo "# kiln build ($n images), run $r of $reps ..." >&2
  read -r w pk kn kb < <(kiln_build "$src" "$tmp/out-kiln-$n" "$tmp/kiln-build-$n.log")
  rm -rf "$tmp/out-kiln-$n"
  if [ "${kn:-0}" != 0 ] && { [ "$k_n" = 0 ] || awk "BEGIN{exit !($w < $k_wall)}"; }; then
    k_wall=$w; k_n=$kn; k_bytes=$kb
  fi
  [ "${pk:-0}" -gt "$k_peak" ] && k_peak=$pk

  echo "# peer pylmdb_cache.py build, run $r of $reps ..." >&2
  rm -rf "$tmp/out-peer-$n"
  p_line=$("$py" "$bench/peers/pylmdb_cache.py" build "$src" "$tmp/out-peer-$n" 2 2>"$tmp/peer-build-$n.log" | grep pylmdb_build || true)
  rm -rf "$tmp/out-peer-$n"
  ips=$(echo "$p_line" | field images_per_s)
  if [ -n "$ips" ] && awk "BEGIN{exit !($ips > $p_ips)}"; then
    p_ips=$ips; p_n=$(echo "$p_line" | field images)
  fi
done

# Write floor: the cache's bytes written durably (1 MiB writes, fsync) to a
# fresh file beside it, on one core. On the VMs of this project new
# page-cache pages are slow and noisy (0.4 - 1.7 GB/s seen), so any cache
# build pays this in CPU time on top of decoding.
echo "# write floor ..." >&2
rm -f "$tmp/write-floor"
w_line=$(LC_ALL=C dd if=/dev/zero of="$tmp/write-floor" bs=1M count=$(( (${k_bytes:-0} + 1048575) / 1048576 )) \
         conv=fsync 2>&1 | tail -1)
rm -f "$tmp/write-floor"
w_bytes=$(echo "$w_line" | sed -n 's/^\([0-9]*\) bytes.*/\1/p')
w_secs=$(echo "$w_line" | sed -n 's/.* copied, \([0-9.]*\) s.*/\1/p')

echo "# decode floor ..." >&2
d_line=$("$probe" "$src" | head -1)
d_core=$(echo "$d_line" | field decode_only_per_core); d_files=$(echo "$d_line" | field files)
dr_core=$(echo "$d_line" | field decode+resize_per_core)

b_peak=""
if [ "$big" = 1 ]; then
  nb=$((n * 10))
  corpus "$tmp/corpus-$nb" "$nb"
  echo "# kiln build, big corpus ($nb images) ..." >&2
  read -r b_wall b_peak b_n _ < <(kiln_build "$tmp/corpus-$nb" "$tmp/out-kiln-$nb" "$tmp/kiln-build-$nb.log")
  rm -rf "$tmp/out-kiln-$nb"
fi

"$py" - "$n" "$k_wall" "$k_peak" "$k_n" "${p_ips:-0}" "${p_n:-0}" "${d_core:-0}" "${d_files:-0}" \
        "${dr_core:-0}" "$big" "${b_peak:-0}" "${b_n:-0}" "${b_wall:-0}" "${w_bytes:-0}" "${w_secs:-0}" <<'EOF'
import sys
a = sys.argv[1:]
n = int(a[0]); k_wall, k_peak, k_n = float(a[1]), int(a[2]), int(a[3])
p_ips, p_n, d_core, d_files, dr_core = float(a[4]), int(a[5]), float(a[6]), int(a[7]), float(a[8])
big, b_peak, b_n, b_wall = a[9] == "1", int(a[10]), int(a[11]), float(a[12])
w_bytes, w_secs = int(a[13]), float(a[14])
k_ips = k_n / k_wall if k_wall > 0 else 0.0
floor = 2 * d_core
mb = k_peak / 1024
print(f"build_bench: corpus of {n} images, 2 threads/processes, best of the interleaved runs of each")
print(f"| {'what':<44} | {'images':>7} | {'images/s':>9} |")
print(f"| {'-'*44} | {'-'*7} | {'-'*9} |")
print(f"| {'kiln build (wall %.2f s)' % k_wall:<44} | {k_n:>7} | {k_ips:>9.1f} |")
print(f"| {'peer pylmdb_cache.py build, 2 procs':<44} | {p_n:>7} | {p_ips:>9.1f} |")
print(f"| {'decode floor: 2 x one-core JPEG decode':<44} | {d_files:>7} | {floor:>9.1f} |")
print(f"| {'  (one-core decode+INTER_LINEAR resize)':<44} | {d_files:>7} | {dr_core:>9.1f} |")
# Per image: one decode plus writing one image's share of the cache, two cores.
w_rate = w_bytes / w_secs if w_secs > 0 else 0.0          # bytes/s, one core
per_img = w_bytes / k_n if k_n > 0 else 0.0
w_core = w_rate / per_img if per_img > 0 else 0.0         # images/s written, one core
dw_floor = 2 / (1 / d_core + 1 / w_core) if d_core > 0 and w_core > 0 else 0.0
print(f"| {'  write floor: one core, %.2f GB/s durable' % (w_rate / 1e9):<44} | {k_n:>7} | {w_core:>9.1f} |")
print(f"| {'decode+write floor: 2 cores, both per image':<44} | {k_n:>7} | {dw_floor:>9.1f} |")
print(f"| {'kiln build peak RssAnon, MB':<44} | {k_n:>7} | {mb:>9.1f} |")
if big:
    print(f"| {'kiln build peak RssAnon, MB (10x corpus)':<44} | {b_n:>7} | {b_peak/1024:>9.1f} |")
print()
def goal(name, val, ok, target):
    print(f"{name:<28} {val:>9.2f}   goal {target:<8} {'PASS' if ok else 'MISS'}")
r_peer = k_ips / p_ips if p_ips > 0 else 0.0
r_floor = k_ips / floor if floor > 0 else 0.0
goal("kiln/peer", r_peer, r_peer >= 8, ">= 8")
goal("kiln/decode-floor", r_floor, r_floor >= 0.60, ">= 0.60")
goal("peak RssAnon MB", mb, 0 < mb < 1024, "< 1024")
r_dw = k_ips / dw_floor if dw_floor > 0 else 0.0
print(f"{'kiln/decode+write-floor':<28} {r_dw:>9.2f}   (no goal: the floor with the cache's own writes)")
if big:
    goal("peak RssAnon MB (10x)", b_peak / 1024, 0 < b_peak / 1024 < 1024, "< 1024")
else:
    print(f"(10x corpus of {10*n} images skipped; pass --big to measure its peak RssAnon)")
EOF
exit 0
