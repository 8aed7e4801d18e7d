#!/usr/bin/env python3
"""How well a profile's step model meets its own passes at 8 rows and more.

For each pass of a `pdq profile` file: the relative error, at each sample of
8 or more decode rows, of (a) the profile's model and (b) the model the
profile held before 2026-12-06 refitted to the same samples: four parts
(decode and prompt attention pairs at one price) fitted to the passes of at
most 16 decode rows (the old grid's rows; its decode rows beside prompt
chunks were at 4 and 16 rows, the new grid's at 4 and 64, so the refit has
the 4-row ones only), with its row steps where they cut the error on every
fourth of those passes held out, as pdq profile decides. Both fits solve as
policy::FitStepTime does (non-negative least squares on relative error,
every subset of the parts, a subset with more parts kept only for a residual
smaller by more than 1e-9 of the total). Standard library only.

  python3 bench/step_model_check.py PROFILE.json
"""
import itertools
import json
import sys


def features(x, five):
    rows, tokens, pairs = x["rows"], x["tokens"], x["pairs"]
    decode = x.get("decode_pairs", pairs if tokens == 0 else pairs - tokens * tokens / 2)
    if rows == 0:
        decode = 0
    return [1, rows, tokens, pairs - decode, decode] if five else [1, rows, tokens, pairs]


def solve(a, b):
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    size = max(abs(a[i][i]) for i in range(n))
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if not abs(m[c][c]) > 1e-10 * size:
            return None
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [u - f * v for u, v in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(samples, five):
    xs = [features(x, five) for x in samples]
    ys = [x["seconds"] for x in samples]
    n = len(xs[0])
    scale = [max(abs(x[i]) for x in xs) or 1 for i in range(n)]
    total = sum(1 for _ in ys)  # sum of (y / y)^2
    best, best_res = [0.0] * n, float("inf")
    for k in range(1, n + 1):
        for idx in itertools.combinations(range(n), k):
            if any(all(x[i] == 0 for x in xs) for i in idx):
                continue
            # Weighted by 1 / seconds^2: relative error.
            a = [[sum(x[i] / scale[i] * x[j] / scale[j] / y / y for x, y in zip(xs, ys)) for j in idx]
                 for i in idx]
            b = [sum(x[i] / scale[i] / y for x, y in zip(xs, ys)) for i in idx]
            c = solve(a, b)
            if c is None or any(v < 0 for v in c):
                continue
            g = [0.0] * n
            for i, v in zip(idx, c):
                g[i] = v / scale[i]
            res = sum((sum(gi * xi for gi, xi in zip(g, x)) - y) ** 2 / y / y for x, y in zip(xs, ys))
            if res < best_res - 1e-9 * total:
                best, best_res = g, res
    return best


def row_steps(g, samples, five):
    at = {}
    for x in samples:
        if x["tokens"] == 0 and x["rows"] >= 1:
            line = sum(a * b for a, b in zip(g, features(x, five)))
            at.setdefault(x["rows"], []).append(x["seconds"] - line)
    return sorted((r, sum(v) / len(v)) for r, v in at.items())


def row_step(steps, rows):  # PassTime::RowStep
    if not steps:
        return 0
    if rows <= steps[0][0]:
        return steps[0][1]
    for (r0, s0), (r1, s1) in zip(steps, steps[1:]):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    return steps[-1][1]


def model(g, steps, x, five):
    return sum(a * b for a, b in zip(g, features(x, five))) + row_step(steps, x["rows"] + x["tokens"])


def old_model(samples):
    """Four parts on the passes of at most 16 rows, steps kept as pdq profile keeps them."""
    grid = [x for x in samples if x["rows"] <= 16]
    fitted = [x for i, x in enumerate(grid) if i % 4 != 1]
    held = [x for i, x in enumerate(grid) if i % 4 == 1]
    if not fitted or not held:
        sys.exit("step_model_check: too few passes of at most 16 rows to refit the old model")
    g = fit(fitted, False)
    steps = row_steps(g, fitted, False)
    def median(v):
        v = sorted(v)
        return v[len(v) // 2]
    stepped = median([abs(model(g, steps, x, False) / x["seconds"] - 1) for x in held])
    straight = median([abs(model(g, [], x, False) / x["seconds"] - 1) for x in held])
    g = fit(grid, False)
    return g, (row_steps(g, grid, False) if stepped < straight else [])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    profile = json.load(open(sys.argv[1]))
    for p in profile["passes"]:
        samples = p.get("samples", [])
        if not samples:
            continue
        five = [p["fixed"], p["per_row"], p["per_token"], p["per_pair"],
                p.get("per_decode_pair", p["per_pair"])]
        old, old_steps = old_model(samples)
        print(f"{p['precision']} at {p['threads']} threads: model / measured - 1")
        print("| rows | prompt tokens | context | measured | the profile's model | four parts, rows <= 16 |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for x in samples:
            if x["rows"] < 8:
                continue
            decode = features(x, True)[4]
            new = model(five, p.get("row_steps", []), x, True)
            was = model(old, old_steps, x, False)
            print(f"| {x['rows']} | {x['tokens']} | {decode / x['rows'] - 0.5:.0f} | "
                  f"{x['seconds'] * 1e3:.2f} ms | {new / x['seconds'] - 1:+.0%} | {was / x['seconds'] - 1:+.0%} |")


if __name__ == "__main__":
    main()
