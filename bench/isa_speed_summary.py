#!/usr/bin/env python3
"""Tables of a bench/isa_speed.sh log: each round's pdq paths and llama.cpp
figures, and issue 25's targets as ratios within each round.

Usage: bench/isa_speed_summary.py LOG

LOG is isa_speed.sh's output (it keeps one and calls this at its end; a
saved one works too, and several joined one after another read as their
rounds in order). Markdown on stdout, in the shape of bench/RESULTS.md's
"AVX-512 and AMX kernels" tables. A figure the log lacks is left blank, so a
round cut short prints what it ran; a target's value is shown rounded down,
so that it reads as met exactly when it is.
"""
import json
import math
import re
import sys

# PDQ_ISA names, slowest first (isa_speed.sh's order): the last one a round
# ran is its fastest path, which the targets are taken on.
ISA_ORDER = ["avx2", "avxvnni", "avx512", "amx"]
ISA_LABEL = {"avx2": "avx2", "avxvnni": "avx2+vnni", "avx512": "avx512 (VNNI)",
             "amx": "avx512+amx"}
QUANTS = ("F16", "Q8_0", "Q4_0")


class LogError(Exception):
    pass


# ---- data ---------------------------------------------------------------


def run_kind(cmd, batch, precision):
    """Which of isa_speed.sh's runs a bench-engine command is; None for one
    it does not make (an older script's extra runs), which no table shows."""
    flags = set(re.findall(r"(--[a-z0-9-]+)", cmd)) - {
        "--precision", "--threads", "--prompt-tokens", "--gen-tokens", "--repetitions", "--json",
        "--batch", "--decode-context"}
    if batch == 1:
        if not flags:
            return precision
        return "fp16-output" if flags == {"--fp16-output", "--bf16-rows"} else None
    if not flags:
        return "b32"
    if flags == {"--batch-invariant"}:
        return "b32-invariant"
    if flags == {"--bf16-rows", "--w4a8-rows"}:
        return "b32-w4a8"
    return None


def parse(lines):
    """Rounds in order, each a dict: pdq[(isa, kind)] -> bench-engine JSON,
    llama[(quant, test)] -> tokens/s, batched -> S_TG tokens/s."""
    rounds, cmd, header = [], "", None
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if line.startswith("== round"):
            rounds.append({"pdq": {}, "llama": {}, "batched": None})
            continue
        if not rounds:
            continue
        r = rounds[-1]
        if line.startswith("+ "):
            cmd, header = line, None
            continue
        if line.startswith("{") and "bench-engine" in cmd:
            try:
                j = json.loads(line)
                isa = re.search(r"PDQ_ISA=(\S+)", cmd).group(1)
                kind = run_kind(cmd, j["batch"], j["precision"])
            except (ValueError, KeyError, AttributeError) as e:
                raise LogError(f"line {number}: not a bench-engine result of isa_speed.sh ({e})")
            if kind is not None:
                if (isa, kind) in r["pdq"]:
                    raise LogError(f"line {number}: round {len(rounds)} has two {isa} {kind} runs")
                r["pdq"][(isa, kind)] = j
        elif line.startswith("|") and ("llama-bench" in cmd or "llama-batched-bench" in cmd):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells  # the first row names the columns
            elif len(cells) == len(header) and not set(cells[0]) <= set("-: "):
                row = dict(zip(header, cells))
                if "llama-batched-bench" in cmd:
                    r["batched"] = float(row["S_TG t/s"])
                else:
                    quant = re.search(r"\b(F16|Q8_0|Q4_0)\b", row.get("model", ""))
                    if quant and "test" in row and "t/s" in row:
                        r["llama"][(quant.group(1), row["test"])] = float(row["t/s"].split()[0])
    return rounds


def paths(r):
    return [i for i in ISA_ORDER if any(k[0] == i for k in r["pdq"])]


def top_path(r):
    """The round's fastest path (the last it ran), or None."""
    ran = paths(r)
    return ran[-1] if ran else None


def get(r, isa, kind, key):
    j = r["pdq"].get((isa, kind))
    return None if j is None else j.get(key)


def ratio(a, b):
    return a / b if a is not None and b else None


def best_llama_pp(r):
    pp = [v for (q, t), v in r["llama"].items() if t == "pp512"]
    return max(pp) if pp else None


def against_avx2(r):
    top = top_path(r)
    if top in ("avx2", None) or "avx2" not in paths(r):
        return None
    pairs = [("w8a8", "prefill_tokens_per_s"), ("w4a16", "prefill_tokens_per_s"),
             ("w4a16", "decode_tokens_per_s"), ("b32", "decode_tokens_per_s")]
    return [ratio(get(r, top, k, key), get(r, "avx2", k, key)) for k, key in pairs]


def fastest(r, kind, key):
    return get(r, top_path(r), kind, key)


