// KV transfer throughput of every transport backend against memcpy, measured
// in one run: two KV caches in this process, a prompt's KV sent from one to
// the other over a real connection on loopback (handshake, one-time token,
// every layer, the checksummed notice and its acknowledgement), and the same
// spans copied with memcpy on one thread, which is what one connection
// competes with.
//
//   kv_transfer_bench [--tokens 512,2048,8192] [--reps 5] [--layers 30]
//                     [--kv-heads 3] [--head-dim 64] [--block-tokens 16]
//
// The default shape is SmolLM2-135M's (30 layers, 3 KV heads of 64, FP16).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "flags/flags.h"
#include "kvtransfer/transport.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Pair {
  std::unique_ptr<KvCache> from, to;
  SeqId src = 0, dst = 0;
  std::vector<std::vector<KvSpan>> src_spans, dst_spans;
  int64_t bytes = 0;
};

absl::StatusOr<Pair> MakePair(const KvLayout& layout, int64_t tokens) {
  Pair p;
  const int64_t blocks = (tokens + layout.block_tokens - 1) / layout.block_tokens + 1;
  absl::StatusOr<std::unique_ptr<KvCache>> a = KvCache::Create({layout, blocks});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::unique_ptr<KvCache>> b = KvCache::Create({layout, blocks});
  if (!b.ok()) return b.status();
  p.from = std::move(*a);
  p.to = std::move(*b);
  p.src = p.from->AddSequence();
  if (absl::Status s = p.from->Reserve(p.src, tokens); !s.ok()) return s;
  if (absl::Status s = p.from->SetLength(p.src, tokens); !s.ok()) return s;
  absl::StatusOr<SeqId> dst = p.to->ImportSequence(layout, tokens);
  if (!dst.ok()) return dst.status();
  p.dst = *dst;
  for (int l = 0; l < layout.num_layers; ++l) {
    p.src_spans.push_back(*p.from->LayerSpans(p.src, l, tokens));
    p.dst_spans.push_back(*p.to->LayerSpans(p.dst, l, tokens));
    for (const KvSpan& s : p.src_spans.back()) {
      std::memset(p.from->SpanData(s), l + 1, s.bytes);  // touched, not zero pages
      p.bytes += s.bytes;
    }
    for (const KvSpan& s : p.dst_spans.back()) std::memset(p.to->SpanData(s), 0, s.bytes);
  }
  return p;
}

double MemcpySeconds(const Pair& p) {
  const auto t0 = Clock::now();
  for (size_t l = 0; l < p.src_spans.size(); ++l) {
    for (size_t i = 0; i < p.src_spans[l].size(); ++i) {
      std::memcpy(p.to->SpanData(p.dst_spans[l][i]), p.from->SpanData(p.src_spans[l][i]),
                  p.src_spans[l][i].bytes);
    }
  }
  return Seconds(t0, Clock::now());
}

// One transfer from Connect to the sender's acknowledgement.
absl::StatusOr<double> TransferSeconds(kvtransfer::Transport& sender,
                                       kvtransfer::Transport& receiver, const Pair& p,
                                       int64_t tokens, const std::string& token) {
  std::promise<absl::Status> received, acknowledged;
  kvtransfer::InboundSpec spec;
  spec.token = token;
  spec.tokens = tokens;
  spec.layers = p.dst_spans;
  spec.done = [&](absl::Status s, const kvtransfer::KvNotice&) { received.set_value(s); };
  absl::StatusOr<std::unique_ptr<kvtransfer::Inbound>> in = receiver.Expect(std::move(spec));
  if (!in.ok()) return in.status();
  const auto t0 = Clock::now();
  std::unique_ptr<kvtransfer::Outbound> out =
      sender.Connect(receiver.address(), token, absl::Now() + absl::Seconds(60),
                     [&](absl::Status s) { acknowledged.set_value(s); });
  for (size_t l = 0; l < p.src_spans.size(); ++l) out->PostLayer((int)l, p.src_spans[l]);
  out->PostDone({1, tokens, 0});
  absl::Status sent = acknowledged.get_future().get();
  const double seconds = Seconds(t0, Clock::now());
  absl::Status got = received.get_future().get();
  if (!sent.ok()) return sent;
  if (!got.ok()) return got;
  return seconds;
}

