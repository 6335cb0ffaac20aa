#!/bin/bash
# kiln against its peers (issue 41): NVIDIA DALI (CPU operators), LitData, MosaicML Streaming,
# WebDataset and Pillow-SIMD, each doing the same work as kiln on the same bench corpus, in its
# documented best configuration (each peer's file in bench/peers/ says which, and from which page).
# usage: bench/peers_bench.sh [N=4000] [ROUNDS=2]
# env: KILN_BENCH_TMP (default /tmp/kiln-bench), KILN (default <repo>/build/kiln, else
#      <repo>/build-cuda/kiln), KILN_PYTHONPATH (default: the python/ beside that kiln),
#      KILN_PYTHON (default: /usr/bin/python3 for build/, the venv of tools/torch-requirements.txt
#      for build-cuda/), KILN_CACHE_DIR (default ~/.cache/kiln: the venvs and wheels)
# What it does:
#   1. the bench corpus of N images ($KILN_BENCH_TMP/corpus-N, bench/make_corpus.sh);
#   2. a venv of bench/peers/requirements.txt under ~/.cache/kiln (peers-venv-<hash of that
#      file>, wheels downloaded once into ~/.cache/kiln/wheels, then pip install --no-index,
#      as tools/setup.sh makes kiln's torch venv), and a small second venv for Pillow-SIMD
#      (built from its sdist with CC="cc -mavx2"; the peers venv's packages behind it);
#   3. convert, once per side, into $KILN_BENCH_TMP/peers-N/<side> (timed, bytes on disk):
#      kiln build --max-side 256 --dtype uint8 --norm imagenet --threads 2; each peer's own
#      writer with 2 worker processes (bench/peers/<peer>_peer.py convert); DALI has none;
#   4. ROUNDS rounds, interleaved (kiln, dali, litdata, streaming, wds, pillow-simd, kiln, ...),
#      of one epoch per run, batch 256, 2 workers, float16 ImageNet-normalized (B, 3, 224, 224)
#      output, for each of RandomResizedCrop(224) + flip and Resize(256) + CenterCrop(224), in
#      each of: warm (the side's files read twice first), cold (dropped from the page cache with
#      posix_fadvise DONTNEED first) and, where this machine lets root make a memory cgroup,
#      cold under a cgroup limited to the side's own memory (the larger of its peak anonymous +
#      shared memory in its warm and cold runs and the kernel's peak of what was charged to its
#      warm run: its libraries' pages and kernel memory too, its data being charged to the
#      warm-up) plus a third of its data's bytes;
#   5. one table: per row and peer, kiln's figure, the peer's and kiln/peer (best of the rounds
#      of each), then each side's configuration.
# A peer that fails to install, convert or run gets a clear line (and "failed: ..." in the
# table), and the others go on. A benchmark, not a test: exits 0 whatever the figures; 2 on
# usage errors or when kiln itself (binary, Python module) is missing.
set -uo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
usage() { echo "usage: $0 [N=4000] [ROUNDS=2]" >&2; exit 2; }
[ $# -le 2 ] || usage
n=${1:-4000}; rounds=${2:-2}
case $n in ''|*[!0-9]*|0) usage ;; esac
case $rounds in ''|*[!0-9]*|0) usage ;; esac

cache=${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}
wheels=$cache/wheels
peers=$bench/peers
pc=$peers/peer_common.py

# --- kiln: the binary, its Python module and the python it was built for ---
if [ -z "${KILN:-}" ] && [ ! -x "$kiln" ] && [ -x "$repo/build-cuda/kiln" ]; then
  kiln=$repo/build-cuda/kiln
fi
[ -x "$kiln" ] || { echo "no kiln binary at $kiln (cmake --build build, or KILN=...)" >&2; exit 2; }
kdir=$(cd "$(dirname "$kiln")" && pwd)
kpath=${KILN_PYTHONPATH:-$kdir/python}
if [ -n "${KILN_PYTHON:-}" ]; then
  kpy=$KILN_PYTHON
elif [ "$(basename "$kdir")" = build-cuda ]; then
  kpy=$cache/venv-$(grep -v '^#' "$repo/tools/torch-requirements.txt" | sha256sum | cut -c1-12)/bin/python
else
  kpy=$py
