"""Where no CUDA device exists, every way of asking for one is refused the
same way: `kiln train --device cuda`, `kiln bench --device cuda`, `kiln
doctor --device cuda` and `kiln.Loader(device="cuda")` each say one line that
starts "no CUDA device:" (the commands exit 2) and write nothing.

Run as: test_no_cuda_device.py KILN_BIN SYNTH_BIN BUILD, BUILD being "cuda"
for a kiln built against a CUDA LibTorch (tools/setup.sh cuda-test) and
"cpu" for Debian's CPU-only one: the reason given must be that build's.
The GPUs of a machine that has some are hidden (CUDA_VISIBLE_DEVICES=""), so
the check means the same on a GPU machine. Exit 0 pass, 1 fail, 77 skipped.
"""
import os
import subprocess
import sys
import tempfile

SKIP = 1 if os.environ.get("KILN_TESTS_MUST_RUN") == "1" else 77
try:
    import torch
except ImportError as e:
    print("SKIP: %s lacks a module: %s" % (sys.executable, e))
    sys.exit(SKIP)
import kiln  # noqa: E402  (PYTHONPATH: build/python)

KILN, SYNTH, BUILD = sys.argv[1:4]
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def refused(name, args, reason, tmp):
    """Runs kiln ARGS; it must exit 2 with one line "kiln CMD: ... no CUDA
    device: --device cuda: REASON..." and leave tmp/out empty."""
    before = sorted(os.listdir(tmp))
    r = subprocess.run([KILN] + args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    print("  %s -> exit %d: %r" % (" ".join(args[:2]), r.returncode, lines))
    check(r.returncode == 2, "%s: exit 2 (got %d)" % (name, r.returncode))
    check(len(lines) == 1, "%s: one line (got %d)" % (name, len(lines)))
    text = lines[-1] if lines else ""
    check("no CUDA device: --device cuda: " in text, "%s: says 'no CUDA device: --device cuda:'"
          % name)
    check(reason in text, "%s: gives this build's reason (%r)" % (name, reason))
    check(sorted(os.listdir(tmp)) == before, "%s: writes nothing" % name)


with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "cache")
    subprocess.run([SYNTH, cache, "64", "1", "8", "8", "float32"], check=True,
                   stdout=subprocess.DEVNULL)
    work = os.path.join(tmp, "work")  # where the commands are told to write
    os.mkdir(work)
    why = "finds no GPU" if BUILD == "cuda" else "LibTorch without CUDA"
    refused("kiln train", ["train", "--data", cache, "--device", "cuda", "--model", "mlp",
                           "--epochs", "1", "--save", os.path.join(work, "ckpt"),
                           "--metrics", os.path.join(work, "m.jsonl"),
                           "--export", os.path.join(work, "model.pt")], why, work)
    refused("kiln bench", ["bench", cache, "--device", "cuda", "--epochs", "1"], why, work)
    # The doctor asks the driver itself (no LibTorch): its reason is the driver's.
    refused("kiln doctor", ["doctor", "--device", "cuda"], "", work)

    # kiln.Loader, in a child with the GPUs hidden before torch starts.
    code = ("import kiln, sys\n"
            "try:\n"
            "    kiln.Loader(kiln.Cache(sys.argv[1]), batch_size=8, device='cuda')\n"
            "except RuntimeError as e:\n"
            "    print(e); sys.exit(2)\n"
            "print('no error'); sys.exit(0)\n")
    r = subprocess.run([sys.executable, "-c", code, cache], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    out = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    print("  kiln.Loader(device='cuda') -> exit %d: %r" % (r.returncode, out))
    check(r.returncode == 2 and len(out) == 1 and out[0].startswith("no CUDA device: "),
          "kiln.Loader(device='cuda'): RuntimeError 'no CUDA device: ...', one line")
    torch_why = "built without CUDA" if torch.version.cuda is None else "finds no GPU"
    check(bool(out) and torch_why in out[0], "kiln.Loader: the reason of this torch (%r)"
          % torch_why)
    check(sorted(os.listdir(tmp)) == ["cache", "work"], "kiln.Loader: writes nothing")

print("%d checks failed" % len(failures) if failures else "all checks passed")
sys.exit(1 if failures else 0)
