"""bench/isa_speed_summary.py: a committed bench/isa_speed.sh log (one round
on a Zen 4 guest) renders the committed tables; logs written in the script's
shape put each figure in its cell and take the targets within each round on
its fastest path; a round cut short prints what it has; a file that is not
such a log is one clear error."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "isa_speed_summary.py")


def engine(isa, precision, pp, tg, extra="", batch=1, fraction=0.5, bandwidth=40.0):
    cmd = (f"+ env PDQ_ISA={isa} build/bin/pdq bench-engine --precision {precision} --threads 2"
           f"{' --batch 32 --decode-context 128' if batch == 32 else ''}"
           f" --prompt-tokens 512 --gen-tokens 128 --repetitions 2 {extra} --json")
    j = {"batch": batch, "precision": precision, "prefill_tokens_per_s": pp,
         "decode_tokens_per_s": tg, "decode_roofline_fraction": fraction,
         "read_bandwidth_gbps": bandwidth, "fma_peak_gflops": 200.0}
    return [cmd, json.dumps(j)]


def llama_bench(pp, tg):
    lines = ["+ /llama/llama-bench -m f16.gguf -m q8_0.gguf -m q4_0.gguf -t 2 -p 512 -n 128 -r 2 -o md",
             "| model | size | params | backend | threads | test | t/s |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for quant, size in (("F16", "256.63 MiB"), ("Q8_0", "136.40 MiB"), ("Q4_0", "85.77 MiB")):
        lines.append(f"| llama 256M {quant} | {size} | 134.52 M | CPU | 2 | pp512 | {pp[quant]:.2f} ± 1.00 |")
        lines.append(f"| llama 256M {quant} | {size} | 134.52 M | CPU | 2 | tg128 | {tg[quant]:.2f} ± 1.00 |")
    return lines


def batched(s_tg):
    return ["+ /llama/llama-batched-bench -m q4_0.gguf -t 2 -npp 128 -ntg 64 -npl 32",
            "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |",
            "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|",
            f"|   128 |     64 |   32 |   6144 |    5.424 |   755.23 |    4.869 | {s_tg:8.2f} |   10.292 |   596.96 |"]


def a_round(n, isas, llama_scale=1.0):
    """A round as isa_speed.sh runs it: every path in `isas` (slowest
    first), the k-th path's figures k+1 times avx2's with a different
    multiple per metric, so that a figure from the wrong path or column
    shows; llama.cpp's figures times `llama_scale`."""
    lines = [f"== round {n}"]
    for k, isa in enumerate(isas):
        s = k + 1
        lines += engine(isa, "w8a8", 500.0 * s, 150.0 * s)
        lines += engine(isa, "w4a16", 400.0 * s, 100.0 * s, fraction=0.3 + 0.1 * k,
                        bandwidth=30.0 + k)
        lines += engine(isa, "fp16", 350.0 * s, 50.0 * s)
    top = isas[-1]
    lines += engine(top, "w4a16", 333.0, 222.0, extra="--fp16-output --bf16-rows 0")
    lines += llama_bench({q: v * llama_scale for q, v in (("F16", 500.0), ("Q8_0", 520.0), ("Q4_0", 510.0))},
                         {q: v * llama_scale for q, v in (("F16", 50.0), ("Q8_0", 80.0), ("Q4_0", 100.0))})
    for k, isa in enumerate(isas):
        lines += engine(isa, "w4a16", 64, 200.0 * (k + 1), batch=32)
    if top == "amx":
        lines += engine(top, "w4a16", 64, 555.0, extra="--batch-invariant", batch=32)
    lines += engine(top, "w4a16", 64, 444.0, extra="--bf16-rows 0 --w4a8-rows 8", batch=32)
    lines += batched(200.0 * llama_scale)
    return lines