fi
PYTHONPATH=$kpath "$kpy" -c "import kiln, torch" 2>/dev/null \
  || { echo "no Python module kiln under $kpath for $kpy (build it, or set KILN_PYTHONPATH/KILN_PYTHON)" >&2; exit 2; }

mkdir -p "$tmp"
work=$tmp/peers-$n
logs=$work/logs
rm -rf "$logs"; mkdir -p "$logs"
results=$work/results.tsv
: >"$results"
src=$tmp/corpus-$n
corpus "$src" "$n"

sides=(kiln dali litdata streaming wds pillow-simd)
declare -A status=()   # side -> "" (fine) or why it is out
fail() {               # fail SIDE WHAT: the clear line, and the side is out
  status[$1]=$2
  echo "$1: $2"
}
lastline() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1 | cut -c1-300; }

# --- the peers venv ---
req=$peers/requirements.txt
ptag=$(sha256sum "$req" | cut -c1-12)
venv=$cache/peers-venv-$ptag
vpy=$venv/bin/python
if [ "$(cat "$venv/.kiln-ready" 2>/dev/null)" != "$ptag" ]; then
  echo "# making the peers venv $venv (wheels kept in $wheels) ..." >&2
  need_debs python3-venv >/dev/null 2>&1 || true
  log=$logs/venv.log
  rm -rf "$venv"; mkdir -p "$wheels"
  if /usr/bin/python3 -m venv "$venv" >"$log" 2>&1 \
     && "$vpy" -m pip download -q -d "$wheels" -r "$req" >>"$log" 2>&1 \
     && "$vpy" -m pip install -q --no-index --find-links "$wheels" -r "$req" >>"$log" 2>&1; then
    echo "$ptag" >"$venv/.kiln-ready"
  else
    why="install failed: $(lastline "$log")"
    for s in dali litdata streaming wds pillow-simd; do fail "$s" "$why"; done
  fi
fi
# Each peer's package must import (a broken wheel is that peer's install failure only).
declare -A module=([dali]=nvidia.dali [litdata]=litdata [streaming]=streaming [wds]=webdataset)
for s in dali litdata streaming wds; do
  [ -z "${status[$s]:-}" ] || continue
  "$vpy" -c "import ${module[$s]}" >"$logs/import-$s.log" 2>&1 \
    || fail "$s" "install failed: import ${module[$s]}: $(lastline "$logs/import-$s.log")"
done

