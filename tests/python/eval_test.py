"""`pdq eval` end to end on a tiny config: every step's JSON, report.md with
its sections and SVG plots; an interrupted run keeps what it measured, writes
a report from it and exits 130; running again resumes without redoing the
kept steps; a bad config is one clear error."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from pdq_cluster import main

ARGS = None


def config(model):
    worker = lambda role, precision, threads: {"role": role, "precision": precision,
                                               "threads": threads, "args": ["--skip-peaks"]}
    return {
        "model": model,
        "text": "README.md",  # prompts from any real text (WikiText may be absent)
        "cores": 2,
        "price_per_core_hour": 0.04,
        "workloads": {"chat": {"concurrency": [1, 2], "requests": 2, "warmup": 0,
                               "input_tokens": 32, "output_tokens": 8,
                               "ttft_target_ms": 5000, "tpot_target_ms": 500}},
        "stability": {"deployment": "1p1d-w8a8-w4a16", "cycles": 1, "high": 2, "low": 1,
                      "input_tokens": 32, "output_tokens": 8, "max_rss_growth_mib": 512},
        "accuracy": {"texts": ["README.md"], "ctx": 64, "chunks": 1,
                     "drift_prompts": "eval/prompts/review-100.txt", "drift_prompt_count": 1,
                     "drift_tokens": 8, "threads": 2},
        "deployments": [
            {"name": "mono-fp16", "baseline": True, "prefill_precision": "fp16",
             "decode_precision": "fp16", "workers": [worker("both", "fp16", 2)]},
            {"name": "1p1d-w8a8-w4a16", "prefill_precision": "w8a8", "decode_precision": "w4a16",
             "workers": [worker("prefill", "w8a8", 1), worker("decode", "w4a16", 1)]},
        ],
    }


class EvalTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pdq-eval-test-")
        self.config = os.path.join(self.dir, "config.json")
        with open(self.config, "w") as f:
            json.dump(config(ARGS.model), f)
        self.out = os.path.join(self.dir, "out")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def eval(self, *extra):
        return subprocess.run([ARGS.pdq, "eval", "--config", self.config, "--out", self.out,
                               *extra], capture_output=True, text=True, timeout=900)

    def test_interrupted_run_keeps_its_steps_and_resumes(self):
        first = os.path.join(self.out, "raw", "mono-fp16", "bench-chat.json")
        proc = subprocess.Popen([ARGS.pdq, "eval", "--config", self.config, "--out", self.out],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.time() + 300
        while not os.path.exists(first):
            self.assertIsNone(proc.poll(), proc.communicate()[1][-2000:] if proc.poll() else "")
            self.assertLess(time.time(), end, "the first step never finished")
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 130, err[-2000:])
        self.assertIn("interrupted", out)
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        self.assertIn("| mono-fp16 | 1 |", report)  # what was measured is reported
        self.assertIn("not measured", report)       # and what was not, said so
        self.assertFalse([p for p in os.listdir(os.path.join(self.out, "raw", "mono-fp16"))
                          if p.endswith(".tmp")], "a half-written step was kept")
        before = os.path.getmtime(first)

        done = self.eval()
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(os.path.getmtime(first), before, "a kept step was run again")
        self.assertIn("mono-fp16: measured already", done.stderr)
        raw = os.path.join(self.out, "raw")
        for path in ["1p1d-w8a8-w4a16/bench-chat.json", "1p1d-w8a8-w4a16/stability.json",
                     "accuracy/ppl-fp16-fp16-README.json", "accuracy/ppl-w8a8-w4a16-README.json",
                     "accuracy/drift-fp16-fp16.json", "accuracy/drift-w8a8-w4a16.json"]:
            self.assertTrue(os.path.exists(os.path.join(raw, path)), path)
        with open(os.path.join(raw, "1p1d-w8a8-w4a16", "stability.json")) as f:
            self.assertTrue(json.load(f)["pattern"]["pass"])
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        for section in ["## Goodput at the latency targets", "## Cost per million output tokens",
                        "## Workload `chat`", "## Stability under alternating load",
                        "**PASS**", "## Accuracy against FP16", "| w8a8 / w4a16 | README |"]:
            self.assertIn(section, report)
        self.assertNotIn("not measured", report)
        plots = os.path.join(self.out, "plots")
        for svg in ["chat-latency-throughput.svg", "chat-ttft-cdf.svg", "chat-tpot-cdf.svg",
                    "accuracy-bars.svg", "drift-kl-by-position.svg", "1p1d-w8a8-w4a16-stability.svg"]:
            path = os.path.join(plots, svg)
            self.assertTrue(os.path.exists(path), svg)
            with open(path) as f:
                self.assertIn("<svg", f.read(200 + 2000))
            self.assertIn(f"(plots/{svg})", report)
        self.assertIn("goodput", done.stdout)
        self.assertIn("report at", done.stdout)

    def test_cluster_scale_is_projected_from_a_profile_of_the_machine(self):
        c = config("synthetic:tiny")  # a profile in seconds
        c["cluster"] = {"nodes": [2, 4], "pairs": ["fp16/fp16", "w8a8/w4a16"], "seeds": 1}
        with open(self.config, "w") as f:
            json.dump(c, f)
        only = ("--skip-serving", "--skip-accuracy", "--skip-stability", "--skip-lowbit")
        done = self.eval(*only)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("cluster scale: pdq profile of this machine", done.stderr)
        cluster = os.path.join(self.out, "raw", "cluster")
        with open(os.path.join(cluster, "chat.json")) as f:
            sweep = json.load(f)
        # 2M, 1P+1D, 4M, 1P+3D, 2P+2D, 3P+1D for each pair, a rate found for each.
        self.assertEqual(len(sweep["points"]), 12)
        self.assertEqual(sweep["ttft_target_ms"], 5000)  # the workload's targets
        self.assertEqual(sweep["output_tokens"], 8)
        self.assertTrue(all(p["rate"] > 0 for p in sweep["points"]), sweep["points"])
        with open(os.path.join(cluster, "chat.txt")) as f:
            self.assertIn("not measured", f.read())
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        for text in ["## At cluster scale (projected)", "a projection, not a measurement",
                     "| fp16/fp16 | 4 |", "| w8a8/w4a16 | 2 |", "(plots/cluster-chat.svg)",
                     "Recommended"]:
            self.assertIn(text, report)
        # Resumed: nothing is profiled or projected again.
        before = os.path.getmtime(os.path.join(cluster, "chat.json"))
        again = self.eval(*only)
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        self.assertNotIn("cluster scale:", again.stderr)
        self.assertEqual(os.path.getmtime(os.path.join(cluster, "chat.json")), before)

    def test_bad_configs_are_clear_errors(self):
        for mutate, message in [
            (lambda c: c.pop("deployments"), "needs a non-empty 'deployments' array"),
            (lambda c: c["workloads"].update({"poetry": {"concurrency": [1]}}),
             "workload 'poetry' is not chat, summarize or analysis"),
            (lambda c: c["deployments"][1].update({"name": "mono-fp16"}), "must be unique"),
            (lambda c: c["deployments"][0].pop("decode_precision"), "needs 'decode_precision'"),
        ]:
            c = config(ARGS.model)
            mutate(c)
            with open(self.config, "w") as f:
                json.dump(c, f)
            r = self.eval()
            self.assertEqual(r.returncode, 1, message)
            self.assertIn(message, r.stderr)
        r = subprocess.run([ARGS.pdq, "eval", "--config", "/nonexistent.json", "--out", self.out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent.json", r.stderr)
        r = subprocess.run([ARGS.pdq, "eval", "--config", self.config], capture_output=True, text=True)
        self.assertIn("--config and --out are required", r.stderr)


if __name__ == "__main__":
    main(__doc__)
