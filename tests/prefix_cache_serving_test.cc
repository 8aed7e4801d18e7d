// KV reuse across requests through real processes: multi-turn conversations
// answer exactly as they do with the prefix cache off (monolithic and one
// prefill + one decode worker; FP16, and W8A8 prefill with W4A16 decode
// reusing only its own precision's KV), reuse every precision's KV by
// default,
// later turns reuse their prefix (cached_tokens), the short-suffix path on
// the decode worker answers as the prefill worker's path does, eviction
// keeps answers and block counts right, salts isolate, and the router
// sends a follow-up to the worker holding its conversation, and a local
// prefill started with its reservation answers as one that waited for its
// Decode call, and new chats sharing a system prompt stay with a prefill
// worker of another precision that holds it too.
#include <functional>
#include <latch>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/serving_cluster.h"
#include "tests/test_models.h"

namespace pdq::testing {
namespace {

constexpr int kTurns = 3;
constexpr int kAnswerTokens = 12;

// The user's message for turn `t` of conversation `c`; the first is long
// enough to fill several KV blocks.
std::string Message(int c, int t) {
  if (t == 0) {
    return "Conversation " + std::to_string(c) + ". " + LongText(70 + 9 * c) +
           kPrompts[c % kPrompts.size()];
  }
  return kPrompts[(c + t) % kPrompts.size()] + " Answer in one sentence.";
}

struct Conversation {
  std::vector<std::vector<int32_t>> answers;  // per turn
  std::vector<int> cached;                    // per turn: summary.cached_tokens
  std::vector<int> prompt;                    // per turn: summary.prompt_tokens
};

// Runs a turn (`run`) of turn number `turn`, however the caller orders turns.
using TurnGate = std::function<void(int turn, const std::function<void()>& run)>;

// Runs conversation `c`: every turn resends the earlier messages and
// answers (as a chat) with a new user message, greedy; each turn through
// `gate` when given.
Conversation Converse(v1::Pdq::Stub& stub, int c, const std::string& salt = "",
                      const TurnGate& gate = nullptr) {
  Conversation out;
  v1::GenerateRequest r;
  r.set_max_tokens(kAnswerTokens);
  r.set_cache_salt(salt);
  for (int t = 0; t < kTurns; ++t) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(Message(c, t));
    Answer a;
    auto run = [&] { a = Generate(stub, r); };
    if (gate) {
      gate(t, run);
    } else {
      run();
    }
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
    if (!a.status.ok()) break;
    out.answers.push_back(a.tokens);
    out.cached.push_back(a.summary.cached_tokens());
    out.prompt.push_back(a.summary.prompt_tokens());
    v1::ChatMessage* reply = r.mutable_chat()->add_messages();
    reply->set_role("assistant");
    reply->set_content(a.text);
  }
  return out;
}

struct Deployment {
  Proc router;
  std::vector<Proc> workers;
  std::unique_ptr<v1::Pdq::Stub> stub;
};

// One router and its workers: "both" (args for it) or a prefill and a
// decode worker.
Deployment Start(Cluster& c, const std::vector<std::string>& router_args,
                 const std::vector<std::pair<std::string, std::vector<std::string>>>& workers) {
  Deployment d;
  d.router = c.Router(router_args);
  if (!d.router.ok()) return d;
  for (const auto& [role, args] : workers) {
    std::vector<std::string> a = args;
    std::string precision = "fp16";
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      if (a[i] == "--precision") precision = a[i + 1], a.erase(a.begin() + i, a.begin() + i + 2);
    }
    d.workers.push_back(c.Worker(d.router.address, role, precision, a));
    if (!d.workers.back().ok()) return d;
  }
  auto stub = Client(d.router.address);
  if (WaitForWorkers(*stub, (int)workers.size())) d.stub = std::move(stub);
  return d;
}

// How much of a later turn must come from the cache.
enum class Reuse {
  kAll,    // everything up to the previous answer, less a partly filled block
  kSome,   // some (the prompts, when the answers were written at another precision)
};

// Which turns must answer as the reference (its cache off) does.
enum class Same {
  kAllTurns,  // reuse of KV its own precision wrote only
  // The first conversation's first turn, which reads nothing cached; the
  // rest may read KV of another precision (close, not equal).
  kFirstTurn,
};

