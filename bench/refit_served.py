#!/usr/bin/env python3
"""Refits a profile's served factors from the served levels it recorded, by
the rule `pdq profile` uses since 85a16df (FitServed in
tools/profile_command.cc): least squares on relative error, each level
weighted by its steps, over served_factor and served_pair_factor >= 1.

Usage: bench/refit_served.py PROFILE.json > REFIT.json
(for a profile measured before that rule; bench/RESULTS.md, the third Zen 4 set)
"""
import json
import sys


def refit(levels):
    nn = nt = tt = ns = ts = 0.0
    for l in levels:
        w = l["steps"] / l["step_seconds"] ** 2
        n = l["model_seconds"] - l["model_pair_seconds"]
        t = l["model_pair_seconds"]
        s = l["step_seconds"]
        nn += w * n * n
        nt += w * n * t
        tt += w * t * t
        ns += w * n * s
        ts += w * t * s
    if nn <= 0:
        return None
    if tt <= 0:
        a = max(1.0, ns / nn)
        return a, a

    def residual(a, b):
        return a * a * nn + 2 * a * b * nt + b * b * tt - 2 * a * ns - 2 * b * ts

    candidates = [(1.0, max(1.0, (ts - nt) / tt)), (max(1.0, (ns - nt) / nn), 1.0)]
    det = nn * tt - nt * nt
    if det > 1e-12 * nn * tt:
        a = (ns * tt - ts * nt) / det
        b = (nn * ts - nt * ns) / det
        if a >= 1 and b >= 1:
            candidates.append((a, b))
    best = candidates[0]
    for c in candidates:
        if residual(*c) < residual(*best):
            best = c
    return best


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    p = json.load(open(sys.argv[1]))
    for q in p["passes"]:
        if not q.get("served"):
            continue
        f = refit(q["served"])
        if f is None:
            continue
        print(f"{q['precision']} at {q['threads']} threads: served_factor "
              f"{q.get('served_factor', 0):.3f} -> {f[0]:.3f}, served_pair_factor "
              f"{q.get('served_pair_factor', 0):.3f} -> {f[1]:.3f}", file=sys.stderr)
        q["served_factor"], q["served_pair_factor"] = f
    json.dump(p, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
