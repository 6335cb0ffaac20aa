#!/usr/bin/python3
"""kiln plot METRICS.jsonl -o curves.png: training curves from kiln train --metrics.

`kiln train --metrics FILE` writes one JSON object per line: {"kind": "step", ...}
at every --log-every step (loss, acc, lr, samples_per_s) and {"kind": "epoch", ...}
after each epoch (train_loss, train_acc, samples_per_s, data_wait_share, and
val_loss/val_top1/val_top5 with --val). This draws four panels against the
optimizer step: loss, accuracy, samples/s and the share of each epoch spent
waiting for data. Epoch points are marked; step lines are thinner.

Needs /usr/bin/python3 with matplotlib (Debian: python3-matplotlib, which
tools/setup.sh installs). Exit status 0 ok, 1 the metrics file is unreadable
or holds nothing to plot, 2 usage error or matplotlib missing.
"""
import argparse
import json
import os
import sys

USAGE = "kiln plot METRICS.jsonl -o curves.png [--title T] [--width IN --height IN --dpi N]"


def fail(code, message):
    print("kiln plot: " + message, file=sys.stderr)
    sys.exit(code)


def read_metrics(path):
    """(steps, epochs): the records of each kind, in file order."""
    steps, epochs = [], []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        fail(1, "cannot read %s: %s" % (path, e.strerror or e))
    with f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                fail(1, "%s line %d is not JSON (%s): is it a file kiln train --metrics "
                        "wrote? A run killed mid-write leaves a cut last line; delete it "
                        "and plot again" % (path, number, e))
            if not isinstance(record, dict):
                fail(1, "%s line %d is not a JSON object" % (path, number))
            kind = record.get("kind")
            if kind == "step":
                steps.append(record)
            elif kind == "epoch":
                epochs.append(record)
            # other kinds (future additions) are ignored
    return steps, epochs


def series(records, key):
    xs = [r["step"] for r in records if isinstance(r.get(key), (int, float))
          and isinstance(r.get("step"), (int, float))]
    ys = [r[key] for r in records if isinstance(r.get(key), (int, float))
          and isinstance(r.get("step"), (int, float))]
    return xs, ys


def main(argv):
    if argv and argv[0] == "plot":  # run as `kiln plot ...`
        argv = argv[1:]
    ap = argparse.ArgumentParser(prog="kiln plot", usage=USAGE, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Examples:\n"
                                        "  kiln plot m.jsonl -o curves.png\n"
                                        "  kiln train --data OUT/train --val OUT/val "
                                        "--metrics m.jsonl && kiln plot m.jsonl -o curves.svg")
    ap.add_argument("metrics", help="the JSON-lines file of kiln train --metrics")
    ap.add_argument("-o", "--output", required=True, help="the image to write (.png, .svg, .pdf)")
    ap.add_argument("--title", default=None, help="figure title (default: the metrics file name)")
    ap.add_argument("--width", type=float, default=11.0, help="inches (default 11)")
    ap.add_argument("--height", type=float, default=7.0, help="inches (default 7)")
    ap.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
    a = ap.parse_args(argv)
    if a.width <= 0 or a.height <= 0 or a.dpi <= 0:
        fail(2, "--width, --height and --dpi must be positive")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(2, "needs matplotlib for %s (Debian: apt-get install python3-matplotlib)"
             % sys.executable)

    steps, epochs = read_metrics(a.metrics)
    if not steps and not epochs:
        fail(1, "%s holds no step or epoch records: was it written by kiln train --metrics?"
             % a.metrics)

    fig, axes = plt.subplots(2, 2, figsize=(a.width, a.height), dpi=a.dpi, sharex=True)
    (loss_ax, acc_ax), (rate_ax, wait_ax) = axes

    def draw(ax, records, key, label, scale=1.0, epoch=False):
        xs, ys = series(records, key)
        if not xs:
            return 0
        ys = [y * scale for y in ys]
        if epoch:
            ax.plot(xs, ys, marker="o", linewidth=1.8, label=label)
        else:
            ax.plot(xs, ys, linewidth=0.8, alpha=0.6, label=label)
        return len(xs)

    drawn = 0
    drawn += draw(loss_ax, steps, "loss", "train loss (log steps)")
    drawn += draw(loss_ax, epochs, "train_loss", "train loss (epoch)", epoch=True)
    drawn += draw(loss_ax, epochs, "val_loss", "val loss", epoch=True)
    drawn += draw(acc_ax, steps, "acc", "train acc (log steps)", 100)
    drawn += draw(acc_ax, epochs, "train_acc", "train acc (epoch)", 100, epoch=True)
    drawn += draw(acc_ax, epochs, "val_top1", "val top-1", 100, epoch=True)
    drawn += draw(acc_ax, epochs, "val_top5", "val top-5", 100, epoch=True)
    drawn += draw(rate_ax, steps, "samples_per_s", "log steps")
    drawn += draw(rate_ax, epochs, "samples_per_s", "epoch", epoch=True)
    drawn += draw(wait_ax, epochs, "data_wait_share", "waited for data", 100, epoch=True)
    if drawn == 0:
        fail(1, "%s: its records carry none of loss, acc, samples_per_s, data_wait_share"
             % a.metrics)

    loss_ax.set_ylabel("loss")
    acc_ax.set_ylabel("accuracy, %")
    rate_ax.set_ylabel("samples/s")
    wait_ax.set_ylabel("data wait, % of epoch")
    wait_ax.axhline(10, color="grey", linestyle=":", linewidth=1)  # kiln train's bottleneck line
    for ax in (rate_ax, wait_ax):
        ax.set_xlabel("optimizer step")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(a.title if a.title is not None else os.path.basename(a.metrics))
    fig.tight_layout()
    try:
        fig.savefig(a.output)
    except (OSError, ValueError) as e:
        fail(2, "cannot write %s: %s" % (a.output, e))
    width, height = fig.canvas.get_width_height()
    print("kiln plot: %d epochs, %d log steps -> %s (%dx%d)"
          % (len(epochs), len(steps), a.output, width, height))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
