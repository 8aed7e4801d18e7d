#!/usr/bin/env python3
"""Tables of a bench/isa_speed.sh log: each round's pdq paths and llama.cpp
figures, and issue 25's targets as ratios within each round.

Usage: bench/isa_speed_summary.py LOG

LOG is isa_speed.sh's output (it writes one and calls this at its end; an
older run's saved output works too). Markdown on stdout, in the shape of
bench/RESULTS.md's "AVX-512 and AMX kernels" tables; a figure the log lacks
is left blank, so a round cut short still prints what it ran.
"""
import json
import re
import sys

# PDQ_ISA names, slowest first (isa_speed.sh's order): the last one a round
# ran is its fastest path, which the targets are taken on.
ISA_ORDER = ["avx2", "avxvnni", "avx512", "amx"]
ISA_LABEL = {"avx2": "avx2", "avxvnni": "avx2+vnni", "avx512": "avx512 (VNNI)",
             "amx": "avx512+amx"}


def parse(lines):
    """Rounds in order, each a dict: pdq[(isa, kind)] -> bench-engine JSON,
    llama[(quant, test)] -> tokens/s, batched -> S_TG tokens/s."""
    rounds, cmd = [], ""
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith("== round"):
            rounds.append({"pdq": {}, "llama": {}, "batched": None})
            continue
        if not rounds:
            continue
        r = rounds[-1]
        if line.startswith("+ "):
            cmd = line
            continue
        if line.startswith("{") and "bench-engine" in cmd:
            isa = re.search(r"PDQ_ISA=(\S+)", cmd).group(1)
            j = json.loads(line)
            if j.get("batch", 1) == 1:
                kind = "fp16-output" if "--fp16-output" in cmd else j["precision"]
            elif "--batch-invariant" in cmd:
                kind = "b32-invariant"
            elif "--w4a8-rows" in cmd:
                kind = "b32-w4a8"
            else:
                kind = "b32"
            r["pdq"][(isa, kind)] = j
        elif line.startswith("|") and "llama-bench" in cmd:
            cells = [c.strip() for c in line.strip("|").split("|")]
            m = re.search(r"\b(F16|Q8_0|Q4_0)\b", cells[0])
            if m and len(cells) >= 7 and cells[5] in ("pp512", "tg128"):
                r["llama"][(m.group(1), cells[5])] = float(cells[6].split()[0])
        elif line.startswith("|") and "llama-batched-bench" in cmd:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) >= 8 and cells[0].isdigit():
                r["batched"] = float(cells[7])  # S_TG t/s
    return rounds


