"""bench/sim_validation_summary.py: comparison files in bench/sim_validation.sh's
shape give each metric's cells within the bound and their mean error; a set
whose predictions were committed before its runs says so and is pooled, one
committed with or after them is listed but not pooled; variants show only
with --all; a copy outside git says the order is unknown; a wrong directory
is one clear error."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "sim_validation_summary.py")

CLOSED = """| deployment | clients | runs | TTFT p50 (ms) | TTFT p90 (ms) | TPOT p50 (ms) | TPOT p90 (ms) | output tokens/s |
| --- | ---: | ---: | --- | --- | --- | --- | --- |
| mono-fp16 | 1 | 3 | 212 / 205 (+3%, ±4%) | 212 / 210 (+1%, ±5%) | 10 / 10 (+4%, ±6%) | 10 / 11 (-1%, ±5%) | 92 / 96 (-4%, ±6%) |
| mono-fp16 | 8 | 3 | 1633 / 1326 (+23%, ±3%) ** | 1648 / 1707 (-3%, ±10%) | 27 / 26 (+7%, ±1%) | 29 / 27 (+6%, ±5%) | 222 / 260 (-15%, ±0%) ** |

Each cell: predicted / measured mean of the runs.

| metric | bias (mean error) | median absolute error | largest absolute error | cells within the bound |
| --- | ---: | ---: | ---: | ---: |
| ttft p50 | +13.0% | 13.0% | 23.0% | 1 of 2 |
"""

EMULATED = """| deployment | rate | runs | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p90 (ms) | TPOT p99 (ms) |
| --- | ---: | ---: | --- | --- | --- | --- | --- | --- |
| 12P+20D-f0.5 | 8.76/s | 3 | 243 / 244 (-1%, ±1%) | 260 / 261 (-0%, ±1%) | 267 / 301 (-11%, ±1%) ** | 33 / 33 (-1%, ±3%) | 37 / 37 (-0%, ±1%) | 39 / 41 (-3%, ±0%) |
"""


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def run(*args, cwd):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=cwd)


def row(out, first):
    return next(line for line in out.splitlines() if line.startswith(f"| {first} |"))


class SimValidationSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.root = os.path.join(self.dir, "bench", "sim_validation")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def git(self, *args):
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")
        subprocess.run(["git", *args], cwd=self.dir, check=True, capture_output=True, env=env)

    def commit(self, message):
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)

    @unittest.skipUnless(shutil.which("git"), "git is not installed")
    def test_cells_bias_and_order(self):
        self.git("init", "-q")
        # Predicted first, then measured and compared: pre-registered.
        write(f"{self.root}/zen4-2core-a/predicted/mono-fp16-c1.json", "{}")
        self.commit("predictions")
        write(f"{self.root}/zen4-2core-a/measured/mono-fp16-1.json", "{}")
        write(f"{self.root}/zen4-2core-a/validation-predicted.md", CLOSED)
        # An emulated variant tried on the same runs afterwards.
        write(f"{self.root}/zen4-2core-a/measured-emulated/x.json", "{}")
        write(f"{self.root}/zen4-2core-a/predicted-emulated/x.json", "{}")
        self.commit("runs")
        write(f"{self.root}/zen4-2core-a/predicted-emulated-noloop/x.json", "{}")
        write(f"{self.root}/zen4-2core-a/validation-emulated-noloop.md", EMULATED)
        write(f"{self.root}/zen4-2core-a/validation-emulated.md", EMULATED)
        self.commit("variant")
        # Predicted and measured in one commit: listed, not pooled.
        write(f"{self.root}/emr-2core-b/predicted/a.json", "{}")
        write(f"{self.root}/emr-2core-b/measured/a.json", "{}")
        write(f"{self.root}/emr-2core-b/validation-predicted.md", CLOSED)
        self.commit("both at once")

        r = run(cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        zen4 = [line for line in r.stdout.splitlines() if line.startswith("| zen4-2core-a |")]
        self.assertEqual(len(zen4), 2, r.stdout)  # closed loop and the emulation tier's primary
        closed = next(line for line in zen4 if "closed loop" in line)
        self.assertIn("AMD EPYC Zen 4", closed)
        self.assertIn("before the runs", closed)
        cells = [c.strip() for c in closed.strip("|").split("|")]
        # rows, ttft p50, p90, p99, tpot p50, p90, p99, throughput
        self.assertEqual(cells[4:], ["2", "1/2 (+13%)", "2/2 (-1%)", "", "2/2 (+6%)",
                                     "2/2 (+2%)", "", "1/2 (-10%)"])
        emulated = next(line for line in zen4 if "emulation tier" in line)
        # The emulated runs were committed with their predictions.
        self.assertIn("with the runs", emulated)
        self.assertIn("0/1 (-11%)", emulated)
        emr = row(r.stdout, "emr-2core-b")
        self.assertIn("with the runs", emr)
        self.assertNotIn("noloop", r.stdout)
        # Pooled: the pre-registered closed-loop set alone.
        pooled = row(r.stdout, "closed loop")
        pooled_cells = [c.strip() for c in pooled.strip("|").split("|")]
        self.assertEqual(pooled_cells[1:3], ["1", "1/2 (+13%)"])
        self.assertIn("| emulation tier | 0 |", r.stdout)

        every = run("--all", cwd=self.dir)
        self.assertEqual(every.returncode, 0, every.stderr)
        variant = next(line for line in every.stdout.splitlines() if "emulated-noloop" in line)
        self.assertIn("after the runs", variant)

    def test_outside_git_and_errors(self):
        write(f"{self.root}/zen3-2core-c/validation-predicted.md", CLOSED)
        os.makedirs(f"{self.root}/zen3-2core-c/predicted")
        os.makedirs(f"{self.root}/zen3-2core-c/measured")
        r = run(self.root, cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        line = row(r.stdout, "zen3-2core-c")
        self.assertIn("unknown (no git history", line)
        self.assertIn("AMD EPYC Zen 3", line)
        self.assertIn("| closed loop | 0 |", r.stdout)  # nothing pooled that is not known first

        missing = run(os.path.join(self.dir, "nowhere"), cwd=self.dir)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("not a directory", missing.stderr)
        bad = run("--frobnicate", cwd=self.dir)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("Usage", bad.stderr)


if __name__ == "__main__":
    unittest.main()
