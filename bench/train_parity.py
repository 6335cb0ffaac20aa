"""The Python side of bench/train_parity.sh: the models, their TorchScript export
for kiln, and a plain PyTorch training loop to compare kiln train with.

  train_parity.py export MODEL OUT.pt [--seed S]
      torch.jit.script(MODEL) saved for `kiln train --model OUT.pt`.
  train_parity.py train MODEL (--png ROOT | --cache TRAIN_CACHE --val-cache VAL_CACHE)
                  --epochs N [--workers 2] [--seed S] [--threads N] [--loader torch|kiln]
                  [--precision fp32|bf16] [--device cpu|cuda]
      Trains MODEL in eager mode, as a user would, with kiln train's hyper-parameters
      of the benchmark: batch 128 (whole batches only), SGD momentum 0.9 Nesterov,
      lr 0.05 one-cycle (torch.optim.lr_scheduler.OneCycleLR: kiln's onecycle),
      weight decay 5e-4. --png: torchvision ImageFolder + DataLoader over ROOT/train and
      ROOT/test (PNG decoded every epoch); --cache: over kiln caches (the same data kiln
      trains on), through tools/kiln_torch.py's KilnDataset and a DataLoader, or with
      --loader kiln through kiln.Loader (kiln's C++ loader, `workers` threads, the batch
      order of kiln train's for the same seed), or with --loader device through no loader at
      all: random batches of the cache's shape and classes made once on the device and
      reused (a loader that costs nothing; where the kiln module cannot be built, as on
      the GPU machine of tools/gpu_check.sh). --precision bf16: the forward pass under
      torch.autocast(device, dtype=torch.bfloat16), the loss in fp32 on the float
      logits, as kiln train does. --device cuda: model and batches on the GPU (seconds
      end with torch.cuda.synchronize()). Prints one JSON line per epoch:
      {"epoch", "seconds", "samples_per_s", "val_top1"}; seconds count the training
      loop (data waits included), not the evaluation, as kiln's epoch seconds do;
      "profile_seconds" splits them by phase like kiln train --profile.

MODEL: parity_cnn (conv-BN-ReLU x4, two max-pools, Linear 1568->128, dropout 0.25,
Linear 128->10, for 1x28x28), kiln_cnn (kiln's built-in cnn, layer for layer), or
resnet18 (torchvision's, with the cache's class count).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ParityCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(32)
        self.conv4 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn4 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.conv3(x)))
        x = F.max_pool2d(F.relu(self.bn4(self.conv4(x))), 2)
        x = torch.flatten(x, 1)
        return self.fc(self.drop(F.relu(self.fc1(x))))


class KilnCNN(nn.Module):
    """src/train/builtin_models.cc's Cnn: conv-BN-ReLU 32, pool, 64, pool, 128, adaptive 2x2, fc."""

    def __init__(self, channels=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(128)
        self.fc = nn.Linear(128 * 4, classes)
        for m in (self.conv1, self.conv2, self.conv3):  # kiln's (torchvision's) init
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 2), 1)
        return self.fc(x)


def make_model(name, classes, channels):
    if name == "parity_cnn":
        return ParityCNN(classes)
    if name == "kiln_cnn":
        return KilnCNN(channels, classes)
    if name == "resnet18":
        import torchvision
        m = torchvision.models.resnet18(num_classes=classes)
        if channels != 3:
            m.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        return m
    sys.exit(f"train_parity.py: unknown model {name}")


def kiln_loaders(a):
    """kiln.Loader over the caches, as kiln train reads them: seeded shuffle, whole
    batches; evaluation sequential, every sample."""
    import kiln
    train = kiln.Loader(a.cache, batch_size=128, shuffle=True, seed=a.seed, drop_last=True,
                        workers=a.workers)
    val = kiln.Loader(a.val_cache, batch_size=256, shuffle=False, drop_last=False,
                      workers=a.workers)
    normalize = train.normalize if train.cache.dtype == "uint8" else None
    return train, val, normalize, len(train.cache.classes), train.cache.shape[0]


def device_loaders(a):
    """Random batches on the device in the shape of the cache's records (its manifest),
    made once: the training loop without any data loading."""
    with open(os.path.join(a.cache, "manifest.json")) as f:
        m = json.load(f)
    shape, classes = m["sample"]["shape"], len(m["classes"])
    g = torch.Generator().manual_seed(a.seed)
    batches = [(torch.randn([128] + shape, generator=g).to(a.device),
                torch.randint(0, classes, (128,), generator=g).to(a.device)) for _ in range(8)]

    class Batches:
        def __len__(self):
            return m["count"] // 128

        def __iter__(self):
            return (batches[i % len(batches)] for i in range(len(self)))

    return Batches(), batches[:2], None, classes, shape[0]


