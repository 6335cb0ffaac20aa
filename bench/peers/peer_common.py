#!/usr/bin/python3
"""What the peers of bench/peers_bench.sh share (bench/peers/*_peer.py import
it), and a small CLI for the script, standard library only:

  peer_common.py bytes PATH...   total size of the files under PATH (one number)
  peer_common.py warm PATH...    read every file under PATH twice (page cache warm)
  peer_common.py drop PATH...    posix_fadvise(POSIX_FADV_DONTNEED) on every file under
                                 PATH: out of the page cache, as `kiln bench --cold` and
                                 bench/cold_bench.sh do (no root needed)
  peer_common.py cgroup-probe    prints v1 or v2 when this process may make a memory
                                 cgroup (root and a writable controller), else none
  peer_common.py cgrun LIMIT -- CMD...
                                 CMD in a fresh memory cgroup, limited to LIMIT bytes (0:
                                 no limit); prints on stderr, after CMD ends,
                                   cgroup peak_bytes=P usage_peak=U limit=L oom_kills=K
                                 P: the highest anonymous + shared memory (memory.stat
                                 rss + shmem: what cannot be dropped like page cache)
                                 sampled every 20 ms; U: the kernel's own peak of all the
                                 memory charged to the cgroup (v1 memory.max_usage_in_bytes,
                                 v2 memory.peak; kernel memory included, page cache too -
                                 but not the pages of files read into the page cache
                                 before, which stay charged to whoever read them first).
                                 Exits with CMD's status (128 + N for signal N).

The work every side does per sample (the same on each side): the bench
corpus's images resized so that the longer side is at most 256 (PIL's
antialiased bilinear resize; the corpus's images are all larger), stored
(kiln: uint8 pixels; litdata, streaming, webdataset, pillow-simd: the same
JPEG bytes, quality 90), then per epoch RandomResizedCrop(224) + horizontal
flip (or Resize(256) + CenterCrop(224)) to float16 ImageNet-normalized CHW.
"""
import os
import sys
import time

MAX_SIDE = 256
JPEG_QUALITY = 90
CROP, RESIZE = 224, 256
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def listing(src):
    """(path, label) in ImageFolder order: sorted classes, sorted files."""
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    return [(os.path.join(src, c, f), label) for label, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(src, c)))]


def resized_jpeg(path):
    """One image as JPEG bytes (quality 90), RGB, longer side at most 256."""
    import io
    from PIL import Image
    im = Image.open(path).convert("RGB")
    f = MAX_SIDE / max(im.size)
    if f < 1:
        im = im.resize(tuple(max(1, round(s * f)) for s in im.size), Image.BILINEAR)
    out = io.BytesIO()
    im.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def transform(mode):
    """The per-sample transform of the Python peers: torchvision.transforms.v2
    on a PIL image or a uint8 CHW tensor (litdata decodes to one), output
    float16 (3, 224, 224) normalized. rrc: RandomResizedCrop(224) +
    RandomHorizontalFlip; center: Resize(256) + CenterCrop(224)."""
    import torch
    from torchvision.transforms import v2
    if mode == "rrc":
        geometry = [v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]
    elif mode == "center":
        geometry = [v2.Resize(RESIZE, antialias=True), v2.CenterCrop(CROP)]
    else:
        raise SystemExit("mode must be rrc or center, not %r" % mode)
    return v2.Compose(geometry + [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                  v2.Normalize(MEAN, STD), v2.ToDtype(torch.float16)])


def check_first(x, batch):
    """The first batch must be what kiln yields: float16 (B, 3, 224, 224),
    B <= batch, normalized (a normalized photo has values below 0): a peer
    that does less work fails here."""
    import torch
    assert x.dtype == torch.float16, "dtype %s, not float16" % x.dtype
    assert tuple(x.shape[1:]) == (3, CROP, CROP) and 0 < x.shape[0] <= batch, \
        "shape %s, not (<=%d, 3, %d, %d)" % (tuple(x.shape), batch, CROP, CROP)
    assert float(x.min()) < 0, "values not ImageNet-normalized (min %s)" % float(x.min())


def epoch_args(argv, usage):
    """epoch OUT rrc|center [workers=2] [batch=256] -> (out, mode, workers, batch)."""
    if len(argv) < 3 or argv[2] not in ("rrc", "center") or len(argv) > 5:
        sys.exit(usage)
    return argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 2, \
        int(argv[4]) if len(argv) > 4 else 256


def peer_main(usage, convert, epoch, before=lambda: None):
    """The command line every peer script shares:
    convert SRC OUT [workers=2] | epoch OUT rrc|center [workers] [batch]."""
    a = sys.argv[1:]
    if len(a) in (3, 4) and a[0] == "convert":
        before()
        convert(a[1], a[2], int(a[3]) if len(a) > 3 else 2)
    elif a and a[0] == "epoch":
        before()
        epoch(*epoch_args(a, usage))
    else:
        sys.exit(usage)