# The targets: label, goal (None: measured, no goal), the round's
# value, and whether the row is left out when no round has a value (runs
# that only some CPUs make).
TARGETS = [
    ("W8A8 pp512 ≥ 2× llama.cpp's best pp512", 2.0,
     lambda r: ratio(fastest(r, "w8a8", "prefill_tokens_per_s"), best_llama_pp(r)), False),
    ("W4A16 tg128 ≥ 1.5× llama.cpp Q4_0", 1.5,
     lambda r: ratio(fastest(r, "w4a16", "decode_tokens_per_s"), r["llama"].get(("Q4_0", "tg128"))),
     False),
    ("W4A16 tg128 ≥ 0.75 of the read bandwidth", 0.75,
     lambda r: fastest(r, "w4a16", "decode_roofline_fraction"), False),
    ("batch-32 decode ≥ 3× llama-batched-bench, default", 3.0,
     lambda r: ratio(fastest(r, "b32", "decode_tokens_per_s"), r["batched"]), False),
    ("the same with `--batch-invariant`", 3.0,
     lambda r: ratio(fastest(r, "b32-invariant", "decode_tokens_per_s"), r["batched"]), True),
    ("the same with W4A8", 3.0,
     lambda r: ratio(fastest(r, "b32-w4a8", "decode_tokens_per_s"), r["batched"]), True),
    ("against pdq's own AVX2 path: W8A8 pp512, W4A16 pp512, tg128, batch 32", None, against_avx2,
     True),
]


# ---- rendering ----------------------------------------------------------


def fmt(v, spec=".1f", suffix=""):
    return "" if v is None else f"{v:{spec}}{suffix}"


def shown(v, goal):
    """A target's value, rounded down to what is printed (the 1e-9 keeps a
    ratio such as 2.03, held as 2.0299999..., from showing 2.02)."""
    if v is None:
        return ""
    if goal < 1:
        return f"{math.floor(v * 1000 + 1e-9) / 1000:.3f}"
    return f"{math.floor(v * 100 + 1e-9) / 100:.2f}×"


def render_paths(rounds):
    out = ["| round | pdq path | W8A8 pp512 | W4A16 pp512 | FP16 pp512 | W4A16 tg128 |"
           " tg128, fraction of read bandwidth (probe GB/s) | batch 32, default |"
           " batch 32, `--batch-invariant` | batch 32, W4A8 |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, r in enumerate(rounds, 1):
        for isa in paths(r):
            frac = get(r, isa, "w4a16", "decode_roofline_fraction")
            bw = get(r, isa, "w4a16", "read_bandwidth_gbps")
            cells = [fmt(get(r, isa, p, "prefill_tokens_per_s")) for p in ("w8a8", "w4a16", "fp16")]
            cells.append(fmt(get(r, isa, "w4a16", "decode_tokens_per_s")))
            cells.append(fmt(frac, ".3f") + ("" if bw is None else f" ({bw:.1f})"))
            cells += [fmt(get(r, isa, k, "decode_tokens_per_s"))
                      for k in ("b32", "b32-invariant", "b32-w4a8")]
            out.append(f"| {n} | {ISA_LABEL[isa]} | " + " | ".join(cells) + " |")
            if (isa, "fp16-output") in r["pdq"]:
                out.append(f"| {n} | {ISA_LABEL[isa]}, W4A16 with FP16 output | | "
                           f"{fmt(get(r, isa, 'fp16-output', 'prefill_tokens_per_s'))} | | "
                           f"{fmt(get(r, isa, 'fp16-output', 'decode_tokens_per_s'))} | | | | |")
    return out


def render_llama(rounds):
    out = ["| round | llama.cpp F16 pp512 / tg128 | Q8_0 | Q4_0 |"
           " llama-batched-bench Q4_0, 32 x (128 + 64), S_TG |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for n, r in enumerate(rounds, 1):
        cells = [f"{fmt(r['llama'].get((q, 'pp512')))} / {fmt(r['llama'].get((q, 'tg128')))}"
                 for q in QUANTS]
        out.append(f"| {n} | " + " | ".join(cells) + f" | {fmt(r['batched'])} |")
    return out


def render_targets(rounds):
    heads = [f"round {n}: {ISA_LABEL[top_path(r)]}" if top_path(r) else f"round {n}"
             for n, r in enumerate(rounds, 1)]
    out = ["| target | " + " | ".join(heads) + " | met |",
           "| --- | " + " | ".join("---:" for _ in rounds) + " | --- |"]
    for label, goal, value, optional in TARGETS:
        vals = [value(r) for r in rounds]
        measured = [v for v in vals if v is not None]
        if not measured and optional:
            continue
        if goal is None:
            cells = ["" if v is None else ", ".join(fmt(x, ".2f", "×") for x in v) for v in vals]
            out.append(f"| {label} | " + " | ".join(cells) + " | measured |")
            continue
        met = (f"{sum(v >= goal for v in measured)} of {len(measured)}" if measured
               else "not measured")
        out.append(f"| {label} | " + " | ".join(shown(v, goal) for v in vals) + f" | {met} |")
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    try:
        with open(sys.argv[1], encoding="utf-8") as f:
            rounds = parse(f)
    except OSError as e:
        sys.exit(f"isa_speed_summary: cannot read {sys.argv[1]}: {e.strerror}")
    except LogError as e:
        sys.exit(f"isa_speed_summary: {sys.argv[1]} is malformed: {e}")
    if not rounds:
        sys.exit(f"isa_speed_summary: no '== round' in {sys.argv[1]}: not an isa_speed.sh log")
    print("\n\n".join("\n".join(t) for t in (render_paths(rounds), render_llama(rounds),
                                             render_targets(rounds))))


if __name__ == "__main__":
    main()
