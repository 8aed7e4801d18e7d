"""`pdq up` keeps a deployment serving when its processes die: a killed
worker is started again and re-registers, a killed router comes back on the
same addresses, and the deployment stops only when told to (SIGTERM, exit
status 0). One prefill and one decode worker (FP16), as a user runs it."""

import json
import os
import re
import signal
import time
import unittest
import urllib.error
import urllib.request

from pdq_cluster import PdqUp, main

ARGS = None


def complete(http, prompt, timeout=60):
    """The text of a greedy 8-token completion, or raises."""
    model = os.path.splitext(os.path.basename(ARGS.model))[0]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://{http}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["choices"][0]["text"]


def complete_within(http, prompt, seconds):
    """Retries the completion until it succeeds or `seconds` pass; its text."""
    end = time.time() + seconds
    while True:
        try:
            return complete(http, prompt)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if time.time() > end:
                raise AssertionError(f"no completion within {seconds} s: {e}")
            time.sleep(0.5)


def child_pid(up, program):
    """The pid of `pdq up`'s child running `program` (pdq-router, ...)."""
    with open(f"/proc/{up.proc.pid}/task/{up.proc.pid}/children") as f:
        pids = [int(p) for p in f.read().split()]
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode()
        if os.path.basename(argv0) == program:
            return pid
    raise AssertionError(f"pdq up has no {program} child (children: {pids})")


class UpSupervisionTest(unittest.TestCase):
    def test_killed_processes_are_started_again(self):
        workers = [
            {"role": "prefill", "precision": "fp16", "threads": 1, "args": ["--skip-peaks"]},
            {"role": "decode", "precision": "fp16", "threads": 1, "args": ["--skip-peaks"]},
        ]
        prompt = "The capital of France is"
        with PdqUp(ARGS.pdq, ARGS.model, workers) as up:
            before = complete(up.http, prompt)
            self.assertTrue(before)

            # A decode worker killed outright: started again, registered
            # again, and the same greedy answer comes back.
            decode = child_pid(up, "pdq-decode")
            os.kill(decode, signal.SIGKILL)
            self.assertEqual(complete_within(up.http, prompt, 120), before)
            self.assertIsNone(up.proc.poll(), "pdq up stopped:\n" + up.output())
            self.assertNotEqual(child_pid(up, "pdq-decode"), decode)
            self.assertRegex(up.output(),
                             r"worker 1 \(decode\) exited \(killed by signal 9\) after [\d.]+ s; "
                             r"starting it again in 1 s")
            self.assertIn("started worker 1 (decode) again (restart 1", up.output())

            # The router killed: back on the same addresses (the client's
            # HTTP address did not change), with both workers.
            router = child_pid(up, "pdq-router")
            os.kill(router, signal.SIGKILL)
            self.assertEqual(complete_within(up.http, prompt, 60), before)
            self.assertIsNone(up.proc.poll(), "pdq up stopped:\n" + up.output())
            self.assertIn("started pdq-router again (restart 1", up.output())

            # Told to stop, it stops everything and says so.
            up.proc.send_signal(signal.SIGTERM)
            self.assertEqual(up.proc.wait(90), 0, up.output())
            self.assertTrue(up.output().rstrip().endswith("pdq up: stopped"), up.output())
            self.assertEqual(len(re.findall(r"exited \(", up.output())), 2, up.output())


if __name__ == "__main__":
    main(__doc__)