int Main(int argc, char** argv) {
  std::string tokens_list = "512,2048,8192";
  int64_t reps = 5, layers = 30, kv_heads = 3, head_dim = 64, block_tokens = 16;
  FlagParser flags("kv_transfer_bench",
                   "KV transfer throughput of each transport against memcpy, in one run.",
                   /*program=*/true);
  flags.String("tokens", &tokens_list, "prompt lengths to send, comma-separated");
  flags.Int("reps", &reps, 1, 1000, "transfers per length and transport (the median is shown)");
  flags.Int("layers", &layers, 1, 1024, "layers of the KV layout");
  flags.Int("kv-heads", &kv_heads, 1, 1024, "KV heads");
  flags.Int("head-dim", &head_dim, 1, 1024, "head size");
  flags.Int("block-tokens", &block_tokens, 1, 1024, "tokens per KV block");
  if (int rc = ParseOrExit(flags, argc, argv, 1, "kv_transfer_bench"); rc >= 0) return rc;
  absl::StatusOr<std::vector<int64_t>> lengths_or = IntList("tokens", tokens_list, 1, 1 << 24);
  if (!lengths_or.ok()) {
    std::fprintf(stderr, "kv_transfer_bench: error: %s\n",
                 std::string(lengths_or.status().message()).c_str());
    return 2;
  }
  const std::vector<int64_t>& lengths = *lengths_or;
  KvLayout layout;
  layout.model_fingerprint = 0x6b7662656e6368;  // any: both sides agree
  layout.num_layers = (int32_t)layers;
  layout.kv_heads = (int32_t)kv_heads;
  layout.head_dim = (int32_t)head_dim;
  layout.rope_base = 10000;
  layout.block_tokens = (int32_t)block_tokens;

  std::printf("KV layout: %s\n", layout.ToString().c_str());
  std::printf("%-6s %7s %10s %12s %12s %8s\n", "via", "tokens", "MiB", "GB/s", "memcpy GB/s",
              "ratio");
  int failures = 0, next_token = 0;
  for (int64_t tokens : lengths) {
    absl::StatusOr<Pair> p = MakePair(layout, tokens);
    if (!p.ok()) {
      std::fprintf(stderr, "kv_transfer_bench: %s\n", p.status().ToString().c_str());
      return 1;
    }
    for (const std::string& name : kvtransfer::TransportNames()) {
      kvtransfer::TransportOptions so, ro;
      so.layout = ro.layout = layout;
      so.regions = p->from->MemoryRegions();
      ro.regions = p->to->MemoryRegions();
      absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> sender =
          kvtransfer::CreateTransport(name, so);
      absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> receiver =
          kvtransfer::CreateTransport(name, ro);
      if (!sender.ok() || !receiver.ok()) {
        std::fprintf(stderr, "kv_transfer_bench: %s: %s\n", name.c_str(),
                     (sender.ok() ? receiver.status() : sender.status()).ToString().c_str());
        ++failures;
        continue;
      }
      // Alternate the two so both see the same machine state; the first
      // transfer (connection set-up, page faults) is a warm-up.
      std::vector<double> via, copy;
      for (int64_t r = 0; r <= reps; ++r) {
        absl::StatusOr<double> t = TransferSeconds(**sender, **receiver, *p, tokens,
                                                   "bench-" + std::to_string(next_token++));
        if (!t.ok()) {
          std::fprintf(stderr, "kv_transfer_bench: %s: %s\n", name.c_str(),
                       t.status().ToString().c_str());
          ++failures;
          break;
        }
        const double c = MemcpySeconds(*p);
        if (r == 0) continue;
        via.push_back(*t);
        copy.push_back(c);
      }
      if (via.empty()) continue;
      const double gbps = p->bytes / Median(via) / 1e9, mc = p->bytes / Median(copy) / 1e9;
      std::printf("%-6s %7lld %10.1f %12.2f %12.2f %8.3f\n", name.c_str(), (long long)tokens,
                  p->bytes / 1048576.0, gbps, mc, gbps / mc);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pdq

int main(int argc, char** argv) { return pdq::Main(argc, argv); }
