#!/usr/bin/env python3
"""Checks pdq's FP16 forward pass against llama.cpp (via llama-cpp-python).

The reference is llama.cpp running the "FP16 reference model": the Q4_1/Q8_0
GGUF with every quantized tensor dequantized and rounded to FP16 (norm weights
stay F32), written by make_f16_gguf.py. llama.cpp shares no code with pdq, so
agreement here checks pdq's tokenizer, chat template, forward pass and
perplexity loop end to end.

Checks:
  a. Greedy decoding of raw prompts (no BOS, special tokens not parsed): the
     prompt token count and 48 greedy tokens (argmax of llama.cpp's logits,
     no sampler) against `pdq generate --json`. At the first divergence the
     llama.cpp top-1/top-2 logit margin is reported: near-ties can flip
     legitimately between two FP16 implementations.
  b. The chat case: ChatML rendered here (default SmolLM2 system prompt) and
     tokenized with special=True, against `pdq generate --chat --json`.
  c. Perplexity by llama-perplexity's method over the first CHUNKS windows of
     wikitext-2 test (ctx 512, no BOS, KV cache cleared per window, positions
     256..510 predict the next token, log-softmax in float64) against
     `pdq perplexity --ctx 512 --chunks CHUNKS --json`.

Setup and run, from the repository root:
    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install gguf numpy llama-cpp-python
    /tmp/refenv/bin/python tests/reference/make_f16_gguf.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-f16.gguf
    /tmp/refenv/bin/python tests/reference/compare_llama_cpp.py \
        [--model-f16 /tmp/smollm2-f16.gguf] [--pdq build/bin/pdq] [--chunks 8]

Exit status is 0 whatever the results; read the report.
"""
import argparse
import json
import math
import subprocess
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    " = Robert Boulter = \n\n Robert Boulter is an English film , television and theatre actor .",
    "1, 2, 3, 4,",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
N_GEN = 48
WIKI = "/work/shared/data/wikitext-2-raw/wiki.test.raw"


