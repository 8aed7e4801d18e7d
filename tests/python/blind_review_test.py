"""`pdq eval blind-ab` and `pdq eval tally` end to end, with the review page
checked in a real browser (Debian's chromium, headless, driven over the
DevTools protocol): the page draws every prompt with its two answers in the
order key.json records, clicks and key presses record votes, the votes
survive a reload, the exported JSON tallies to the expected counts, and the
page's source names neither deployment."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from pdq_cluster import main

ARGS = None


class Browser:
    """A headless chromium and one page, over the DevTools protocol."""

    def __init__(self, chromium):
        import websocket  # from build/pyenv
        self.profile = tempfile.mkdtemp(prefix="pdq-chromium-")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        end = time.time() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > end or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        with open(port_file) as f:
            port = int(f.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url):
        # Mark the page being left: right after Page.navigate the old
        # document may still answer (and say "complete"), so wait for a new
        # document that has finished loading.
        self.eval("window.__pdqLeaving = true")
        self.call("Page.navigate", url=url)
        end = time.time() + 30
        while self.eval("window.__pdqLeaving === true || document.readyState !== 'complete'"):
            if time.time() > end:
                raise RuntimeError(f"{url} did not load")
            time.sleep(0.1)

    def close(self):
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.profile, ignore_errors=True)


class BlindReviewTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="pdq-blind-ab-")
        configs = {
            "a": {"workers": [{"role": "both", "precision": "fp16", "threads": 2,
                               "args": ["--skip-peaks"]}]},
            "b": {"workers": [
                {"role": "prefill", "precision": "w8a8", "threads": 1, "args": ["--skip-peaks"]},
                {"role": "decode", "precision": "w4a16", "threads": 1, "args": ["--skip-peaks"]}]},
        }
        for side, cfg in configs.items():
            cfg["model"] = ARGS.model
            with open(os.path.join(cls.dir, f"{side}.json"), "w") as f:
                json.dump(cfg, f)
        cls.out = os.path.join(cls.dir, "review")
        run = subprocess.run(
            [ARGS.pdq, "eval", "blind-ab", "--prompts", "eval/prompts/review-100.txt",
             "--a", os.path.join(cls.dir, "a.json"), "--b", os.path.join(cls.dir, "b.json"),
             "--out", cls.out, "--count", "6", "--max-tokens", "24"],
            capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        with open(os.path.join(cls.out, "key.json")) as f:
            cls.key = json.load(f)
        with open(os.path.join(cls.out, "answers.json")) as f:
            cls.answers = json.load(f)["answers"]
        cls.browser = Browser(ARGS.chromium)
        cls.url = "file://" + os.path.join(cls.out, "review.html")
        cls.browser.open(cls.url)

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_1_page_shows_each_pair_in_the_keys_order(self):
        b = self.browser
        self.assertEqual(b.eval("document.querySelectorAll('section.item').length"), 6)
        shown = b.eval("[...document.querySelectorAll('.answer')].map(e => e.textContent)")
        prompts = b.eval("[...document.querySelectorAll('.prompt')].map(e => e.textContent)")
        for i, (answer, key) in enumerate(zip(self.answers, self.key["key"])):
            self.assertTrue(prompts[i].endswith(answer["prompt"]))
            left, right = (answer["a"], answer["b"]) if key["left"] == "a" else (answer["b"], answer["a"])
            self.assertEqual(shown[2 * i], left)
            self.assertEqual(shown[2 * i + 1], right)
        with open(os.path.join(self.out, "review.html")) as f:
            source = f.read()
        for side in ("a.json", "b.json", "fp16", "w8a8", "w4a16"):
            self.assertNotIn(side, source, "the page must not say which deployment answered")

    def test_2_clicks_and_keys_vote_and_the_export_tallies(self):
        b = self.browser
        click = "document.querySelectorAll('section.item')[{}].querySelector('button[data-choice={}]').click()"
        b.eval(click.format(0, "left"))
        b.eval(click.format(1, "right"))
        b.eval(click.format(2, "tie"))
        b.eval(click.format(2, "left"))  # a changed mind: the last click counts
        b.eval("document.dispatchEvent(new KeyboardEvent('keydown', {key: '2'}))")  # item 4
        self.assertEqual(b.eval("document.getElementById('progress').textContent"), "4 of 6 voted")
        self.assertEqual(b.eval("document.querySelectorAll('section.item.voted').length"), 4)
        # Votes are kept in the browser across a reload. Chromium commits a
        # page's localStorage writes to its storage asynchronously, so a
        # reload within milliseconds of the last click can read the store
        # before they land (seen once in CI: "0 of 6 voted"); a user's
        # reload cannot be that quick. Reload until they show, up to 10 s.
        end = time.time() + 10
        while True:
            b.open(self.url)
            progress = b.eval("document.getElementById('progress').textContent")
            if progress == "4 of 6 voted" or time.time() > end:
                break
            time.sleep(0.5)
        self.assertEqual(progress, "4 of 6 voted")
        exported = json.loads(b.eval("document.getElementById('export').value"))
        self.assertEqual(exported["review_id"], self.key["review_id"])
        self.assertEqual([v["choice"] for v in exported["votes"]], ["left", "right", "left", "right"])
        votes = os.path.join(self.dir, "votes.json")
        with open(votes, "w") as f:
            json.dump(exported, f)
        expected = {"a": 0, "b": 0}
        for v in exported["votes"]:
            left = self.key["key"][v["id"] - 1]["left"]
            expected[left if v["choice"] == "left" else ("b" if left == "a" else "a")] += 1
        counts = os.path.join(self.dir, "tally.json")
        subprocess.run([ARGS.pdq, "eval", "tally", "--key", os.path.join(self.out, "key.json"),
                        "--votes", votes, "--json", counts], check=True, capture_output=True)
        with open(counts) as f:
            tally = json.load(f)
        self.assertEqual((tally["a_better"], tally["b_better"], tally["ties"]),
                         (expected["a"], expected["b"], 0))
        self.assertLessEqual(tally["b_share_low"], tally["b_share"])
        self.assertGreaterEqual(tally["b_share_high"], tally["b_share"])

    def test_3_tally_refuses_votes_of_another_review(self):
        other = os.path.join(self.dir, "other.json")
        with open(other, "w") as f:
            json.dump({"review_id": "0000", "votes": []}, f)
        r = subprocess.run([ARGS.pdq, "eval", "tally", "--key", os.path.join(self.out, "key.json"),
                            "--votes", other], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("belongs to review 0000", r.stderr)


if __name__ == "__main__":
    main(__doc__,
         extra=lambda p: p.add_argument("--chromium", default=shutil.which("chromium") or ""),
         check=lambda a: None if a.chromium
         else "chromium is not installed (scripts/install_deps.sh installs it)")