def fmt(v, spec=".1f", suffix=""):
    return "" if v is None else f"{v:{spec}}{suffix}"


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    try:
        with open(sys.argv[1], encoding="utf-8") as f:
            rounds = parse(f)
    except OSError as e:
        sys.exit(f"isa_speed_summary: cannot read {sys.argv[1]}: {e.strerror}")
    except (ValueError, AttributeError) as e:
        sys.exit(f"isa_speed_summary: {sys.argv[1]} is malformed: {e}")
    if not rounds:
        sys.exit(f"isa_speed_summary: no '== round' in {sys.argv[1]}: not an isa_speed.sh log")

    def get(r, isa, kind, key):
        j = r["pdq"].get((isa, kind))
        return None if j is None else j.get(key)

    print("| round | pdq path | W8A8 pp512 | W4A16 pp512 | FP16 pp512 | W4A16 tg128 |"
          " tg128, fraction of read bandwidth (probe GB/s) | batch 32, default |"
          " batch 32, `--batch-invariant` | batch 32, W4A8 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, r in enumerate(rounds, 1):
        isas = [i for i in ISA_ORDER if any(k[0] == i for k in r["pdq"])]
        for isa in isas:
            frac = get(r, isa, "w4a16", "decode_roofline_fraction")
            bw = get(r, isa, "w4a16", "read_bandwidth_gbps")
            cells = [fmt(get(r, isa, p, "prefill_tokens_per_s")) for p in ("w8a8", "w4a16", "fp16")]
            cells.append(fmt(get(r, isa, "w4a16", "decode_tokens_per_s")))
            cells.append("" if frac is None else f"{frac:.2f} ({bw:.1f})")
            cells += [fmt(get(r, isa, k, "decode_tokens_per_s"))
                      for k in ("b32", "b32-invariant", "b32-w4a8")]
            print(f"| {n} | {ISA_LABEL[isa]} | " + " | ".join(cells) + " |")
            if (isa, "fp16-output") in r["pdq"]:
                print(f"| {n} | {ISA_LABEL[isa]}, W4A16 with FP16 output | | "
                      f"{fmt(get(r, isa, 'fp16-output', 'prefill_tokens_per_s'))} | | "
                      f"{fmt(get(r, isa, 'fp16-output', 'decode_tokens_per_s'))} | | | | |")
    print()
    print("| round | llama.cpp F16 pp512 / tg128 | Q8_0 | Q4_0 |"
          " llama-batched-bench Q4_0, 32 x (128 + 64), S_TG |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n, r in enumerate(rounds, 1):
        cells = [f"{fmt(r['llama'].get((q, 'pp512')))} / {fmt(r['llama'].get((q, 'tg128')))}"
                 for q in ("F16", "Q8_0", "Q4_0")]
        print(f"| {n} | " + " | ".join(cells) + f" | {fmt(r['batched'])} |")
    print()

    # The targets, each a ratio within its round, on the round's fastest path.
    rows = [("W8A8 pp512 ≥ 2× llama.cpp's best pp512", []),
            ("W4A16 tg128 ≥ 1.5× llama.cpp Q4_0", []),
            ("W4A16 tg128 ≥ 0.75 of the read bandwidth", []),
            ("batch-32 decode ≥ 3× llama-batched-bench, default", []),
            ("the same with `--batch-invariant`", []),
            ("the same with W4A8", []),
            ("against pdq's own AVX2 path: W8A8 pp512, W4A16 pp512, tg128, batch 32", [])]
    fastest = []
    for r in rounds:
        isas = [i for i in ISA_ORDER if any(k[0] == i for k in r["pdq"])]
        top = isas[-1] if isas else None
        fastest.append(top)
        llama_pp = [v for (q, t), v in r["llama"].items() if t == "pp512"]
        best_pp = max(llama_pp) if llama_pp else None
        rows[0][1].append(ratio(get(r, top, "w8a8", "prefill_tokens_per_s"), best_pp))
        rows[1][1].append(ratio(get(r, top, "w4a16", "decode_tokens_per_s"),
                                r["llama"].get(("Q4_0", "tg128"))))
        rows[2][1].append(get(r, top, "w4a16", "decode_roofline_fraction"))
        for i, kind in ((3, "b32"), (4, "b32-invariant"), (5, "b32-w4a8")):
            rows[i][1].append(ratio(get(r, top, kind, "decode_tokens_per_s"), r["batched"]))
        if top not in (None, "avx2") and "avx2" in isas:
            pairs = [("w8a8", "prefill_tokens_per_s"), ("w4a16", "prefill_tokens_per_s"),
                     ("w4a16", "decode_tokens_per_s"), ("b32", "decode_tokens_per_s")]
            vals = [ratio(get(r, top, k, key), get(r, "avx2", k, key)) for k, key in pairs]
            rows[6][1].append(", ".join(fmt(v, ".2f", "×") for v in vals))
        else:
            rows[6][1].append(None)
    goals = [2.0, 1.5, 0.75, 3.0, 3.0, 3.0, None]
    print("| target | " + " | ".join(f"round {n} ({ISA_LABEL.get(t, '?')})"
                                      for n, t in enumerate(fastest, 1)) + " | met |")
    print("| --- | " + " | ".join("---:" for _ in rounds) + " | --- |")
    for (label, vals), goal in zip(rows, goals):
        if all(v is None for v in vals):
            continue
        if goal is None:
            print(f"| {label} | " + " | ".join(v or "" for v in vals) + " | measured |")
            continue
        spec, suffix = (".2f", "") if goal < 1 else (".2f", "×")
        shown = [v for v in vals if v is not None]
        met = sum(v >= goal for v in shown)
        print(f"| {label} | " + " | ".join(fmt(v, spec, suffix) for v in vals) +
              f" | {met} of {len(shown)} |")


if __name__ == "__main__":
    main()