def timed_epoch(name, mode, batch, make_loader, images_of=lambda b: b[0]):
    """One epoch of make_loader()'s loader, timed from before make_loader
    (dataset and loader construction, worker start-up included) to the last
    batch. Prints: NAME_epoch mode=M images=N seconds=S images_per_s=R"""
    import torch
    torch.set_num_threads(1)  # each side's parallelism is its 2 workers
    t0 = time.perf_counter()
    loader = make_loader()
    n = 0
    for b in loader:
        x = images_of(b)
        if n == 0:
            check_first(x, batch)
        n += x.shape[0]
    dt = time.perf_counter() - t0
    print(f"{name}_epoch mode={mode} images={n} seconds={dt:.3f} images_per_s={n / dt:.1f}",
          flush=True)


def files_under(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
        for root, _, files in os.walk(p):
            for f in files:
                yield os.path.join(root, f)


def tree_bytes(paths):
    return sum(os.path.getsize(f) for f in files_under(paths))


def _cgroup_probe(parent, limit_file):
    """Whether a child cgroup made under parent has limit_file."""
    probe = os.path.join(parent, "kiln-peers-probe-%d" % os.getpid())
    try:
        os.mkdir(probe)
        ok = os.path.exists(os.path.join(probe, limit_file))
        os.rmdir(probe)
        return ok
    except OSError:
        return False


def _cgroup_kind():
    if os.geteuid() != 0:
        return "none"
    if os.path.isdir("/sys/fs/cgroup/memory") and \
            _cgroup_probe("/sys/fs/cgroup/memory", "memory.limit_in_bytes"):
        return "v1"
    if os.path.isfile("/sys/fs/cgroup/cgroup.controllers") and \
            _cgroup_probe("/sys/fs/cgroup", "memory.max"):
        return "v2"
    return "none"


def _stat(path):
    d = {}
    try:
        with open(path) as f:
            for line in f:
                k, v = line.split()[:2]
                d[k] = int(v)
    except (OSError, ValueError):
        pass
    return d


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def cgrun(limit, cmd):
    import subprocess
    kind = _cgroup_kind()
    if kind == "none":
        sys.exit("cgrun: no memory cgroup control here")
    base = "/sys/fs/cgroup/memory" if kind == "v1" else "/sys/fs/cgroup"
    cg = os.path.join(base, "kiln-peers-%d-%d" % (os.getpid(), time.time_ns() % 10**9))
    os.mkdir(cg)
    if limit > 0:
        with open(os.path.join(cg, "memory.limit_in_bytes" if kind == "v1" else "memory.max"),
                  "w") as f:
            f.write(str(limit))
        if kind == "v2":
            with open(os.path.join(cg, "memory.swap.max"), "w") as f:
                f.write("0")

    def enter():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    proc = subprocess.Popen(cmd, preexec_fn=enter)
    peak = 0
    while proc.poll() is None:
        s = _stat(os.path.join(cg, "memory.stat"))
        if kind == "v1":
            used = s.get("total_rss", s.get("rss", 0)) + s.get("total_shmem", s.get("shmem", 0))
        else:
            used = s.get("anon", 0) + s.get("shmem", 0)
        peak = max(peak, used)
        time.sleep(0.02)
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    usage = _read_int(os.path.join(cg, "memory.max_usage_in_bytes" if kind == "v1" else "memory.peak"))
    if kind == "v1":
        kills = _stat(os.path.join(cg, "memory.oom_control")).get("oom_kill", 0)
    else:
        kills = _stat(os.path.join(cg, "memory.events")).get("oom_kill", 0)
    for _ in range(50):
        try:
            os.rmdir(cg)
            break
        except OSError:
            time.sleep(0.1)
    print(f"cgroup peak_bytes={peak} usage_peak={usage} limit={limit} oom_kills={kills}",
          file=sys.stderr, flush=True)
    return rc


def main(argv):
    if len(argv) >= 1 and argv[0] == "bytes":
        print(tree_bytes(argv[1:]))
    elif len(argv) >= 1 and argv[0] == "warm":
        for _ in range(2):
            for f in files_under(argv[1:]):
                with open(f, "rb") as fh:
                    while fh.read(1 << 24):
                        pass
    elif len(argv) >= 1 and argv[0] == "drop":
        for f in files_under(argv[1:]):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    elif argv == ["cgroup-probe"]:
        print(_cgroup_kind())
    elif len(argv) >= 4 and argv[0] == "cgrun" and argv[2] == "--":
        return cgrun(int(argv[1]), argv[3:])
    else:
        sys.exit("usage: peer_common.py bytes|warm|drop PATH... | cgroup-probe | "
                 "cgrun LIMIT -- CMD...")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