// Answers equal the reference's turn by turn (as `same` says); first turns
// reuse nothing, later ones as `reuse` says.
void ExpectSame(const std::vector<Conversation>& got, const std::vector<Conversation>& want,
                Reuse reuse, const std::string& what, Same same = Same::kAllTurns) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size(); ++c) {
    SCOPED_TRACE(what + ", conversation " + std::to_string(c));
    ASSERT_EQ(got[c].answers.size(), (size_t)kTurns);
    for (int t = 0; t < kTurns; ++t) {
      if ((c == 0 && t == 0) || same == Same::kAllTurns) {
        EXPECT_EQ(got[c].answers[t], want[c].answers[t]) << "turn " << t + 1;
        EXPECT_EQ(got[c].prompt[t], want[c].prompt[t]) << "turn " << t + 1;
      }
      EXPECT_EQ(want[c].cached[t], 0) << "the reference has its cache off";
      if (t == 0) {
        // A new conversation shares at most the chat template's system
        // prompt with earlier ones.
        if (c == 0) {
          EXPECT_EQ(got[c].cached[t], 0) << "turn 1";
        }
        EXPECT_LE(got[c].cached[t], 48) << "turn 1";
      } else if (reuse == Reuse::kAll) {
        EXPECT_GE(got[c].cached[t], got[c].prompt[t - 1] - 16) << "turn " << t + 1;
      } else {
        EXPECT_GT(got[c].cached[t], 0) << "turn " << t + 1;
      }
      EXPECT_LT(got[c].cached[t], got[c].prompt[t]) << "turn " << t + 1;
    }
  }
}

std::vector<Conversation> ConverseAll(const Deployment& d, int n) {
  std::vector<Conversation> out;
  for (int c = 0; c < n; ++c) out.push_back(Converse(*d.stub, c));
  return out;
}

void ExpectAllFree(const Deployment& d) {
  for (const Proc& w : d.workers) ExpectAllBlocksFree(w.address, "worker " + w.address);
}

TEST(PrefixCacheServingTest, Fp16ConversationsAnswerTheSameWithTheCacheOnAndOff) {
  Cluster c;
  const std::vector<std::string> off = {"--prefix-cache", "off"};
  Deployment ref = Start(c, {}, {{"both", off}});
  ASSERT_NE(ref.stub, nullptr);
  const std::vector<Conversation> want = ConverseAll(ref, 2);
  for (const Conversation& x : want) {
    ASSERT_EQ(x.answers.size(), (size_t)kTurns);
  }

  Deployment mono = Start(c, {}, {{"both", {}}});
  ASSERT_NE(mono.stub, nullptr);
  ExpectSame(ConverseAll(mono, 2), want, Reuse::kAll, "monolithic");
  ExpectAllFree(mono);
  // Salts: the same first prompt under another salt reuses nothing; under
  // the first salt again it does.
  v1::GenerateRequest r = Chat(Message(0, 0), 2);
  r.set_cache_salt("tenant-a");
  EXPECT_EQ(Generate(*mono.stub, r).summary.cached_tokens(), 0);
  r.set_cache_salt("tenant-b");
  EXPECT_EQ(Generate(*mono.stub, r).summary.cached_tokens(), 0);
  EXPECT_GT(Generate(*mono.stub, r).summary.cached_tokens(), 0);
  EXPECT_GT(Metric(mono.workers[0].metrics,
                   "pdq_prefix_cache_hit_tokens_total{pool=\"\",writer=\"fp16\"}"),
            0);

  // 1P+1D, every turn through the prefill worker: the decode worker holds
  // the earlier turns and the prefill sends only the rest.
  Deployment split = Start(c, {"--local-prefill-tokens", "0"}, {{"prefill", {}}, {"decode", {}}});
  ASSERT_NE(split.stub, nullptr);
  ExpectSame(ConverseAll(split, 2), want, Reuse::kAll, "1P+1D through the prefill worker");
  ExpectAllFree(split);

  // 1P+1D where the decode worker prefills short follow-ups itself: the
  // prefill worker sees the first turns only (the second conversation's
  // too is short once the system prompt is cached).
  Deployment local = Start(c, {}, {{"prefill", {}}, {"decode", {}}});
  ASSERT_NE(local.stub, nullptr);
  ExpectSame(ConverseAll(local, 2), want, Reuse::kAll, "1P+1D, short suffixes on the decode worker");
  const double prefills = Metric(local.workers[0].metrics, "pdq_requests_total{code=\"OK\"}");
  EXPECT_GE(prefills, 1);
  EXPECT_LE(prefills, 2);
  ExpectAllFree(local);
}

