"""The router's OpenAI-compatible HTTP API, driven by the official `openai`
Python client: completions and chat, streamed and not, the usage block, bad
requests in OpenAI's error shape, and a client that leaves mid-stream (its
KV blocks come back). One prefill (W8A8) and one decode (W4A16) worker."""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import openai

from pdq_cluster import PdqUp, main, scrape

ARGS = None
UP = None


def setUpModule():
    global UP
    workers = [
        {"role": "prefill", "precision": "w8a8", "threads": 1, "args": ["--skip-peaks"]},
        {"role": "decode", "precision": "w4a16", "threads": 1, "args": ["--skip-peaks"]},
    ]
    UP = PdqUp(ARGS.pdq, ARGS.model, workers).__enter__()


def tearDownModule():
    UP.__exit__(None, None, None)


class OpenAiClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = openai.OpenAI(base_url=f"http://{UP.http}/v1", api_key="unused",
                                   max_retries=0, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    def decode_metrics(self):
        name = next(n for n in UP.metrics if "decode" in n)
        return scrape(UP.metrics[name])

    def test_models_lists_the_served_model(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, os.path.splitext(os.path.basename(ARGS.model))[0])
        self.assertEqual(self.client.models.retrieve(self.model).id, self.model)

    def test_completion_streamed_equals_unstreamed_and_grpc(self):
        prompt = "The three primary colours are"
        full = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(full.object, "text_completion")
        self.assertEqual(full.choices[0].finish_reason, "length")
        self.assertEqual(full.usage.completion_tokens, 24)
        self.assertGreater(full.usage.prompt_tokens, 3)
        self.assertEqual(full.usage.total_tokens,
                         full.usage.prompt_tokens + full.usage.completion_tokens)
        self.assertTrue(full.choices[0].text.strip())
        pieces, finish = [], None
        for chunk in self.client.completions.create(model=self.model, prompt=prompt, max_tokens=24,
                                                    temperature=0, stream=True,
                                                    extra_body={"ignore_eos": True}):
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual("".join(pieces), full.choices[0].text)
        self.assertEqual(finish, "length")
        # The same request over pdq's gRPC API gives the same text.
        grpc_text = subprocess.run(
            [ARGS.pdq, "client", "--router", UP.grpc, "--prompt", prompt, "--max-tokens", "24",
             "--ignore-eos", "--quiet"], capture_output=True, text=True, check=True).stdout
        self.assertEqual(grpc_text.rstrip("\n"), full.choices[0].text.rstrip("\n"))

    def test_chat_streamed_with_usage(self):
        messages = [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "Name a fruit."}]
        full = self.client.chat.completions.create(model=self.model, messages=messages,
                                                   max_tokens=16, temperature=0)
        self.assertEqual(full.object, "chat.completion")
        self.assertEqual(full.choices[0].message.role, "assistant")
        self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, usage, roles = "", None, []
        for chunk in stream:
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                text += c.delta.content or ""
        self.assertEqual(roles, ["assistant"])
        self.assertEqual(text, full.choices[0].message.content)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, full.usage.prompt_tokens)

    def test_sampled_answers_repeat_with_a_seed(self):
        kw = dict(model=self.model, prompt="Once upon a time", max_tokens=16, temperature=0.9,
                  seed=1234)
        a = self.client.completions.create(**kw).choices[0].text
        b = self.client.completions.create(**kw).choices[0].text
        self.assertEqual(a, b)

    def test_bad_requests_get_openai_errors(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="x", temperature=5)
        self.assertEqual(e.exception.body["param"], "temperature")
        self.assertEqual(e.exception.body["type"], "invalid_request_error")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="x", max_tokens=10**6)
        self.assertIn("context", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=self.model, messages=[])
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(
                model=self.model, messages=[{"role": "tool", "content": "x"}])
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=self.model, prompt="x", logprobs=3)
        with self.assertRaises(openai.BadRequestError):  # streamed: refused before the stream
            self.client.completions.create(model=self.model, prompt="x", max_tokens=10**6,
                                           stream=True)
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="gpt-nothing", prompt="x")
        self.assertEqual(e.exception.body["code"], "model_not_found")

    def test_json_body_read_whatever_its_content_type(self):
        # curl -d sends form-urlencoded; past 8 KiB that was refused as too
        # large. The body is JSON whatever the header says.
        prompt = "The sea " * 1200
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": 2,
                           "temperature": 0}).encode()
        self.assertGreater(len(body), 8192)
        for ctype in ("application/x-www-form-urlencoded", "text/plain", None):
            req = urllib.request.Request(f"http://{UP.http}/v1/completions", data=body,
                                         method="POST")
            req.remove_header("Content-type")
            if ctype:
                req.add_header("Content-Type", ctype)
            with urllib.request.urlopen(req, timeout=120) as r:
                answer = json.load(r)
            self.assertEqual(answer["usage"]["completion_tokens"], 2, ctype)
        # Past 4 MiB: 413 with OpenAI's error shape and its code.
        big = urllib.request.Request(f"http://{UP.http}/v1/completions",
                                     data=b"{" + b" " * (5 << 20) + b"}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(big, timeout=120)
        self.assertEqual(e.exception.code, 413)
        self.assertEqual(json.load(e.exception)["error"]["code"], "request_too_large")

    def test_pdq_bench_measures_the_openai_endpoint(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "bench.json")
            before = int(time.time())
            subprocess.run([ARGS.pdq, "bench", "--openai", f"http://{UP.http}/v1",
                            "--model", ARGS.model, "--text", "README.md",
                            "--concurrency", "2", "--requests", "4",
                            "--input-tokens", "48", "--output-tokens", "12", "--json", out],
                           check=True, capture_output=True, text=True)
            with open(out) as f:
                report = json.load(f)
            after = time.time()
        self.assertEqual(report["target"], "openai")
        self.assertEqual(len(report["requests"]), 4)
        # The run's wall clock, UTC to the second, within the subprocess's.
        started, finished = (datetime.datetime.strptime(report[k], "%Y-%m-%dT%H:%M:%S%z").timestamp()
                             for k in ("started_at", "finished_at"))
        self.assertLessEqual(before, started)
        self.assertLessEqual(started, finished)
        self.assertLessEqual(finished, after)
        for r in report["requests"]:
            self.assertTrue(r["ok"], r["error"])
            self.assertEqual(r["output_tokens"], 12)
            self.assertEqual(r["prompt_tokens"], 48)  # the router's count, from the usage block
            self.assertGreater(r["ttft_s"], 0)
        self.assertEqual(report["levels"][0]["requests_ok"], 4)

    def test_pdq_bench_conversation_over_the_openai_endpoint(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "bench.json")
            subprocess.run([ARGS.pdq, "bench", "--openai", f"http://{UP.http}/v1",
                            "--model", ARGS.model, "--text", "README.md",
                            "--workload", "conversation", "--sessions", "2", "--turns", "2",
                            "--first-tokens", "32", "--turn-tokens", "8",
                            "--output-tokens", "6", "--json", out],
                           check=True, capture_output=True, text=True)
            with open(out) as f:
                report = json.load(f)
        self.assertEqual(report["target"], "openai")
        self.assertEqual(report["conversation"]["conversations_ok"], 2)
        turns = {}
        for r in report["requests"]:
            self.assertTrue(r["ok"], r["error"])
            self.assertEqual(r["output_tokens"], 6)
            self.assertTrue(r["output_text"])  # the streamed text, resent next turn
            self.assertGreaterEqual(r["cached_tokens"], 0)
            turns[(r["session"], r["turn"])] = r
        self.assertEqual(sorted(turns), [(0, 1), (0, 2), (1, 1), (1, 2)])
        for s in (0, 1):
            # The first prompt, its answer and an 8-token message (the
            # router's count, from the usage block).
            self.assertGreater(turns[(s, 2)]["prompt_tokens"], turns[(s, 1)]["prompt_tokens"] + 8)

    def test_client_that_leaves_mid_stream_frees_its_kv(self):
        before = self.decode_metrics()
        total = before["pdq_kv_blocks_total"]
        stream = self.client.completions.create(
            model=self.model, prompt="Write a long story about a lighthouse keeper.",
            max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True})
        got = 0
        for chunk in stream:
            got += 1
            if got == 5:
                break
        self.assertLess(self.decode_metrics()["pdq_kv_blocks_free"], total)  # still generating
        stream.close()
        deadline = time.time() + 20
        while True:
            m = self.decode_metrics()
            if m["pdq_kv_blocks_free"] == total and m["pdq_active_sequences"] == 0:
                break
            self.assertLess(time.time(), deadline,
                            f"the decode worker still holds KV: {m['pdq_kv_blocks_free']} of "
                            f"{total} blocks free, {m['pdq_active_sequences']} active")
            time.sleep(0.2)
        router = scrape(UP.metrics["pdq-router"])
        self.assertGreaterEqual(router.get('pdq_requests_total{code="CANCELLED"}', 0), 1)


if __name__ == "__main__":
    main(__doc__)
