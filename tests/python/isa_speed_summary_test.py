"""bench/isa_speed_summary.py on logs written in bench/isa_speed.sh's shape:
each round's figures land in their cells, the targets are ratios within the
round on its fastest path, a round cut short prints what it has, and a file
that is not such a log is one clear error."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "isa_speed_summary.py")


def engine(isa, precision, pp, tg, extra="", batch=1, fraction=0.5, bandwidth=40.0):
    cmd = (f"+ env PDQ_ISA={isa} build/bin/pdq bench-engine --precision {precision} --threads 2"
           f"{' --batch 32 --decode-context 128' if batch == 32 else ''} {extra} --json")
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


def full_round(n, top="avx512", w8a8=1600.0):
    lines = [f"== round {n}"]
    for isa, scale in (("avx2", 0.5), (top, 1.0)):
        lines += engine(isa, "w8a8", w8a8 * scale, 200.0 * scale)
        lines += engine(isa, "w4a16", 1000.0 * scale, 300.0 * scale, fraction=0.8)
        lines += engine(isa, "fp16", 700.0 * scale, 100.0 * scale)
    lines += engine(top, "w4a16", 900.0, 250.0, extra="--fp16-output --bf16-rows 0")
    lines += llama_bench({"F16": 600.0, "Q8_0": 820.0, "Q4_0": 800.0},
                         {"F16": 90.0, "Q8_0": 130.0, "Q4_0": 200.0})
    lines += engine("avx2", "w4a16", 64, 450.0, batch=32)
    lines += engine(top, "w4a16", 64, 900.0, batch=32)
    if top == "amx":
        lines += engine(top, "w4a16", 64, 600.0, extra="--batch-invariant", batch=32)
    lines += engine(top, "w4a16", 64, 750.0, extra="--bf16-rows 0 --w4a8-rows 8", batch=32)
    lines += batched(300.0)
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

    def test_figures_and_targets_within_each_round(self):
        r = self.summarize(full_round(1) + full_round(2, w8a8=1400.0))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "| 1 | avx512 (VNNI) |"),
                         ["1", "avx512 (VNNI)", "1600.0", "1000.0", "700.0", "300.0", "0.80 (40.0)",
                          "900.0", "", "750.0"])
        self.assertEqual(self.row(r.stdout, "| 2 | avx2 |")[2], "700.0")
        self.assertEqual(self.row(r.stdout, "| 1 | avx512 (VNNI), W4A16 with FP16 output |")[3],
                         "900.0")
        self.assertEqual(self.row(r.stdout, "| 1 | 600.0 / 90.0 |"),
                         ["1", "600.0 / 90.0", "820.0 / 130.0", "800.0 / 200.0", "300.0"])
        # Against llama.cpp's best pp512 (Q8_0's 820 here, not Q4_0's), its
        # Q4_0 tg128 and llama-batched-bench's S_TG; each round on its own.
        self.assertEqual(self.row(r.stdout, "| W8A8 pp512"), [
            "W8A8 pp512 ≥ 2× llama.cpp's best pp512", "1.95×", "1.71×", "0 of 2"])
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 1.5×")[1:], ["1.50×", "1.50×", "2 of 2"])
        self.assertEqual(self.row(r.stdout, "| W4A16 tg128 ≥ 0.75")[1:], ["0.80", "0.80", "2 of 2"])
        self.assertEqual(self.row(r.stdout, "| batch-32 decode")[1:], ["3.00×", "3.00×", "2 of 2"])
        self.assertEqual(self.row(r.stdout, "| the same with W4A8")[1:], ["2.50×", "2.50×", "0 of 2"])
        self.assertNotIn("--batch-invariant`", r.stdout.split("| target |")[1])
        self.assertEqual(self.row(r.stdout, "| against pdq's own AVX2 path")[1],
                         "2.00×, 2.00×, 2.00×, 2.00×")

    def test_amx_round_takes_its_fastest_path_and_batch_invariant_line(self):
        r = self.summarize(full_round(1, top="amx"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| round 1 (avx512+amx) |", r.stdout)
        self.assertEqual(self.row(r.stdout, "| the same with `--batch-invariant`")[1:],
                         ["2.00×", "0 of 1"])
        self.assertEqual(self.row(r.stdout, "| 1 | avx512+amx |")[8], "600.0")

    def test_a_round_cut_short_prints_what_it_ran(self):
        r = self.summarize(["== round 1"] + engine("avx2", "w8a8", 650.0, 190.0))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "| 1 | avx2 |")[2:4], ["650.0", ""])
        self.assertIn("| 1 |  /  |  /  |  /  |  |", r.stdout)
        self.assertNotIn("Traceback", r.stderr)

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
        self.assertIn("is malformed", r.stderr)
        self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