class IsaSpeedSummaryTest(unittest.TestCase):
    def summarize(self, lines):
        fd, path = tempfile.mkstemp(suffix=".log")
        self.addCleanup(os.remove, path)
        with os.fdopen(fd, "w") as f:
            f.write("host: test\n" + "\n".join(lines) + "\n")
        return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)

    def row(self, out, starts):
        rows = [line for line in out.splitlines() if line.startswith(starts)]
        self.assertEqual(len(rows), 1, f"{starts!r} in:\n{out}")
        return [c.strip() for c in rows[0].strip("|").split("|")]

    def test_committed_log_renders_the_committed_tables(self):
        log = os.path.join(HERE, "data", "isa_speed_zen4.log")
        r = subprocess.run([sys.executable, SCRIPT, log], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(HERE, "data", "isa_speed_zen4.md"), encoding="utf-8") as f:
            self.assertEqual(r.stdout, f.read())

    def test_figures_and_targets_within_each_round_on_its_fastest_path(self):
        # Round 2's llama.cpp runs twice as fast: its ratios halve.
        r = self.summarize(a_round(1, ["avx2", "avx512"]) + a_round(2, ["avx2", "avx512"], 2.0))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "| 1 | avx512 (VNNI) |"),
                         ["1", "avx512 (VNNI)", "1000.0", "800.0", "700.0", "200.0", "0.400 (31.0)",
                          "400.0", "", "444.0"])
        self.assertEqual(self.row(r.stdout, "| 2 | avx2 |")[2:7],
                         ["500.0", "400.0", "350.0", "100.0", "0.300 (30.0)"])
        self.assertEqual(self.row(r.stdout, "| 1 | avx512 (VNNI), W4A16 with FP16 output |")[3:6],
                         ["333.0", "", "222.0"])
        self.assertEqual(self.row(r.stdout, "| 2 | 1000.0 / 100.0 |"),
                         ["2", "1000.0 / 100.0", "1040.0 / 160.0", "1020.0 / 200.0", "400.0"])
        # llama.cpp's best pp512 is Q8_0's (520), not Q4_0's (510).
        self.assertEqual(self.row(r.stdout, "| W8A8 pp512"),
                         ["W8A8 pp512 ≥ 2× llama.cpp's best pp512", "1.92×", "0.96×", "0 of 2"])
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 1.5×")[1:], ["2.00×", "1.00×", "1 of 2"])
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 0.75")[1:], ["0.400", "0.400", "0 of 2"])
        self.assertEqual(self.row(r.stdout, "| batch-32 decode")[1:], ["2.00×", "1.00×", "0 of 2"])
        self.assertEqual(self.row(r.stdout, "| the same with W4A8")[1:], ["2.22×", "1.11×", "0 of 2"])
        self.assertNotIn("`--batch-invariant` |", r.stdout.split("| target |")[1])
        self.assertEqual(self.row(r.stdout, "| against pdq's own AVX2 path")[1:],
                         ["2.00×, 2.00×, 2.00×, 2.00×"] * 2 + ["measured"])

    def test_every_path_of_an_amx_round_and_its_targets_on_amx(self):
        r = self.summarize(a_round(1, ["avx2", "avxvnni", "avx512", "amx"]))
        self.assertEqual(r.returncode, 0, r.stderr)
        for label, w8a8 in (("avx2", "500.0"), ("avx2+vnni", "1000.0"), ("avx512 (VNNI)", "1500.0"),
                            ("avx512+amx", "2000.0")):
            self.assertEqual(self.row(r.stdout, f"| 1 | {label} |")[2], w8a8)
        self.assertIn("| round 1: avx512+amx |", r.stdout)
        self.assertEqual(self.row(r.stdout, "| W8A8 pp512")[1], "3.84×")  # 2000 / 520
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 0.75")[1:], ["0.600", "0 of 1"])
        self.assertEqual(self.row(r.stdout, "| the same with `--batch-invariant`")[1:],
                         ["2.77×", "0 of 1"])
        self.assertEqual(self.row(r.stdout, "| against pdq's own AVX2 path")[1],
                         "4.00×, 4.00×, 4.00×, 4.00×")

    def test_met_exactly_when_the_shown_value_reaches_the_goal(self):
        lines = a_round(1, ["avx2", "avx512"])
        # tg128 at 1.4999x and exactly 1.5x llama.cpp's 100; fraction 0.7499.
        lines += a_round(2, ["avx2", "avx512"])
        for i, line in enumerate(lines):
            if line.startswith('{"batch": 1, "precision": "w4a16", "prefill_tokens_per_s": 800.0'):
                j = json.loads(line)
                j["decode_tokens_per_s"] = 149.99 if i < len(lines) // 2 else 150.0
                j["decode_roofline_fraction"] = 0.7499 if i < len(lines) // 2 else 0.75
                lines[i] = json.dumps(j)
        r = self.summarize(lines)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 1.5×")[1:], ["1.49×", "1.50×", "1 of 2"])
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 0.75")[1:], ["0.749", "0.750", "1 of 2"])

    def test_a_round_cut_short_prints_what_it_ran(self):
        r = self.summarize(["== round 1"] + engine("avx2", "w8a8", 650.0, 190.0))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "| 1 | avx2 |")[2:4], ["650.0", ""])
        self.assertIn("| 1 |  /  |  /  |  /  |  |", r.stdout)
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 1.5×")[1:], ["", "not measured"])

    def test_runs_the_script_does_not_make_are_left_out_and_twins_refused(self):
        lines = a_round(1, ["avx2", "avx512"])
        lines += engine("avx512", "w4a16", 64, 9999.0, extra="--bf16-rows 16", batch=32)
        r = self.summarize(lines)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("9999", r.stdout)
        r = self.summarize(lines + engine("avx512", "w4a16", 64, 1.0, batch=32))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("round 1 has two avx512 b32 runs", r.stderr)

    def test_not_a_log_is_one_clear_error(self):
        r = self.summarize(["just some text"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("not an isa_speed.sh log", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("Usage: bench/isa_speed_summary.py LOG", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent.log"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot read /nonexistent.log", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        # A bench-engine line cut off mid-JSON (a run killed while printing).
        r = self.summarize(["== round 1", engine("avx2", "w8a8", 650.0, 190.0)[0], '{"batch": 1, "pre'])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is malformed: line 4", r.stderr)  # after the host line
        self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