def loaders(a):
    if a.loader == "kiln":
        return kiln_loaders(a)
    if a.loader == "device":
        return device_loaders(a)
    if a.png:
        import torchvision
        import torchvision.transforms as T
        tf = T.Compose([T.Grayscale(1), T.ToTensor(), T.Normalize((0.2860,), (0.3530,))])
        train = torchvision.datasets.ImageFolder(os.path.join(a.png, "train"), transform=tf)
        val = torchvision.datasets.ImageFolder(os.path.join(a.png, "test"), transform=tf)
        normalize = None
        classes, channels = len(train.classes), 1
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
        from kiln_torch import KilnDataset
        train, val = KilnDataset(a.cache), KilnDataset(a.val_cache)
        normalize = train.normalize
        classes, channels = len(train.classes), train.shape[0]
    g = torch.Generator()
    g.manual_seed(a.seed)
    kw = dict(num_workers=a.workers, persistent_workers=a.workers > 0)
    tl = torch.utils.data.DataLoader(train, batch_size=128, shuffle=True, drop_last=True,
                                     generator=g, **kw)
    vl = torch.utils.data.DataLoader(val, batch_size=256, shuffle=False, **kw)
    return tl, vl, normalize, classes, channels


def train(a):
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tl, vl, normalize, classes, channels = loaders(a)
    model = make_model(a.model, classes, channels).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=len(tl) * a.epochs)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16")
    cuda = a.device == "cuda"
    clock = time.perf_counter
    for epoch in range(a.epochs):
        model.train()
        n = steps = 0
        phase = dict(data_wait=0.0, forward=0.0, backward=0.0, optimizer=0.0)
        t0 = t = clock()
        it = iter(tl)
        while True:
            # The phases of kiln train --profile: data wait (the next batch, its
            # normalization and conversion), forward with the loss, backward,
            # optimizer (zero_grad, step, schedule). A few clock reads a step.
            try:
                x, y = next(it)
            except StopIteration:
                break
            if normalize is not None:
                x = normalize(x)
            x = x.to(a.device, non_blocking=True).float()
            y = y.to(a.device, non_blocking=True)
            u = clock(); phase["data_wait"] += u - t; t = u
            with autocast:
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            u = clock(); phase["forward"] += u - t; t = u
            opt.zero_grad()
            u = clock(); phase["optimizer"] += u - t; t = u
            loss.backward()
            u = clock(); phase["backward"] += u - t; t = u
            opt.step()
            sched.step()
            u = clock(); phase["optimizer"] += u - t; t = u
            n += x.size(0)
            steps += 1
        if cuda:
            torch.cuda.synchronize()
        seconds = clock() - t0
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in vl:
                if normalize is not None:
                    x = normalize(x)
                x, y = x.to(a.device), y.to(a.device)
                with autocast:
                    logits = model(x.float())
                correct += (logits.argmax(1) == y).sum().item()
                total += y.numel()
        print(json.dumps({"epoch": epoch + 1, "seconds": seconds, "samples_per_s": n / seconds,
                          "val_top1": correct / total,
                          "profile_seconds": dict(steps=steps, seconds=seconds, **phase)}),
              flush=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("model")
    e.add_argument("out")
    e.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("model")
    t.add_argument("--png")
    t.add_argument("--cache")
    t.add_argument("--val-cache")
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0,
                   help="intra-op threads (torch.set_num_threads); 0: LibTorch's default")
    t.add_argument("--loader", choices=("torch", "kiln", "device"), default="torch",
                   help="with --cache: a DataLoader over kiln_torch.py (torch), kiln.Loader, or "
                        "random batches made once on the device (device)")
    t.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    t.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = p.parse_args()
    if a.cmd == "export":
        torch.manual_seed(a.seed)
        torch.jit.script(make_model(a.model, 10, 1)).save(a.out)
    else:
        if bool(a.png) == bool(a.cache and a.val_cache):
            sys.exit("train_parity.py train: give --png ROOT, or --cache and --val-cache")
        if a.loader != "torch" and not a.cache:
            sys.exit("train_parity.py train: --loader %s reads --cache and --val-cache" % a.loader)
        train(a)


if __name__ == "__main__":
    main()
