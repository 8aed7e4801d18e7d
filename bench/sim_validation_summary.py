#!/usr/bin/env python3
"""Issue 24's validation in one table: every committed comparison of `pdq sim`
against real runs (bench/sim_validation.sh compare, compare-open and
compare-emulated write them) with, for each metric, the cells within the
issue's bound and the bias, and whether the predictions were committed before
the runs they are checked against (from git: the first commit of the set's
predicted directory against that of its measured one).

Usage: bench/sim_validation_summary.py [--all] [DIR]   (DIR: bench/sim_validation)

Prints markdown: one row per set and tier for its primary comparison
(validation-predicted.md, validation-open.md, validation-emulated.md; --all:
every comparison, the variants tried on the same runs too), then the pooled
cells of each tier's primary comparisons whose predictions came first.
Reads only the committed validation-*.md files and git's history; runs
nothing.
"""

import os
import re
import statistics
import subprocess
import sys

METRICS = ["ttft p50", "ttft p90", "ttft p99", "tpot p50", "tpot p90", "tpot p99", "out"]
HEADERS = {"TTFT p50 (ms)": "ttft p50", "TTFT p90 (ms)": "ttft p90", "TTFT p99 (ms)": "ttft p99",
           "TPOT p50 (ms)": "tpot p50", "TPOT p90 (ms)": "tpot p90", "TPOT p99 (ms)": "tpot p99",
           "output tokens/s": "out"}
PRIMARY = {"validation-predicted.md": "closed loop", "validation-open.md": "open loop",
           "validation-emulated.md": "emulation tier"}
HOSTS = {"zen1": "AMD EPYC Zen 1", "zen3": "AMD EPYC Zen 3", "zen4": "AMD EPYC Zen 4",
         "emr": "Intel Xeon (Emerald Rapids)"}
CELL = re.compile(r"^\S+ / \S+ \(([+-]?\d+)%, ±\d+%\)( \*\*)?$")


def tier_of(name):
    if name.startswith("validation-open"):
        return "open loop"
    if name.startswith("validation-emulated"):
        return "emulation tier"
    return "closed loop"


def dirs_of(set_dir, name):
    """The predicted and measured directories a validation file compares."""
    tag = name[len("validation-"):-len(".md")]
    tag = tag[:-len("-matched")] if tag.endswith("-matched") else tag
    predicted = tag if tag.startswith("predicted") else "predicted-" + tag
    rest = tag[len("predicted"):] if tag.startswith("predicted") else "-" + tag
    parts = rest.split("-")[1:]
    for n in range(len(parts), -1, -1):
        measured = "-".join(["measured"] + parts[:n])
        if os.path.isdir(os.path.join(set_dir, measured)):
            return predicted, measured
    return predicted, None


def git(path, *args):
    """git's output for args, run beside path; None where git is missing or
    fails (a copy outside git)."""
    try:
        run = subprocess.run(["git", *args], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return run.stdout if run.returncode == 0 else None


def first_commit(path):
    """The commit that first added files under path, or None."""
    out = git(path, "log", "--diff-filter=A", "--format=%h", "--", os.path.abspath(path))
    lines = [line for line in (out or "").split("\n") if line.strip()]
    return lines[-1] if lines else None


def order(set_dir, name):
    """Whether the predictions were committed before the runs, by ancestry."""
    predicted, measured = dirs_of(set_dir, name)
    p = first_commit(os.path.join(set_dir, predicted)) if os.path.isdir(
        os.path.join(set_dir, predicted)) else None
    m = first_commit(os.path.join(set_dir, measured)) if measured else None
    if not p or not m:
        return "unknown", "unknown (no git history of its predicted and measured directories)"
    if p == m:
        return "with", f"with the runs ({p})"
    if git(set_dir, "merge-base", "--is-ancestor", p, m) is not None:
        return "before", f"before the runs ({p} < {m})"
    return "after", f"after the runs ({p} > {m})"


def cells(path):
    """Each metric's cells: (error %, within the bound), and the rows."""
    by_metric = {m: [] for m in METRICS}
    rows = 0
    columns = None
    for line in open(path):
        if not line.startswith("| "):
            continue
        fields = [f.strip() for f in line.strip().strip("|").split("|")]
        if fields[0] == "deployment":
            columns = fields
            continue
        if columns is None or fields[0].startswith("---") or fields[0] == "metric":
            if fields[0] == "metric":
                columns = None
            continue
        rows += 1
        for header, value in zip(columns, fields):
            metric = HEADERS.get(header)
            match = CELL.match(value) if metric else None
            if match:
                by_metric[metric].append((int(match.group(1)), match.group(2) is None))
    return by_metric, rows


def summary(values):
    if not values:
        return ""
    within = sum(1 for _, ok in values if ok)
    bias = statistics.mean(e for e, _ in values)
    return f"{within}/{len(values)} ({bias:+.0f}%)"


def main():
    args = sys.argv[1:]
    every = "--all" in args
    args = [a for a in args if a != "--all"]
    if any(a.startswith("-") for a in args) or len(args) > 1:
        sys.exit(__doc__)
    root = args[0] if args else "bench/sim_validation"
    if not os.path.isdir(root):
        sys.exit(f"{root}: not a directory (want bench/sim_validation)")
    comparisons = []
    for set_name in sorted(os.listdir(root)):
        set_dir = os.path.join(root, set_name)
        if not os.path.isdir(set_dir):
            continue
        for name in sorted(os.listdir(set_dir)):
            if name.startswith("validation-") and name.endswith(".md") and (
                    every or name in PRIMARY):
                by_metric, rows = cells(os.path.join(set_dir, name))
                when, commits = order(set_dir, name)
                comparisons.append((set_name, name, tier_of(name), when, commits, by_metric, rows))

    print("| set | host | comparison | predictions | rows | " +
          " | ".join(m.replace("out", "throughput") for m in METRICS) + " |")
    print("| --- | --- | --- | --- | ---: | " + " | ".join("---:" for _ in METRICS) + " |")
    for set_name, name, tier, when, commits, by_metric, rows in comparisons:
        host = HOSTS.get(set_name.split("-")[0], set_name.split("-")[0])
        label = tier if name in PRIMARY else f"{tier}: {name[len('validation-'):-len('.md')]}"
        print(f"| {set_name} | {host} | {label} | {commits} | "
              f"{rows} | " + " | ".join(summary(by_metric[m]) for m in METRICS) + " |")

    print()
    print("| pooled: primary comparisons, predictions before the runs | sets | " +
          " | ".join(m.replace("out", "throughput") for m in METRICS) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in METRICS) + " |")
    for tier in PRIMARY.values():
        chosen = [c for c in comparisons if c[1] in PRIMARY and c[2] == tier and c[3] == "before"]
        hosts = sorted({c[0].split("-")[0] for c in chosen})
        for host in [None] + (hosts if len(hosts) > 1 else []):
            some = [c for c in chosen if host is None or c[0].split("-")[0] == host]
            label = tier if host is None else f"{tier}, {HOSTS.get(host, host)}"
            pooled = {m: [v for c in some for v in c[5][m]] for m in METRICS}
            print(f"| {label} | {len(some)} | " + " | ".join(summary(pooled[m]) for m in METRICS) +
                  " |")
    print()
    print("Each cell: cells within the bound / cells (their mean error, the bias). The bound is "
          "the larger of 10% (p99: 20%) and twice the runs' spread, throughput 10%; the emulation "
          "tier's 5% (p99: 10%). Errors are those the comparison files print, rounded to 1%.")


if __name__ == "__main__":
    main()
