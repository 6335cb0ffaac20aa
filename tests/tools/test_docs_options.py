#!/usr/bin/python3
"""Checks that the docs name every option the command line has.

Usage: test_docs_options.py KILN_BIN REPO_ROOT [KILN_TRAIN_BIN]

Reads the subcommands from `KILN_BIN --help` (the "Subcommands:" section of
CLI11's help), runs `KILN_BIN SUB --help` for each and takes every long option
(`--name`) it prints; each must appear, as the literal `--name`, in README.md
or docs/*.md under REPO_ROOT. The same for KILN_TRAIN_BIN when it is given and
exists. `--help` itself is not counted.

Exit 0 when the docs name every option, 1 (each missing one printed, with its
subcommand) otherwise, 77 (skipped) when KILN_BIN does not exist.
Standard library only.
"""
import glob
import os
import re
import subprocess
import sys

# A long option: two dashes at the start of a word, then letters, digits and
# single dashes ("--no-verify{false}" is --no-verify, "--augment TEXT:{...}" --augment).
LONG_OPTION = re.compile(r"(?<![\w-])--[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
IGNORED = {"--help"}


def run_help(args):
    p = subprocess.run(args + ["--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    return p.returncode, p.stdout


def subcommands(help_text):
    """The names listed under "Subcommands:" (CLI11; any case) in a --help text."""
    names, inside = [], False
    for line in help_text.splitlines():
        if re.match(r"^subcommands:\s*$", line.strip(), re.IGNORECASE):
            inside = True
            continue
        if not inside:
            continue
        if not line.strip():
            if names:
                break
            continue
        if not line.startswith(" "):  # the next section's heading
            break
        m = re.match(r"^\s+([A-Za-z0-9][\w-]*)(\s|$)", line)
        if m and line.startswith("  ") and not line.startswith(" " * 10):
            names.append(m.group(1))  # deeper lines are a wrapped description
    return names


def long_options(help_text):
    seen = []
    for name in LONG_OPTION.findall(help_text):
        if name not in IGNORED and name not in seen:
            seen.append(name)
    return seen


def docs_text(root):
    paths = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    text = []
    for p in paths:
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                text.append(f.read())
    return "\n".join(text), paths


def named_in(option, text):
    return re.search(r"(?<![\w-])" + re.escape(option) + r"(?![\w-])", text) is not None


def check(binary, docs, label):
    """Returns (missing [(subcommand, option)], problems [str], options checked)."""
    rc, top = run_help([binary])
    if rc != 0:
        return [], ["%s --help exited %d:\n%s" % (label, rc, top)], 0
    subs = subcommands(top)
    if not subs:  # a binary without subcommands: its own options
        subs = [None]
    missing, problems, checked = [], [], 0
    for sub in subs:
        args = [binary] + ([sub] if sub else [])
        rc, text = run_help(args)
        name = label + (" " + sub if sub else "")
        if rc != 0:
            # kiln train without kiln-train beside kiln (a build without LibTorch) says
            # it cannot run it: nothing of that subcommand to check in this build.
            if "cannot run" in text:
                print("note: %s --help: %s" % (name, text.strip().splitlines()[-1]))
                continue
            problems.append("%s --help exited %d:\n%s" % (name, rc, text))
            continue
        options = long_options(text)
        if not sub:
            options = [o for o in options if o != "--version"]
        if not options:
            problems.append("%s --help prints no long option:\n%s" % (name, text))
        for o in options:
            checked += 1
            if not named_in(o, docs):
                missing.append((name, o))
    return missing, problems, checked


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    kiln, root = sys.argv[1], sys.argv[2]
    if not os.path.exists(kiln):
        print("SKIP: %s does not exist" % kiln)
        return 77
    docs, paths = docs_text(root)
    if not docs:
        print("FAIL: no README.md or docs/*.md under %s" % root)
        return 1
    binaries = [(kiln, "kiln")]
    if len(sys.argv) == 4:
        if os.path.exists(sys.argv[3]):
            binaries.append((sys.argv[3], "kiln-train"))
        else:
            print("note: %s does not exist: kiln-train not checked" % sys.argv[3])
    missing, problems, checked = [], [], 0
    for binary, label in binaries:
        m, p, c = check(binary, docs, label)
        missing += m
        problems += p
        checked += c
    for p in problems:
        print("FAIL: " + p)
    for sub, option in missing:
        print("missing from README.md and docs/*.md: %s %s" % (sub, option))
    print("%d options checked against %d files: %d missing" % (checked, len(paths), len(missing)))
    return 1 if missing or problems else 0


if __name__ == "__main__":
    sys.exit(main())