TEST(PrefixCacheServingTest, W8a8W4a16ConversationsAnswerTheSameWithTheCacheOnAndOff) {
  Cluster c;
  const std::vector<std::string> both = {"--prefill-precision", "w8a8", "--precision", "w4a16"};
  std::vector<std::string> both_off = both;
  both_off.insert(both_off.end(), {"--prefix-cache", "off"});
  Deployment ref = Start(c, {}, {{"both", both_off}});
  ASSERT_NE(ref.stub, nullptr);
  const std::vector<Conversation> want = ConverseAll(ref, 2);

  // Exact reuse: the W4A16-written answers are not reused by the W8A8
  // prefill (not the precision that would write them), the prompts before
  // them are; and the decode worker never prefills.
  const std::string exact = "--reuse-kv-any-precision=false";
  std::vector<std::string> both_exact = both;
  both_exact.push_back(exact);
  Deployment mono = Start(c, {}, {{"both", both_exact}});
  ASSERT_NE(mono.stub, nullptr);
  ExpectSame(ConverseAll(mono, 2), want, Reuse::kSome, "monolithic, exact reuse");
  ExpectAllFree(mono);
  Deployment split = Start(
      c, {},
      {{"prefill", {"--precision", "w8a8", exact}}, {"decode", {"--precision", "w4a16", exact}}});
  ASSERT_NE(split.stub, nullptr);
  ExpectSame(ConverseAll(split, 2), want, Reuse::kSome, "1P+1D, exact reuse");
  ExpectAllFree(split);
}

// The default reuses any precision's KV: a later turn reuses the W4A16-
// written answer too (the W8A8 prefill reads it), and in 1P+1D the decode
// worker prefills the short follow-ups itself at W4A16 (not a new
// conversation's first turn, which shares only a system prompt). The first turn
// answers as without the cache (nothing cached to read); the rest need not
// (the evaluation report measures how close they stay).
TEST(PrefixCacheServingTest, W8a8W4a16ConversationsReuseEveryPrecisionsKvByDefault) {
  Cluster c;
  Deployment ref = Start(
      c, {},
      {{"both", {"--prefill-precision", "w8a8", "--precision", "w4a16", "--prefix-cache", "off"}}});
  ASSERT_NE(ref.stub, nullptr);
  const std::vector<Conversation> want = ConverseAll(ref, 2);

  Deployment mono =
      Start(c, {}, {{"both", {"--prefill-precision", "w8a8", "--precision", "w4a16"}}});
  ASSERT_NE(mono.stub, nullptr);
  ExpectSame(ConverseAll(mono, 2), want, Reuse::kAll, "monolithic", Same::kFirstTurn);
  EXPECT_GT(Metric(mono.workers[0].metrics,
                   "pdq_prefix_cache_hit_tokens_total{pool=\"\",writer=\"w4a16\"}"),
            0)
      << "the W8A8 prefill read no W4A16-written answer";
  ExpectAllFree(mono);

  Deployment split = Start(c, {}, {{"prefill", {"--precision", "w8a8"}},
                                   {"decode", {"--precision", "w4a16"}}});
  ASSERT_NE(split.stub, nullptr);
  ExpectSame(ConverseAll(split, 2), want, Reuse::kAll, "1P+1D", Same::kFirstTurn);
  // The prefill worker saw both first turns (the second conversation's
  // shares only the chat template's first block with the first, which is
  // less than it lacks) and the first conversation's second turn: the first
  // answer (12 tokens) fits in the block its prompt left partly filled, so
  // the decode worker holds no more of that turn than the prefill worker
  // does. Every other later turn the decode worker prefilled at W4A16: it
  // held the previous answer's blocks, which the prefill worker lacks.
  EXPECT_EQ(Metric(split.workers[0].metrics, "pdq_requests_total{code=\"OK\"}"), 3);
  ExpectAllFree(split);
}

