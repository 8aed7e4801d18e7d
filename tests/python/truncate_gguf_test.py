"""scripts/truncate_gguf.py on the default model: the copy keeps the first
blocks' tensors byte for byte with the tokenizer and metadata, pdq loads it
with that many layers and generates from it; bad arguments are one clear
error."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from pdq_cluster import main

ARGS = None
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "truncate_gguf.py")


def truncate(src, dst, *extra):
    return subprocess.run([sys.executable, SCRIPT, src, dst, *extra], capture_output=True, text=True)


class TruncateGgufTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.out = os.path.join(self.dir, "two.gguf")

    def test_keeps_the_first_blocks_and_loads(self):
        r = truncate(ARGS.model, self.out, "--layers", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 of 30 blocks", r.stdout)
        self.assertLess(os.path.getsize(self.out), os.path.getsize(ARGS.model) / 2)
        g = subprocess.run([ARGS.pdq, "generate", "--model", self.out, "--prompt", "Hello",
                            "--max-tokens", "4", "--json", "--threads", "2"],
                           capture_output=True, text=True)
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertIn("2 layers, d=576, vocab 49152", g.stderr)
        self.assertEqual(len(json.loads(g.stdout.strip().splitlines()[-1])["tokens"]), 4)
        # Kept tensors and metadata are copied as they are: cutting a 3-block
        # copy down to 2 gives the very file cut from the original.
        three = os.path.join(self.dir, "three.gguf")
        again = os.path.join(self.dir, "two-again.gguf")
        self.assertEqual(truncate(ARGS.model, three, "--layers", "3").returncode, 0)
        self.assertEqual(truncate(three, again, "--layers", "2").returncode, 0)
        with open(self.out, "rb") as a, open(again, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_bad_arguments_are_one_clear_error(self):
        r = truncate(ARGS.model, self.out, "--layers", "30")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("the model has 30 blocks; nothing to drop", r.stderr)
        r = truncate(ARGS.model, self.out, "--layers", "0")
        self.assertIn("--layers must be at least 1", r.stderr)
        r = truncate("README.md", self.out, "--layers", "2")
        self.assertIn("is not a GGUF file", r.stderr)
        r = truncate("/nonexistent.gguf", self.out, "--layers", "2")
        self.assertIn("cannot read /nonexistent.gguf", r.stderr)
        # A file cut short: one line, no traceback.
        short = os.path.join(self.dir, "short.gguf")
        with open(ARGS.model, "rb") as f, open(short, "wb") as g:
            g.write(f.read(4096))
        r = truncate(short, self.out, "--layers", "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is malformed: truncated GGUF file", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    main(__doc__)