# --- Pillow-SIMD: its own small venv (it replaces PIL), the peers venv's packages behind it ---
simd=$cache/peers-simd-$ptag
spy=$simd/bin/python
simd_spec=$(sed -n 's/^# \[simd\] *//p' "$req")
if [ -z "${status[pillow-simd]:-}" ] && [ "$(cat "$simd/.kiln-ready" 2>/dev/null)" != "$ptag" ]; then
  echo "# making the Pillow-SIMD venv $simd ($simd_spec, CC=\"cc -mavx2\") ..." >&2
  log=$logs/simd-venv.log
  rm -rf "$simd"
  need_debs gcc libjpeg-dev zlib1g-dev python3-dev >/dev/null 2>&1 || true
  simd_wheels=$wheels/pillow-simd-avx2
  mkdir -p "$simd_wheels"
  psite=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if /usr/bin/python3 -m venv "$simd" >"$log" 2>&1 \
     && { ls "$simd_wheels"/pillow_simd-"${simd_spec#*==}"-*.whl >/dev/null 2>&1 \
          || CC="cc -mavx2" "$spy" -m pip wheel -q --no-deps --no-binary pillow-simd \
               -w "$simd_wheels" "$simd_spec" >>"$log" 2>&1; } \
     && "$spy" -m pip install -q --no-index --no-deps --find-links "$simd_wheels" "$simd_spec" >>"$log" 2>&1; then
    ssite=$("$spy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$psite')" >"$ssite/zz-kiln-peers.pth"
    if "$spy" -c "import PIL, torch, torchvision; assert '.post' in PIL.__version__, PIL.__version__" >>"$log" 2>&1; then
      echo "$ptag" >"$simd/.kiln-ready"
    else
      fail pillow-simd "install failed: $(lastline "$log")"
    fi
  else
    fail pillow-simd "install failed (it may not build here): $(lastline "$log")"
  fi
fi

# --- convert: once per side ---
declare -A data=()     # side -> what its epochs read (its files: warmed, dropped, counted)
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"; }   # side row col round value
num() { sed -n "s/.*[[:space:]]$1=\([0-9.]*\).*/\1/p" "$2" | tail -1; }
echo "# converting: corpus $src ($(find "$src" -type f | wc -l) files) ..." >&2
echo "# convert: kiln build ..." >&2
rm -rf "$work/kiln"
t0=$(date +%s.%N)
if "$kiln" build "$src" "$work/kiln" --max-side 256 --dtype uint8 --norm imagenet --threads 2 \
     --progress none >"$logs/convert-kiln.log" 2>&1; then
  t1=$(date +%s.%N)
  data[kiln]=$work/kiln
  record kiln convert_s - 1 "$("$py" -c "print('%.3f' % ($t1 - $t0))")"
  record kiln bytes - 1 "$("$py" "$pc" bytes "$work/kiln")"
else
  fail kiln "convert failed: $(lastline "$logs/convert-kiln.log")"
fi
for s in dali litdata streaming wds pillow-simd; do
  [ -z "${status[$s]:-}" ] || continue
  echo "# convert: $s ..." >&2
  f=$peers/${s//-/_}_peer.py; out=$work/$s; log=$logs/convert-$s.log
  p=$vpy; [ "$s" = pillow-simd ] && p=$spy
  rm -rf "$out"
  if [ "$s" = dali ]; then
    # DALI reads the corpus's files as they are: no convert step, the corpus is its data.
    "$p" "$f" convert "$src" "$out" >"$log" 2>&1 && b=$(num bytes "$log") && [ -n "$b" ] \
      || { fail dali "run failed: $(lastline "$log")"; continue; }
    data[dali]=$src
    record dali convert_s - 1 "!n/a: reads the JPEG files"
    record dali bytes - 1 "$b"
    continue
  fi
  if timeout $((300 + n / 4)) "$p" "$f" convert "$src" "$out" 2 >"$log" 2>&1 \
     && [ "$(num images "$log")" = "$n" ] && [ -n "$(num seconds "$log")" ]; then
    data[$s]=$out
    record "$s" convert_s - 1 "$(num seconds "$log")"
    record "$s" bytes - 1 "$(num bytes "$log")"
  else
    fail "$s" "convert failed: $(lastline "$log")"
  fi
done

# --- epochs: ROUNDS interleaved rounds ---
cgkind=$("$py" "$pc" cgroup-probe 2>/dev/null || echo none)
columns=(warm cold)
[ "$cgkind" != none ] && columns+=(cgroup)
declare -A peak=()     # side.mode -> highest anonymous + shared bytes seen in its runs
epoch_cmd() {          # epoch_cmd SIDE MODE: the command line of one epoch
  case $1 in
    kiln) echo "env PYTHONPATH=$kpath $kpy $here/peers_bench_kiln.py epoch ${data[kiln]} $2 2 256" ;;
    pillow-simd) echo "$spy $peers/pillow_simd_peer.py epoch ${data[$1]} $2 2 256" ;;
    *) echo "$vpy $peers/${1}_peer.py epoch ${data[$1]} $2 2 256" ;;
  esac
}
load0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for s in "${sides[@]}"; do
    [ -z "${status[$s]:-}" ] && [ -n "${data[$s]:-}" ] || continue
    for mode in rrc center; do
      for col in "${columns[@]}"; do
        log=$logs/epoch-$s-$mode-$col-$r.log
        echo "# round $r: $s $mode $col ..." >&2
        if [ "$col" = warm ]; then "$py" "$pc" warm "${data[$s]}"; else "$py" "$pc" drop "${data[$s]}"; fi
        limit=0
        if [ "$col" = cgroup ]; then
          limit=$(( ${peak[$s.$mode]:-0} + $("$py" "$pc" bytes "${data[$s]}") / 3 ))
        fi
        # shellcheck disable=SC2046
        if [ "$cgkind" != none ]; then
          timeout $((300 + n / 4)) "$py" "$pc" cgrun "$limit" -- $(epoch_cmd "$s" "$mode") >"$log" 2>&1
        else
          timeout $((300 + n / 4)) $(epoch_cmd "$s" "$mode") >"$log" 2>&1
        fi
        rc=$?
        rate=$(num images_per_s "$log"); seen=$(num images "$log")
        # The side's own memory: its anonymous + shared peak (sampled), and in a warm run (its
        # data charged to the warm-up, not to it) the kernel's peak of all that was charged to it
        # (its libraries' pages, kernel memory): the larger, for the cgroup run's limit.
        p=$(num peak_bytes "$log"); kills=$(num oom_kills "$log")
        [ "$col" = warm ] && u=$(num usage_peak "$log") && [ -n "$u" ] && [ -n "$p" ] && [ "$u" -gt "$p" ] && p=$u
        if [ "$col" != cgroup ] && [ -n "$p" ] && [ "$p" -gt "${peak[$s.$mode]:-0}" ]; then peak[$s.$mode]=$p; fi
        if [ $rc = 0 ] && [ -n "$rate" ] && [ "$seen" = "$n" ]; then
          v=$rate; [ "$col" = cgroup ] && v="$rate@$limit"
          record "$s" "$mode" "$col" "$r" "$v"
        else
          if [ $rc = 124 ]; then why="timed out after $((300 + n / 4)) s"
          elif [ "${kills:-0}" -gt 0 ]; then why="killed by the OOM killer under a limit of $((limit / 1000000)) MB"
          elif [ $rc = 0 ] && [ -n "$rate" ]; then why="saw $seen of $n images"
          else why=$(grep -v '^cgroup peak_bytes=' "$log" | grep -v '^[[:space:]]*$' | tail -1 | cut -c1-300)
          fi
          echo "$s: run failed ($mode, $col, round $r): $why (log: $log)"
          record "$s" "$mode" "$col" "$r" "!failed: $why"
        fi
      done
    done
  done
