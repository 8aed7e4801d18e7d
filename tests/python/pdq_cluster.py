"""Starts a deployment with `pdq up` for a Python test and tells it where
everything listens: the router's gRPC and HTTP addresses and each process's
/metrics."""

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import sys
import urllib.request

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests


class PdqUp:
    def __init__(self, pdq, model, workers, kv_transport="tcp", timeout=600):
        self.pdq, self.model, self.workers = pdq, model, workers
        self.kv_transport, self.timeout = kv_transport, timeout
        self.metrics = {}  # process name as pdq up prints it -> host:port

    def __enter__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="pdq-pytest-")
        config = {
            "model": self.model,
            "listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "kv_transport": self.kv_transport,
            "workers": self.workers,
        }
        path = os.path.join(self.dir.name, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        grpc_file = os.path.join(self.dir.name, "router.addr")
        http_file = os.path.join(self.dir.name, "router.http")
        self.log = open(os.path.join(self.dir.name, "up.log"), "w+")
        self.proc = subprocess.Popen(
            [self.pdq, "up", "--config", path, "--address-file", grpc_file,
             "--http-address-file", http_file],
            stdout=self.log, stderr=subprocess.STDOUT)
        end = time.time() + self.timeout
        while not os.path.exists(grpc_file):
            if self.proc.poll() is not None or time.time() > end:
                self.__exit__(None, None, None)
                raise RuntimeError("pdq up did not start:\n" + self.output())
            time.sleep(0.2)
        with open(grpc_file) as f:
            self.grpc = f.read().strip()
        with open(http_file) as f:
            self.http = f.read().strip()
        for m in re.finditer(r"pdq up: (.+) metrics at http://(\S+)/metrics", self.output()):
            self.metrics[m.group(1)] = m.group(2)
        return self

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        self.dir.cleanup()


def scrape(address):
    """The samples of a /metrics page: {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def main(doc, extra=lambda parser: None, check=lambda args: None):
    """A Python test's entry point: parses --pdq and --model (plus `extra`
    arguments), skips (exit 77) without the model or where `check(args)`
    names something missing, then runs the module's unittest cases with
    the arguments in the module's ARGS."""
    import argparse
    import unittest
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--pdq", required=True, help="the pdq executable")
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    extra(parser)
    args, rest = parser.parse_known_args()
    missing = None if os.path.exists(args.model) else f"the model {args.model} is missing (make model)"
    missing = missing or check(args)
    if missing:
        print(f"SKIPPED: {missing}")
        sys.exit(SKIP)
    sys.modules["__main__"].ARGS = args
    unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2)