def chatml(user: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def run_pdq(args, *flags):
    cmd = [args.pdq, *flags, "--model", args.model_q, "--threads", str(args.threads), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)  # pdq prints the JSON object on stdout, logs on stderr


def greedy(llm: Llama, prompt_ids, n_gen):
    """Greedy decode with llama.cpp: returns tokens and the top1-top2 margin per step."""
    llm.reset()
    llm.eval(prompt_ids)
    toks, margins, is_eog = [], [], []
    vocab = llm._model.vocab
    for _ in range(n_gen):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top2 = np.argsort(logits)[-2:][::-1]
        t = int(top2[0])
        toks.append(t)
        margins.append(float(logits[top2[0]] - logits[top2[1]]))
        eog = bool(llama_cpp.llama_vocab_is_eog(vocab, t))
        is_eog.append(eog)
        if eog:
            break
        llm.eval([t])
    return toks, margins, is_eog


def compare_generation(llm, args, label, text, chat):
    ref_prompt = llm.tokenize((chatml(text) if chat else text).encode(), add_bos=False, special=chat)
    ref_toks, margins, is_eog = greedy(llm, ref_prompt, N_GEN)
    flags = ["generate", "--prompt", text, "--max-tokens", str(N_GEN)] + (["--chat"] if chat else [])
    p = run_pdq(args, *flags)
    pdq_toks = p["tokens"]
    # llama.cpp's list may end with the EOG token; pdq's omits it.
    ref_body = ref_toks[:-1] if is_eog and is_eog[-1] else ref_toks
    n = min(len(ref_body), len(pdq_toks))
    div = next((i for i in range(n) if ref_body[i] != pdq_toks[i]), None)
    if div is None and len(ref_body) != len(pdq_toks):
        div = n  # one stopped (EOG) where the other kept going
    row = {
        "label": label,
        "prompt_tokens_ref": len(ref_prompt),
        "prompt_tokens_pdq": p["prompt_tokens"],
        "gen_ref": len(ref_body),
        "ref_eog": bool(is_eog and is_eog[-1]),
        "gen_pdq": len(pdq_toks),
        "pdq_stop": p.get("stop_reason"),
        "agree": n if div is None else div,
        "first_div": div,
        "margin_at_div": None if div is None or div >= len(margins) else margins[div],
        "min_margin_common": min(margins[: (n if div is None else div) + 1]) if margins else None,
    }
    if div is not None:
        row["ref_tok"] = ref_toks[div] if div < len(ref_toks) else None
        row["pdq_tok"] = pdq_toks[div] if div < len(pdq_toks) else None
        row["ref_text"] = llm.detokenize(ref_body).decode(errors="replace")
        row["pdq_text"] = p["text"]
    return row


def reference_perplexity(llm: Llama, n_ctx, n_chunks):
    with open(WIKI, "rb") as f:
        data = f.read()
    toks = llm.tokenize(data, add_bos=False, special=False)
    n_chunks = min(n_chunks, len(toks) // n_ctx)
    first = n_ctx // 2
    nll, count, per_chunk = 0.0, 0, []
    for c in range(n_chunks):
        chunk = toks[c * n_ctx:(c + 1) * n_ctx]
        llm.reset()
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)  # llama-perplexity clears the KV cache per chunk
        llm.eval(chunk)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float64)
        c_nll = 0.0
        for i in range(first, n_ctx - 1):
            row = logits[i]
            m = row.max()
            lse = m + math.log(np.exp(row - m).sum())
            c_nll += lse - row[chunk[i + 1]]
        nll += c_nll
        count += n_ctx - 1 - first
        per_chunk.append(math.exp(nll / count))
        print(f"  ref chunk {c + 1}/{n_chunks}: running ppl {per_chunk[-1]:.6f}", flush=True)
    return {"tokens_total": len(toks), "nll_mean": nll / count, "ppl": math.exp(nll / count),
            "tokens_scored": count, "running": per_chunk}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-f16", default="/tmp/smollm2-f16.gguf")
    ap.add_argument("--model-q", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--pdq", default="build/bin/pdq")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()

    llm = Llama(model_path=args.model_f16, n_ctx=1024, n_batch=512, logits_all=True,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    print(f"llama-cpp-python {llama_cpp.__version__}; n_ctx={llm.n_ctx()} n_vocab={llm.n_vocab()}")

    rows = []
    for i, t in enumerate(PROMPTS):
        rows.append(compare_generation(llm, args, f"raw{i}: {t[:30]!r}", t, chat=False))
    for i, t in enumerate(CHAT_PROMPTS):
        rows.append(compare_generation(llm, args, f"chat{i}: {t[:30]!r}", t, chat=True))

    print("\n== greedy generation (48 tokens) ==")
    for r in rows:
        ok = r["first_div"] is None
        print(f"{r['label']:42s} prompt toks ref/pdq {r['prompt_tokens_ref']}/{r['prompt_tokens_pdq']}"
              f"  gen ref/pdq {r['gen_ref']}{'+EOG' if r['ref_eog'] else ''}/{r['gen_pdq']}({r['pdq_stop']})"
              f"  {'IDENTICAL' if ok else 'diverge@' + str(r['first_div'])}"
              f"  min-margin {r['min_margin_common']:.4f}"
              + ("" if ok else f"  margin@div {r['margin_at_div']}  ref {r.get('ref_tok')} pdq {r.get('pdq_tok')}"))
        if not ok:
            print(f"    ref: {r['ref_text']!r}\n    pdq: {r['pdq_text']!r}")

    if args.skip_ppl:
        return
    print(f"\n== perplexity, wikitext-2 test, ctx 512, {args.chunks} chunks ==")
    ref = reference_perplexity(llm, 512, args.chunks)
    p = run_pdq(args, "perplexity", "--text", WIKI, "--ctx", "512", "--chunks", str(args.chunks))
    rel = (p["ppl"] - ref["ppl"]) / ref["ppl"]
    print(f"llama.cpp (f16 gguf): ppl {ref['ppl']:.6f} nll_mean {ref['nll_mean']:.8f} "
          f"tokens_scored {ref['tokens_scored']} (file = {ref['tokens_total']} tokens)")
    print(f"pdq fp16:             ppl {p['ppl']:.6f} nll_mean {p['nll_mean']:.8f} tokens_scored {p['tokens_scored']}")
    print(f"relative difference (pdq-ref)/ref: {rel:+.3e}; nll diff {p['nll_mean'] - ref['nll_mean']:+.3e}")


if __name__ == "__main__":
    main()
