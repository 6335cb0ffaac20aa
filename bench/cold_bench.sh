#!/bin/bash
# The loader and kiln verify on caches that are not in memory, against the disk's floors
# measured in the same run (issue 29).
# usage: bench/cold_bench.sh [N...]   (default: 4000 20000)
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln),
#      KILN_SYNTH (default <repo>/build/tests/kiln_synth_cache), ROUNDS (default 2)
# For each N: a 3x224x224 float16 cache of N records (the bench cache's record size; made by
# kiln_synth_cache, the content does not matter to a loader) in $KILN_BENCH_TMP/synth-N, then
# ROUNDS interleaved rounds of
#   kiln bench --cold --batch 256 --workers 2 --epochs 2     (read-ahead on: kiln's default)
#   kiln bench --cold ... --epochs 1 --readahead 0           (read-ahead off: kiln before it; N <= 4000)
#   cold cat of the shards, then cold kiln verify --level full --threads 2
# and, as root with a cgroup v1 memory controller, one run of kiln bench --cold --epochs 2 in a
# cgroup limited to a third of the cache (batch 64: the ring, 4 x 64 records, must fit in it too). "Cold" = dropped from the page cache with
# posix_fadvise(POSIX_FADV_DONTNEED), no root needed. Every figure is parsed from those runs; one
# that does not parse is an error (exit 2). A benchmark, not a test: exits 0 whatever the figures,
# prints PASS/MISS per goal.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
synth=${KILN_SYNTH:-$repo/build/tests/kiln_synth_cache}
rounds=${ROUNDS:-2}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4000 20000)
for n in "${sizes[@]}"; do
  case $n in ''|*[!0-9]*) echo "usage: $0 [N...]" >&2; exit 2 ;; esac
done
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }
[ -x "$synth" ] || { echo "no kiln_synth_cache at $synth (cmake --build build)" >&2; exit 2; }
mkdir -p "$tmp"

die() { echo "cold_bench: $*" >&2; exit 2; }
now() { date +%s.%N; }
# drop FILES...: out of the page cache (clean pages nobody maps).
drop() { "$py" -c "
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)" "$@"; }
num() { sed -n "s|.*$1 *\([0-9][0-9.]*\).*|\1|p" | head -1; }
need() { [ -n "$2" ] || die "could not parse $1 from $3"; }

summary=()
for n in "${sizes[@]}"; do
  cache=$tmp/synth-$n
  if ! "$kiln" verify "$cache" --level quick >/dev/null 2>&1; then
    echo "# making $cache ($n records of 3x224x224 float16) ..." >&2
    rm -rf "$cache"
    "$synth" "$cache" "$n" 3 224 224 float16 >/dev/null
  fi
  shopt -s nullglob
  shards=("$cache"/shard-*.mdb)
  [ ${#shards[@]} -gt 0 ] || die "no shards in $cache"
  bytes=$(cat "${shards[@]}" | wc -c)
  echo "== N=$n: $(numfmt --to=si "$bytes")B of shards, $rounds rounds, load $(cut -d' ' -f1 /proc/loadavg)"
  for r in $(seq 1 "$rounds"); do
    log=$tmp/cold-bench-$n-$r.log
    "$kiln" bench "$cache" --cold --batch 256 --workers 2 --epochs 2 >"$log" 2>&1 || die "kiln bench failed: $log"
    best=$(grep -o 'epoch [0-9]*: [0-9]*' "$log" | awk '{print $3}' | sort -n | tail -1)
    rnd=$(num "loader / best random-read floor =" <"$log"); seq_=$(num "loader / sequential-read floor =" <"$log")
    need "the loader" "$best" "$log"; need "the random floor ratio" "$rnd" "$log"; need "the sequential ratio" "$seq_" "$log"
    floors=$(grep -o 'random record reads, *[0-9]* threads: [0-9]*' "$log" | awk '{print $4 ":" $6}' | tr '\n' ' ')
    seqfloor=$(grep -o 'sequential read of the shards ([^)]*): [0-9]*' "$log" | awk '{print $NF}')
    echo "round $r: kiln bench --cold: best epoch $best samples/s; floors: sequential $seqfloor, random (threads:samples/s) $floors"
    echo "round $r:   loader / best random-read floor = $rnd   loader / sequential-read floor = $seq_"
    summary+=("N=$n round $r: loader/best-random $rnd, loader/sequential $seq_")
    if [ "$n" -le 4000 ]; then
      "$kiln" bench "$cache" --cold --batch 256 --workers 2 --epochs 1 --readahead 0 >"$log.off" 2>&1 \
        || die "kiln bench --readahead 0 failed: $log.off"
      off=$(grep -o 'epoch 0: [0-9]*' "$log.off" | awk '{print $3}')
      need "the loader without read-ahead" "$off" "$log.off"
      echo "round $r:   without read-ahead (--readahead 0): $off samples/s; read-ahead / none = $("$py" -c "print('%.1f' % ($best / $off))")"
    fi
    drop "${shards[@]}"
    t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
    drop "${shards[@]}"
    t2=$(now); "$kiln" verify "$cache" --level full --threads 2 >"$log.verify" 2>&1 || die "kiln verify failed: $log.verify"; t3=$(now)
    ratio=$("$py" -c "print('%.2f' % (($t3 - $t2) / ($t1 - $t0)))")
    echo "round $r:   cold cat $("$py" -c "print('%.2f' % ($t1 - $t0))") s, cold kiln verify --level full $("$py" -c "print('%.2f' % ($t3 - $t2))") s: verify/cat = $ratio"
    summary+=("N=$n round $r: cold verify/cat $ratio")
  done
  # A cgroup a third of the cache: every epoch from the disk, the process not killed.
  cg=/sys/fs/cgroup/memory/kiln-cold-bench-$$
  if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup/memory ] && mkdir "$cg" 2>/dev/null; then
    echo $((bytes / 3)) >"$cg/memory.limit_in_bytes"
    log=$tmp/cold-bench-$n-cgroup.log
    rc=0
    sh -c "echo \$\$ > $cg/cgroup.procs && exec $kiln bench $cache --cold --batch 64 --workers 2 --epochs 2" \
      >"$log" 2>&1 || rc=$?
    rmdir "$cg" 2>/dev/null || true
    [ $rc = 0 ] || die "kiln bench in a cgroup of $((bytes / 3)) bytes exited $rc: $log"
    worst=$(grep -o 'epoch [0-9]*: [0-9]*' "$log" | awk '{print $3}' | sort -n | head -1)
    bestr=$(grep -o 'random record reads, *[0-9]* threads: [0-9]*' "$log" | awk '{print $6}' | sort -n | tail -1)
    need "the cgroup epochs" "$worst" "$log"; need "the cgroup floors" "$bestr" "$log"
    cr=$("$py" -c "print('%.2f' % ($worst / $bestr))")
    echo "cgroup of $(numfmt --to=si $((bytes / 3)))B: slowest epoch $worst samples/s, best random-read floor $bestr: slowest / floor = $cr"
    summary+=("N=$n cgroup 1/3: slowest epoch / best random floor $cr")
  else
    echo "cgroup run skipped: needs root and a writable cgroup v1 memory controller"
  fi
done
echo "== summary (goals: loader/best-random >= 0.6 and loader/sequential >= 1.0, cold verify/cat <= 1.5, cgroup >= 0.5)"
for s in "${summary[@]}"; do echo "  $s"; done
