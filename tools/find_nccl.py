"""Prints the folder of nccl.h for kiln's NCCL build (tools/gpu_check.sh):
from the nvidia-nccl wheel next to PyTorch's, else CUDA's or the system's
include folders. Prints nothing when there is none."""
import glob
import os
import site
import sys

roots = [os.path.join(p, "nvidia") for p in site.getsitepackages() + [site.getusersitepackages()]]
roots += ["/usr/local/cuda/include", "/usr/include", "/usr/local/include"]
for root in roots:
    hits = sorted(glob.glob(os.path.join(root, "**", "nccl.h"), recursive=True))
    if hits:
        print(os.path.dirname(hits[0]))
        sys.exit(0)