// Fresh chats that share a long system prompt, on 1P+1D W8A8/W4A16: the
// decode worker holds the system prompt (sent with the first chat), more
// than each new chat's own message, but so does the prefill worker, so each
// chat is prefilled there, reusing the system prompt, not on the decode
// worker at W4A16 (which the rule before the router told it what the
// prefill worker holds did).
TEST(PrefixCacheServingTest, FreshChatsSharingASystemPromptStayWithTheW8a8PrefillWorker) {
  Cluster c;
  Deployment split =
      Start(c, {}, {{"prefill", {"--precision", "w8a8"}}, {"decode", {"--precision", "w4a16"}}});
  ASSERT_NE(split.stub, nullptr);
  const std::string system = "You answer questions about this text. " + LongText(90);
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest r;
    r.set_max_tokens(4);
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("system");
    m->set_content(system);
    m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(kPrompts[i % kPrompts.size()]);
    const Answer a = Generate(*split.stub, r);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    if (i > 0) {
      // The system prompt came from the prefill worker's cache, and is
      // most of the prompt: without the router's word, the decode worker
      // would have prefilled the rest.
      EXPECT_GT(a.summary.cached_tokens(), a.summary.prompt_tokens() / 2) << "chat " << i;
    }
  }
  EXPECT_EQ(Metric(split.workers[0].metrics, "pdq_requests_total{code=\"OK\"}"), 3);
  ExpectAllFree(split);
}

// The decode worker's own reservation and Decode calls, as the router makes
// them for a follow-up whose missing tokens the decode worker prefills.
struct DecodeCalls {
  std::unique_ptr<v1::DecodeWorker::Stub> stub;
  std::string layout;  // the model's KvLayout, serialized

  absl::StatusOr<v1::ReserveResponse> Reserve(const std::string& id,
                                              const std::vector<int32_t>& prompt, int max_tokens,
                                              const v1::SamplingParams* first_sampling) {
    v1::ReserveRequest r;
    r.set_request_id(id);
    r.set_prompt_tokens((int64_t)prompt.size());
    r.set_max_tokens(max_tokens);
    r.set_kv_layout(layout);
    for (int32_t t : prompt) r.add_prompt(t);
    r.set_local_prefill_max_tokens(256);
    r.set_kv_writer("fp16");
    if (first_sampling != nullptr) *r.mutable_first_sampling() = *first_sampling;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ReserveResponse resp;
    grpc::Status st = stub->Reserve(&ctx, r, &resp);
    if (!st.ok()) return absl::InternalError(st.error_message());
    return resp;
  }

  Answer Decode(const std::string& id, const std::string& reservation,
                const v1::SamplingParams& sampling, int max_tokens) {
    v1::DecodeRequest r;
    r.set_request_id(id);
    r.set_reservation_id(reservation);
    *r.mutable_sampling() = sampling;
    r.set_max_tokens(max_tokens);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Decode(&ctx, r);
    return ReadToEnd(*reader, {});
  }
};

