#!/bin/bash
# Step time of resnet18 with everything trained against only the head trained (--freeze-until fc).
# usage: bench/freeze_bench.sh [N=4000]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln)
# Makes (or reuses) the corpus as the other scripts do, builds (or reuses: kiln reports "up to
# date") a 3x64x64 float16 cache of it in $KILN_BENCH_TMP/cache64-N, then, one after the other,
#   (a) kiln train --data CACHE --model resnet18 --epochs 1 --max-steps 30 --batch-size 64
#                  --log-every 10 --metrics M --precision fp32
#   (b) the same with --freeze-until fc (every parameter before fc.weight frozen)
# Step time = batch / samples_per_s of the "kind":"step" metrics lines, mean over all lines but
# the first (warm-up). Goal: full/frozen step time >= 1.5.
# A benchmark, not a test: exits 0 whatever the figures, prints PASS/MISS; exits 2 on a usage
# error, a missing binary, a failed build/train or a figure that does not parse.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
n=${1:-4000}
case $n in ''|*[!0-9]*) echo "usage: $0 [N=4000]" >&2; exit 2 ;; esac
[ $# -le 1 ] || { echo "usage: $0 [N=4000]" >&2; exit 2; }
mkdir -p "$tmp"
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build)" >&2; exit 2; }

src=$tmp/corpus-$n
corpus "$src" "$n"
cache=$tmp/cache64-$n
echo "# kiln build $src $cache --resize 64 --crop 64 ..." >&2
"$kiln" build "$src" "$cache" --resize 64 --crop 64 --dtype float16 --norm imagenet \
    --threads 2 --progress none --force >"$tmp/freeze-build-$n.log" 2>&1 \
  || { echo "kiln build failed, log: $tmp/freeze-build-$n.log" >&2; tail -5 "$tmp/freeze-build-$n.log" >&2; exit 2; }
echo "#   $(tail -1 "$tmp/freeze-build-$n.log")" >&2

batch=64
common=(--data "$cache" --model resnet18 --epochs 1 --max-steps 30 --batch-size $batch
        --log-every 10 --precision fp32)
load0=$(cut -d' ' -f1 /proc/loadavg)
for run in full frozen; do
  extra=(); [ $run = frozen ] && extra=(--freeze-until fc)
  m=$tmp/freeze-$run-$n.jsonl; log=$tmp/freeze-$run-$n.log
  rm -f "$m"
  echo "# kiln train ${common[*]} --metrics $m ${extra[*]} ..." >&2
  rc=0; "$kiln" train "${common[@]}" --metrics "$m" "${extra[@]}" >"$log" 2>&1 || rc=$?
  [ $rc = 0 ] || { echo "kiln train ($run) failed (rc=$rc), log: $log" >&2; tail -5 "$log" >&2; exit 2; }
done
load1=$(cut -d' ' -f1 /proc/loadavg)

"$py" - "$n" "$batch" "$tmp/freeze-full-$n.jsonl" "$tmp/freeze-frozen-$n.jsonl" \
        "$tmp/freeze-full-$n.log" "$tmp/freeze-frozen-$n.log" "$load0" "$load1" <<'EOF' || exit 2
import json, re, sys
n, batch, m_full, m_frozen, l_full, l_frozen, load0, load1 = sys.argv[1:]
batch = int(batch)
def steps(path):
    rates = []
    with open(path) as f:
        for line in f:
            if line.strip():
                j = json.loads(line)
                if j.get("kind") == "step":
                    rates.append(float(j["samples_per_s"]))
    if len(rates) < 2:
        sys.exit(f"freeze_bench: {path} has {len(rates)} step lines, need at least 2")
    return rates
def trainable(path):
    m = re.search(r"([\d,]+) parameters, ([\d,]+) trainable", open(path).read())
    if not m:
        sys.exit(f"freeze_bench: no parameter count in {path}")
    return m.group(2), m.group(1)
rows = []
for name, m, l in (("all trained", m_full, l_full), ("--freeze-until fc", m_frozen, l_frozen)):
    r = steps(m)
    rest = r[1:]
    mean = sum(rest) / len(rest)
    rows.append((name, r, mean, batch / mean * 1000, *trainable(l)))
print(f"freeze_bench: resnet18 on the 3x64x64 float16 cache of {n} images, batch {batch}, fp32, CPU, "
      f"30 steps each, load average {load0} -> {load1}")
print(f"| {'run':<18} | {'trainable params':>23} | {'samples/s per 10 steps':<26} | {'mean*':>7} | {'ms/step':>7} |")
print(f"| {'-'*18} | {'-'*23} | {'-'*26} | {'-'*7} | {'-'*7} |")
for name, r, mean, ms, tr, tot in rows:
    print(f"| {name:<18} | {tr + ' / ' + tot:>23} | {', '.join('%.1f' % x for x in r):<26} | {mean:>7.1f} | {ms:>7.1f} |")
print("* mean samples/s over the step lines after the first (warm-up); ms/step = batch / that * 1000")
ratio = rows[0][3] / rows[1][3]
print()
print(f"step time full/frozen = {rows[0][3]:.1f} ms / {rows[1][3]:.1f} ms = {ratio:.2f}x "
      f"(goal >= 1.5) {'PASS' if ratio >= 1.5 else 'MISS'}")
EOF
exit 0