done
load1=$(cut -d' ' -f1 /proc/loadavg)

# --- the table ---
for s in "${sides[@]}"; do
  [ -z "${status[$s]:-}" ] || record "$s" status - 0 "!${status[$s]}"
done
"$py" - "$results" "$n" "$rounds" "$cgkind" "$load0" "$load1" "$kiln" "$kpy" "$vpy" "$spy" <<'EOF'
import sys
path, n, rounds, cgkind, load0, load1, kiln, kpy, vpy, spy = sys.argv[1:]
peers = ["dali", "litdata", "streaming", "wds", "pillow-simd"]
vals = {}      # (side, row, col) -> list of values (floats) or failure strings
limits = {}
status = {}
for line in open(path):
    side, row, col, rnd, v = line.rstrip("\n").split("\t")
    if row == "status":
        status[side] = v[1:]
        continue
    if not v.startswith("!") and "@" in v:
        v, lim = v.split("@")
        limits.setdefault((side, row), []).append(int(lim))
    vals.setdefault((side, row, col), []).append(v)


def best(side, row, col, better=max):
    """(number or None, text): the best of the rounds; a failure text when none ran."""
    if side in status:
        return None, status[side]
    xs = vals.get((side, row, col))
    if not xs:
        return None, "not run"
    nums = [float(x) for x in xs if not x.startswith("!")]
    if nums:
        return better(nums), None
    return None, xs[-1][1:]


def mb(b):
    return "%.1f MB" % (b / 1e6)


rows = [("convert: images/s", "convert_s", "-"), ("bytes on disk", "bytes", "-")]
labels = {"rrc": "RandomResizedCrop(224)+flip", "center": "Resize(256)+CenterCrop(224)"}
for mode in ("rrc", "center"):
    rows.append((labels[mode] + ", warm: samples/s", mode, "warm"))
    rows.append((labels[mode] + ", cold: samples/s", mode, "cold"))
    rows.append((labels[mode] + ", cgroup: samples/s", mode, "cgroup"))

print(f"peers_bench: {n} images of the bench corpus, batch 256, 2 workers per side, float16 "
      f"ImageNet-normalized (B, 3, 224, 224) output; {rounds} interleaved round(s), each figure the "
      f"best of its rounds; load average {load0} -> {load1}")