// A follow-up's short suffix, prefilled on the decode worker, starts with
// its reservation when that brings the first token's sampling, and its first
// token waits for the Decode call: the answer (sampled, seeded: the draws
// must line up) is the same whether the call comes during that prefill or
// after it, and as when the prefill waits for the call. A Decode call with
// other sampling is refused; a reservation whose call never comes lets its
// blocks go with its lease.
TEST(PrefixCacheServingTest, ALocalPrefillStartedWithItsReservationAnswersTheSame) {
  Cluster c;
  Deployment d = Start(c, {}, {{"prefill", {}}, {"decode", {"--lease-seconds", "2"}}});
  ASSERT_NE(d.stub, nullptr);
  const Proc& decode = d.workers[1];
  const TestModel model = LoadOrDie(kModel, 1);
  ASSERT_TRUE(model);
  DecodeCalls calls{v1::DecodeWorker::NewStub(
                        grpc::CreateChannel(decode.address, grpc::InsecureChannelCredentials())),
                    model->kv_layout().Serialize()};

  // Turn 1 through the router: the decode worker caches its prompt.
  auto tokenize = [&](const std::string& text) {
    grpc::ClientContext ctx;
    v1::TokenizeRequest t;
    t.set_text(text);
    v1::TokenizeResponse ids;
    EXPECT_TRUE(d.stub->Tokenize(&ctx, t, &ids).ok());
    return std::vector<int32_t>(ids.ids().begin(), ids.ids().end());
  };
  const std::vector<int32_t> prompt = tokenize(LongText(90) + kPrompts[0]);
  const std::vector<int32_t> question = tokenize(" Now something else. " + kPrompts[1]);
  ASSERT_FALSE(prompt.empty() || question.empty());
  v1::GenerateRequest first;
  first.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  first.set_max_tokens(8);
  const Answer a1 = Generate(*d.stub, first);
  ASSERT_TRUE(a1.status.ok()) << a1.status.error_message();
  std::vector<int32_t> follow_up = prompt;
  follow_up.insert(follow_up.end(), a1.tokens.begin(), a1.tokens.end());
  follow_up.insert(follow_up.end(), question.begin(), question.end());

  // Hot enough that a draw out of step picks other tokens.
  v1::SamplingParams sampling;
  sampling.set_temperature(1.5f);
  sampling.set_seed(7);
  constexpr int kTokens = 12;
  const std::string tokens_series = "pdq_prefill_tokens_total";
  auto prefilled = [&] { return Metric(decode.metrics, tokens_series); };

  // Prefilled before its call: the tokens are computed with no Decode call.
  const double before = prefilled();
  ASSERT_GE(before, 0) << tokens_series << " is not in the decode worker's metrics";
  absl::StatusOr<v1::ReserveResponse> early = calls.Reserve("early", follow_up, kTokens, &sampling);
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_TRUE(early->local_prefill());
  EXPECT_GT(early->cached_tokens(), 0);
  const double missing = double(follow_up.size() - early->cached_tokens());
  EXPECT_EQ(MetricSoon(decode.metrics, tokens_series, before + missing), before + missing);
  const Answer parked = calls.Decode("early", early->reservation_id(), sampling, kTokens);
  ASSERT_TRUE(parked.status.ok()) << parked.status.error_message();
  ASSERT_EQ(parked.tokens.size(), (size_t)kTokens);

  // The call right behind the reservation (during its prefill, or after).
  absl::StatusOr<v1::ReserveResponse> racing =
      calls.Reserve("racing", follow_up, kTokens, &sampling);
  ASSERT_TRUE(racing.ok() && racing->local_prefill()) << racing.status();
  EXPECT_EQ(calls.Decode("racing", racing->reservation_id(), sampling, kTokens).tokens,
            parked.tokens);

  // The prefill waiting for its call, as before reservations brought the
  // sampling.
  absl::StatusOr<v1::ReserveResponse> late = calls.Reserve("late", follow_up, kTokens, nullptr);
  ASSERT_TRUE(late.ok() && late->local_prefill()) << late.status();
  EXPECT_EQ(calls.Decode("late", late->reservation_id(), sampling, kTokens).tokens, parked.tokens);

  // The router's own path for the same follow-up.
  v1::GenerateRequest routed;
  routed.mutable_tokens()->mutable_ids()->Add(follow_up.begin(), follow_up.end());
  *routed.mutable_sampling() = sampling;
  routed.set_max_tokens(kTokens);
  routed.set_ignore_eos(true);
  const Answer via_router = Generate(*d.stub, routed);
  ASSERT_TRUE(via_router.status.ok()) << via_router.status.error_message();
  EXPECT_EQ(via_router.tokens, parked.tokens);
  EXPECT_GT(via_router.summary.cached_tokens(), 0);

  // Another seed in the call than the reservation drew the first token with.
  absl::StatusOr<v1::ReserveResponse> other = calls.Reserve("other", follow_up, kTokens, &sampling);
  ASSERT_TRUE(other.ok() && other->local_prefill()) << other.status();
  v1::SamplingParams reseeded = sampling;
  reseeded.set_seed(8);
  const Answer refused = calls.Decode("other", other->reservation_id(), reseeded, kTokens);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("sampling differs"), std::string::npos)
      << refused.status.error_message();

  // No call at all: prefilled, then let go after the 2 s lease.
  absl::StatusOr<v1::ReserveResponse> orphan =
      calls.Reserve("orphan", follow_up, kTokens, &sampling);
  ASSERT_TRUE(orphan.ok() && orphan->local_prefill()) << orphan.status();
  // (Each load is the worker's sample after its last step.)
  auto held_soon = [&](int64_t want) {
    const auto end = Clock::now() + std::chrono::seconds(20);
    int64_t held = Load(decode.address).sequences_held();
    while (held != want && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      held = Load(decode.address).sequences_held();
    }
    return held;
  };
  EXPECT_EQ(held_soon(1), 1) << "the reservation is held";
  EXPECT_EQ(held_soon(0), 0) << "its lease ended";
  ExpectAllFree(d);
  const Answer gone = calls.Decode("orphan", orphan->reservation_id(), sampling, kTokens);
  EXPECT_EQ(gone.status.error_code(), grpc::StatusCode::NOT_FOUND) << gone.status.error_message();
}

TEST(PrefixCacheServingTest, EvictionUnderMemoryPressureKeepsAnswersAndBlockCounts) {
  Cluster c;
  Deployment ref = Start(c, {}, {{"both", {"--prefix-cache", "off"}}});
  ASSERT_NE(ref.stub, nullptr);
  const std::vector<Conversation> want = ConverseAll(ref, 3);
  // Room for one conversation's turn at a time (32 blocks of 16 tokens).
  Deployment small = Start(c, {}, {{"both", {"--kv-tokens", "512"}}});
  ASSERT_NE(small.stub, nullptr);
  std::vector<Conversation> got = ConverseAll(small, 3);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].answers.size(), (size_t)kTurns);
    for (int t = 0; t < kTurns; ++t) EXPECT_EQ(got[i].answers[t], want[i].answers[t]);
  }
  // The first conversation was partly evicted to make room for the others
  // (its last blocks first): again, it reuses what is left.
  const Conversation again = Converse(*small.stub, 0);
  EXPECT_EQ(again.answers, want[0].answers);
  EXPECT_GT(Metric(small.workers[0].metrics, "pdq_prefix_cache_evictions_total{pool=\"\"}"), 0);
  ExpectAllFree(small);
}

TEST(PrefixCacheServingTest, TheRouterSendsAFollowUpToTheWorkerHoldingItsConversation) {
  Cluster c;
  // These prompts are short: weigh load lightly, so that the cached prefix
  // decides (the default weight would send a 150-token follow-up to a
  // worker one request less busy).
  Deployment d = Start(c, {"--cache-load-tokens", "32"}, {{"both", {}}, {"both", {}}});
  ASSERT_NE(d.stub, nullptr);
  // Four conversations start at once and spread over both workers; every
  // later turn finds its conversation where the earlier ones ran. The later
  // turns run one at a time: the router weighs a worker's queue and load
  // (as of its last heartbeat) against the prompt its cache lacks, and
  // another conversation's turn queued on the holder could outweigh a
  // follow-up's short cached prefix.
  std::vector<Conversation> got(4);
  std::vector<std::thread> clients;
  std::latch first_turns(4);
  std::mutex one_at_a_time;
  bool idle_heard = false;  // guarded by one_at_a_time
  const TurnGate gate = [&](int turn, const std::function<void()>& run) {
    if (turn == 0) {
      run();
      first_turns.arrive_and_wait();
      return;
    }
    std::lock_guard lock(one_at_a_time);
    if (!idle_heard) {
      // The router weighs load as of each worker's last heartbeat: before
      // the first follow-up, both workers idle and the router told so (three
      // 200 ms heartbeats), or the first turns' streams, just ended, would
      // still count against the worker holding the conversation.
      const auto end = Clock::now() + std::chrono::seconds(20);
      for (const Proc& w : d.workers) {
        while (Clock::now() < end) {
          const v1::WorkerLoad l = Load(w.address);
          if (l.active_sequences() == 0 && l.queued_prompt_tokens() == 0) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      idle_heard = true;
    }
    run();
  };
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] { got[i] = Converse(*d.stub, i, "", gate); });
  }
  for (std::thread& t : clients) t.join();
  for (const Conversation& x : got) {
    ASSERT_EQ(x.answers.size(), (size_t)kTurns);
    for (int t = 1; t < kTurns; ++t) {
      EXPECT_GE(x.cached[t], x.prompt[t - 1] - 16) << "turn " << t + 1;
    }
  }
  for (const Proc& w : d.workers) {
    EXPECT_GT(Metric(w.metrics, "pdq_prefix_cache_hit_tokens_total{pool=\"\",writer=\"fp16\"}"), 0)
        << "one worker took every conversation";
  }
  // The worker holding conversation 0 dies: its next turn is served by the
  // other one, computed afresh.
  c.Kill(d.workers[0]);
  const Conversation after = Converse(*d.stub, 0);
  ASSERT_EQ(after.answers.size(), (size_t)kTurns);
  EXPECT_EQ(after.answers, got[0].answers);
  ExpectAllBlocksFree(d.workers[1].address, "the surviving worker");
}

}  // namespace
}  // namespace pdq::testing