print()
print("| row | peer | kiln | peer | kiln/peer |")
print("| --- | --- | ---: | ---: | ---: |")
for label, row, col in rows:
    for p in peers:
        ratio = "-"
        if row == "convert_s":
            k, kerr = best("kiln", row, col, min)
            v, verr = best(p, row, col, min)
            kc = "%.0f (%.1f s)" % (int(n) / k, k) if k else kerr
            pc = "%.0f (%.1f s)" % (int(n) / v, v) if v else verr
            if k and v:
                ratio = "%.2f" % (v / k)
        elif row == "bytes":
            k, kerr = best("kiln", row, col)
            v, verr = best(p, row, col)
            kc = mb(k) if k else kerr
            pc = (mb(v) + (" (the corpus's own files)" if p == "dali" else "")) if v else verr
            if k and v:
                ratio = "%.2f" % (k / v)
        elif col == "cgroup" and cgkind == "none":
            kc = pc = "not measured: no cgroup control here"
        else:
            k, kerr = best("kiln", row, col)
            v, verr = best(p, row, col)
            kc = "%.0f" % k if k else kerr
            pc = "%.0f" % v if v else verr
            if col == "cgroup" and k:
                kc += " (limit %s)" % mb(min(limits[("kiln", row)]))
            if col == "cgroup" and v:
                pc += " (limit %s)" % mb(min(limits[(p, row)]))
            if k and v:
                ratio = "%.2f" % (k / v)
        print(f"| {label} | {p} | {kc} | {pc} | {ratio} |")
print()
print("kiln/peer: kiln's samples/s (convert: images/s) over the peer's, so > 1 means kiln is faster; "
      "bytes: kiln's over the peer's, so > 1 means kiln's data is larger. Convert ran once per side.")
print("warm: the side's files read twice just before; cold: dropped from the page cache "
      "(posix_fadvise DONTNEED on each file) just before; cgroup: cold, in a memory cgroup "
      "limited to the side's own memory (the larger of its peak anonymous + shared memory and the "
      "kernel's peak charge of its warm run, libraries and kernel memory included) plus a third of "
      "its data's bytes (the data cannot all stay cached). Each epoch is timed from "
      "before its dataset/loader is made (worker start-up included) to its last batch, in a fresh "
      "process; Python imports are not timed.")
print()
print("Configurations (each file's docstring says why, with its source):")
print(f"  kiln:        {kiln} build --max-side 256 --dtype uint8 --norm imagenet --threads 2 "
      "(uint8 pixels, each image whole, longer side <= 256, in LMDB shards); kiln.Loader(batch_size=256, "
      "workers=2, dtype=torch.float16, crop=kiln.RandomResizedCrop(224), flip=True | "
      f"crop=kiln.ResizeCenterCrop(256, 224), shuffle=False) with {kpy} (bench/peers_bench_kiln.py)")
print("  dali:        nvidia-dali-cuda120, CPU-only pipeline (device_id=None, num_threads=2, "
      "prefetch_queue_depth 2): readers.file over the corpus's own JPEG/PNG files (no convert; "
      "shorter side 256-500 px) + decoders.image_random_crop(cpu) + resize 224 | decoders.image(cpu) "
      "+ resize(resize_shorter=256); crop_mirror_normalize(FLOAT16, CHW); DALIGenericIterator")
print("  litdata:     optimize(num_workers=2, chunk_bytes <= 64MB and >= 8 chunks) of "
      "litdata.Jpeg(bytes=JPEG q90, longer side <= 256), inputs shuffled; StreamingDataset(shuffle) "
      "read in place + StreamingDataLoader(num_workers=2); torchvision v2 transforms")
print("  streaming:   MDSWriter(columns image: bytes (JPEG q90, longer side <= 256), label: int; "
      "shards <= 64 MiB and >= 8) fed by a Pool(2); StreamingDataset(local=OUT, remote=None, "
      "shuffle, batch_size=256) + StreamingDataLoader(num_workers=2); PIL decode, torchvision v2")
print("  wds:         ShardWriter, 16 tar shards of JPEG q90 (longer side <= 256), fed by a Pool(2); "
      "WebDataset(shardshuffle).shuffle(1000).decode('pil').map_tuple(transform).batched(256) + "
      "WebLoader(batch_size=None, num_workers=2); torchvision v2")
print("  pillow-simd: Pillow-SIMD (CC='cc -mavx2') in place of Pillow; a Pool(2) writes JPEG q90 files "
      "(longer side <= 256); torchvision ImageFolder + DataLoader(num_workers=2); torchvision v2")
print(f"  peers venv:  {vpy} (bench/peers/requirements.txt); Pillow-SIMD: {spy}")
if cgkind == "none":
    print("cgroup: not measured: no cgroup control here (needs root and a writable memory cgroup, "
          "v1 or v2)")
for p in peers:
    if p in status:
        print(f"{p}: {status[p]}")
EOF
exit 0
