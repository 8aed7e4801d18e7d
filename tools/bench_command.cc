// `pdq bench`: a streaming load generator against a pdq router (--router)
// or any OpenAI-compatible server (--openai). Prompts are real text
// (WikiText-2 by default) cut to exactly --input-tokens tokens by the
// router's own tokenizer (for --openai, by --model's); generation runs to
// exactly --output-tokens (ignore_eos). At each concurrency level, that many
// clients send requests back to back; the first --warmup answers of a level
// are not counted.
//
// Per level: TTFT, TPOT (each request's mean gap after its first token),
// every inter-token gap, end-to-end latency (p50/p90/p99), requests/s,
// output and total tokens/s, and goodput when targets are given. --json
// writes the summaries and every request's record (harness/bench_result.h).
//
// --workload conversation instead runs --sessions multi-turn chats at once,
// each turn resending the conversation so far (the prompt, its answer, a new
// message), and reports per turn: TTFT, prompt and prefix-cached tokens.
// The loads themselves are harness/load_generator.h; this file is flags,
// connecting, and writing the result.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/check.h"
#include "gguf/gguf.h"
#include "harness/load_generator.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace pdq {
namespace {

namespace v1 = pdq::v1;

struct BenchFlags {
  std::string router = "127.0.0.1:50051", levels = "1", workload = "custom", pattern,
              text = "../shared/data/wikitext-2-raw/wiki.test.raw", json, openai_url, openai_model,
              model = DefaultModelPath();
  ConnectionFlags connection;
  int64_t input_tokens = 128, output_tokens = 128, requests = 0, per_client = 0, warmup = 1,
          timeout_s = 600, cycles = 3, high = 8, low = 1, sessions = 4, turns = 8,
          first_tokens = 512, turn_tokens = 64, shared_prefix_tokens = 0, prompt_seed = 0,
          until_flat = 0, arrival_seed = 1;
  double ttft_target_ms = 0, tpot_target_ms = 0, rate = 0, max_rss_growth_mib = 256,
         temperature = 0;
  bool client_ids = false;

  void Register(FlagParser& flags);
  // Checks the combination given and fills in the workload's lengths; the
  // concurrency levels go to `levels_out`.
  absl::Status Resolve(const FlagParser& flags, std::vector<int>* levels_out);
  bool conversation() const { return workload == "conversation"; }
  // What a report's first line says of the load.
  std::string Shape() const;
  // The longest prompt and answer, which must fit the model's context.
  int64_t Longest() const;
};

void BenchFlags::Register(FlagParser& flags) {
  flags.String("router", &router, "the router's gRPC address (host:port)");
  flags.String("openai", &openai_url,
               "instead of --router: an OpenAI-compatible server's base URL "
               "(http://host:port/v1), measured through streamed /completions");
  flags.String("openai-model", &openai_model,
               "--openai: the model to ask for (default: the first of GET /models)");
  connection.Register(flags);
  flags.String("model", &model,
               "--openai: the GGUF whose tokenizer cuts prompts to their lengths (the served "
               "model's)");
  flags.String("workload", &workload,
               "chat (128 in, 512 out), summarize (2048, 32), analysis (2048, 512), custom "
               "(--input-tokens, --output-tokens), or conversation: --sessions concurrent "
               "chats of --turns turns each, where turn 1 sends a --first-tokens message and "
               "every later turn resends the previous prompt and its answer with a new "
               "--turn-tokens message (as text; for --router tokenized by the router)");
  flags.Int("input-tokens", &input_tokens, 1, 1 << 20, "custom: prompt length in tokens");
  flags.Int("shared-prefix-tokens", &shared_prefix_tokens, 0, 1 << 20,
            "the first N tokens of every prompt are the same (a system prompt), the rest each "
            "request's own: a chat service's load, which a prefix cache serves from the shared "
            "blocks (0: every prompt its own)");
  flags.Int("prompt-seed", &prompt_seed, 0, 1 << 30,
            "where in --text the prompts (conversation: the messages) start: another seed "
            "gives prompts that start apart from those of this one, so a second run against "
            "the same server is not answered from its prefix cache (0: the same places every "
            "run)");
  flags.Float("temperature", &temperature, 0, 2,
              "sampling temperature of the answers; 0 is greedy (an OpenAI client that sends "
              "none gets the API's default, 1)");
  flags.Int("output-tokens", &output_tokens, 1, 1 << 20,
            "custom and conversation: tokens generated per request (conversation: per turn, "
            "64 unless given)");
  flags.Int("sessions", &sessions, 1, 4096, "conversation: concurrent conversations");
  flags.Int("turns", &turns, 1, 10000, "conversation: turns per conversation");
  flags.Int("first-tokens", &first_tokens, 1, 1 << 20,
            "conversation: tokens of the first user message");
  flags.Int("turn-tokens", &turn_tokens, 1, 1 << 20,
            "conversation: tokens of each later user message");
  flags.String("concurrency", &levels, "concurrency levels, comma-separated (1,2,4,8)");
  flags.Int("until-flat", &until_flat, 0, 4096,
            "after the --concurrency levels, double the top one while output tokens/s still "
            "rises (the lowest level within 5% of the most is the top: where it saturates not "
            "yet passed), up to this many clients, so the sweep ends one level past saturation; "
            "0: only the levels given");
  flags.Float("rate", &rate, 0, 1e6,
              "requests per second arriving as a Poisson process, instead of --concurrency");
  flags.Int("arrival-seed", &arrival_seed, 1, 1LL << 62,
            "with --rate: the seed of the arrival times (the first request at once, then "
            "exponential gaps); `pdq sim --seed N` draws the same arrivals, so a simulated run "
            "can be set beside a real one request for request");
  flags.Bool(
      "client-ids", &client_ids,
      "closed loop: each client sends its own id with every request (bench-client-0, "
      "bench-client-1, ...; OpenAI's \"user\"), so a router splitting an A/B rollout "
      "with --split-sticky keeps each client in one pool, as `pdq sim --split-sticky "
      "--client-ids` predicts (the router also uses the id for its per-client rate limits and to "
      "break ties between workers)");
  flags.Int("requests", &requests, 0, 1 << 20,
            "requests counted per level (default: 4 x the level, at least 8; with --rate, 32)");
  flags.Int("requests-per-client", &per_client, 0, 1 << 20,
            "instead of --requests: this many per concurrent client (level x N counted)");
  flags.Int("warmup", &warmup, 0, 1 << 20,
            "requests per level run first and not counted (conversation: one untimed "
            "request of --first-tokens before the sessions start; 0: none)");
  flags.String("text", &text,
               "where prompts come from (plain text; conversation: every user message, each "
               "from its own place)");
  flags.Float("ttft-target-ms", &ttft_target_ms, 0, 1e9, "goodput counts requests within this");
  flags.Float("tpot-target-ms", &tpot_target_ms, 0, 1e9, "...and within this TPOT");
  flags.String("pattern", &pattern,
               "alternate: --cycles of --high then --low concurrency, checking after each low "
               "phase that KV blocks and memory are back and a greedy probe is unchanged");
  flags.Int("cycles", &cycles, 1, 10000, "alternate: cycles");
  flags.Int("high", &high, 1, 4096, "alternate: the high concurrency");
  flags.Int("low", &low, 1, 4096, "alternate: the low concurrency");
  flags.Float("max-rss-growth-mib", &max_rss_growth_mib, 0, 1e9,
              "alternate: how much a worker's resident memory may grow, besides KV pages its "
              "prefix cache touches for the first time (bounded by its --kv-tokens)");
  flags.Int("timeout", &timeout_s, 1, 86400,
            "deadline of each request in seconds (conversation: of each turn; a failed turn "
            "ends its session)");
  flags.String("json", &json, "write the summaries and every request's record here");
}

absl::Status BenchFlags::Resolve(const FlagParser& flags, std::vector<int>* levels_out) {
  if (const char* k = std::getenv("OPENAI_API_KEY");
      k != nullptr && connection.api_key.empty() && !openai_url.empty()) {
    connection.api_key = k;  // what OpenAI's own clients read
  }
  // Flags of one kind of workload only, refused with the other.
  for (const char* f : {"sessions", "turns", "first-tokens", "turn-tokens"}) {
    if (!conversation() && flags.Given(f)) {
      return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --workload conversation"));
    }
  }
  for (const char* f :
       {"input-tokens", "concurrency", "rate", "requests", "requests-per-client", "pattern",
        "ttft-target-ms", "tpot-target-ms", "shared-prefix-tokens", "until-flat", "arrival-seed"}) {
    if (conversation() && flags.Given(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f,
                       " does not apply to --workload conversation (see --sessions, --turns, "
                       "--first-tokens, --turn-tokens)"));
    }
  }
  if (conversation()) {
    if (!flags.Given("output-tokens")) output_tokens = 64;
  } else if (workload != "custom") {
    const WorkloadShape* w = StandardWorkload(workload);
    if (w == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--workload must be chat, summarize, analysis, conversation or custom, not '", workload,
          "'"));
    }
    input_tokens = w->input;
    output_tokens = w->output;
  }
  if (shared_prefix_tokens >= input_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared-prefix-tokens (", shared_prefix_tokens,
                     ") must leave each prompt tokens of its own: less than its ", input_tokens,
                     " input tokens"));
  }
  if (!pattern.empty() && pattern != "alternate") {
    return absl::InvalidArgumentError(
        absl::StrCat("--pattern must be alternate, not '", pattern, "'"));
  }
  if (!openai_url.empty() && pattern == "alternate") {
    return absl::InvalidArgumentError(
        "--pattern alternate reads the workers' metrics: it needs --router");
  }
  if (client_ids && (rate > 0 || conversation())) {
    return absl::InvalidArgumentError(
        "--client-ids names closed-loop clients: not with --rate or --workload conversation");
  }
  if (flags.Given("arrival-seed") && !(rate > 0)) {
    return absl::InvalidArgumentError("--arrival-seed seeds --rate's arrivals: it needs --rate");
  }
  absl::StatusOr<std::vector<int64_t>> parsed = IntList("concurrency", levels, 1, 4096);
  if (!parsed.ok()) return parsed.status();
  for (int64_t n : *parsed) levels_out->push_back((int)n);
  if (until_flat > 0) {
    if (rate > 0 || !pattern.empty()) {
      return absl::InvalidArgumentError(
          "--until-flat extends a concurrency sweep: not with --rate "
          "or --pattern");
    }
    if (!UntilFlatExtends(*levels_out, (int)until_flat)) {
      const int top = *std::max_element(levels_out->begin(), levels_out->end());
      return absl::InvalidArgumentError(
          absl::StrCat("--until-flat ", until_flat,
                       " extends the sweep from its top level by doubling: the "
                       "levels must end at their highest and --until-flat be at least twice it (",
                       2 * top, ")"));
    }
  }
  return absl::OkStatus();
}

std::string BenchFlags::Shape() const {
  return (temperature > 0 ? absl::StrFormat("temperature %g, ", temperature) : std::string()) +
         (conversation()
              ? absl::StrFormat("conversation: %d sessions x %d turns, %d then %d more tokens in "
                                "per turn, %d out",
                                sessions, turns, first_tokens, turn_tokens, output_tokens)
              : absl::StrFormat(
                    "%s: %d in%s, %d out", workload, input_tokens,
                    shared_prefix_tokens > 0
                        ? absl::StrFormat(" (the first %d shared by all)", shared_prefix_tokens)
                        : "",
                    output_tokens));
}

int64_t BenchFlags::Longest() const {
  return conversation() ? first_tokens + (turns - 1) * (turn_tokens + output_tokens) + output_tokens
                        : input_tokens + output_tokens;
}

// The target, and the tokenizer that cuts prompts to their lengths.
struct Connected {
  std::unique_ptr<v1::Pdq::Stub> stub;  // --router only
  std::unique_ptr<BenchTarget> target;
  std::unique_ptr<Tokenizer> tokenizer;  // --openai only
  Tokenize tokenize;
  Detokenize detokenize;
};

// An OpenAI-compatible server; prompts cut by --model's tokenizer.
absl::StatusOr<Connected> ConnectOpenAi(const BenchFlags& f) {
  Connected c;
  std::string model_used;
  PDQ_ASSIGN_OR_RETURN(c.target,
                       OpenAiBenchTarget(f.openai_url, f.openai_model, f.connection.api_key,
                                         f.connection.tls.ca, &model_used, f.temperature));
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(f.model);
  if (!file.ok()) return WithFlagNames(file.status(), {{"path", "--model"}});
  PDQ_ASSIGN_OR_RETURN(c.tokenizer, Tokenizer::FromGguf(**file));
  const Tokenizer* tokenizer = c.tokenizer.get();
  c.tokenize = [tokenizer](const std::string& t) {
    return tokenizer->Encode(t, /*add_bos=*/false, /*parse_special=*/false);
  };
  c.detokenize = [tokenizer](const std::vector<int32_t>& ids) { return tokenizer->Decode(ids); };
  std::fprintf(stderr, "pdq bench: %s at %s; %s\n", model_used.c_str(), f.openai_url.c_str(),
               f.Shape().c_str());
  return c;
}

// A pdq router: its model must fit the longest request; prompts cut by the
// router's tokenizer.
absl::StatusOr<Connected> ConnectRouter(const BenchFlags& f) {
  Connected c;
  PDQ_ASSIGN_OR_RETURN(const server::Dialing dialing, f.connection.Dialing());
  c.stub = v1::Pdq::NewStub(server::Dial(f.router, dialing));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  if (const grpc::Status s = c.stub->GetModelInfo(&ctx, {}, &info); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("router ", f.router, ": ", s.error_message()));
  }
  if (f.Longest() > info.max_context()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.conversation() ? "the last turn's prompt and answer (first + (turns - 1) x "
                                        "(turn + output) + output tokens = "
                                      : "input + output tokens (",
                     f.Longest(), ") must fit the context of ", info.max_context()));
  }
  std::fprintf(stderr, "pdq bench: %s at %s, %d live workers; %s\n", info.name().c_str(),
               f.router.c_str(), info.live_workers(), f.Shape().c_str());
  v1::Pdq::Stub* stub = c.stub.get();
  c.tokenize = [stub](const std::string& t) -> absl::StatusOr<std::vector<int32_t>> {
    grpc::ClientContext tc;
    tc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::TokenizeRequest req;
    req.set_text(t);
    v1::TokenizeResponse resp;
    if (const grpc::Status st = stub->Tokenize(&tc, req, &resp); !st.ok()) {
      return absl::UnavailableError(absl::StrCat("Tokenize failed: ", st.error_message()));
    }
    return std::vector<int32_t>(resp.ids().begin(), resp.ids().end());
  };
  c.detokenize = [](const std::vector<int32_t>&) -> absl::StatusOr<std::string> {
    return std::string();  // pdq takes the ids
  };
  c.target = PdqBenchTarget(*stub, f.temperature);
  return c;
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  BenchFlags f;
  FlagParser flags("bench",
                   "Load-tests a pdq router with streaming requests of real text at fixed "
                   "input and output lengths, at concurrency levels or a Poisson arrival rate, "
                   "and prints TTFT, TPOT, throughput and goodput; --pattern alternate checks "
                   "that the deployment recovers fully between bursts; --workload conversation "
                   "runs multi-turn chats that resend the whole conversation every turn.");
  f.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  std::vector<int> levels;
  if (absl::Status s = f.Resolve(flags, &levels); !s.ok()) return Fail("bench", s);
  absl::StatusOr<std::string> text = ReadTextFile(f.text, "--text");
  if (!text.ok()) return Fail("bench", text.status());
  absl::StatusOr<Connected> c = f.openai_url.empty() ? ConnectRouter(f) : ConnectOpenAi(f);
  if (!c.ok()) return Fail("bench", c.status());

  BenchResult out;
  out.router = f.openai_url.empty() ? f.router : f.openai_url;
  out.target = f.openai_url.empty() ? "pdq" : "openai";
  out.workload = f.workload;
  out.output_tokens = f.output_tokens;
  out.prompt_seed = f.prompt_seed;
  out.temperature = f.temperature;
  bool all_ok = true;
  const auto utc_now = [] {
    return absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  };
  out.started_at = utc_now();
  if (f.conversation()) {
    out.sessions = (int)f.sessions;
    out.turns = (int)f.turns;
    out.first_tokens = f.first_tokens;
    out.turn_tokens = f.turn_tokens;
    const ConversationOptions o{(int)f.sessions, (int)f.turns, f.first_tokens, f.turn_tokens,
                                f.output_tokens, f.timeout_s,  f.warmup > 0,   f.prompt_seed};
    absl::StatusOr<bool> ok =
        RunConversationBench(*c->target, c->tokenize, c->stub.get(), *text, o, &out);
    if (!ok.ok()) return Fail("bench", ok.status());
    all_ok = *ok;
  } else {
    out.input_tokens = f.input_tokens;
    out.shared_prefix_tokens = f.shared_prefix_tokens;
    out.rate = f.rate;
    out.ttft_target_ms = f.ttft_target_ms;
    out.tpot_target_ms = f.tpot_target_ms;
    const LatencyTargets targets{f.ttft_target_ms / 1e3, f.tpot_target_ms / 1e3};
    SweepOptions sweep{levels, f.rate, f.requests, f.per_client, f.warmup, targets};
    sweep.until_flat = (int)f.until_flat;
    sweep.arrival_seed = (uint64_t)f.arrival_seed;
    if (f.rate > 0) out.arrival_seed = f.arrival_seed;
    // A text of its own for every request of a sweep (the driver cycles
    // through them): a repeated one would be answered from the server's
    // prefix cache. The alternating pattern repeats its 64 on purpose:
    // each cycle should find the deployment as the first did.
    const int64_t texts =
        f.pattern == "alternate" ? 64 : std::clamp<int64_t>(SweepRequests(sweep), 64, 4096);
    absl::StatusOr<std::vector<BenchPrompt>> prompts =
        MakePrompts(c->tokenize, c->detokenize, *text, f.input_tokens, (int)texts,
                    f.shared_prefix_tokens, f.prompt_seed);
    if (!prompts.ok()) return Fail("bench", prompts.status());
    Driver driver(*c->target, std::move(*prompts), f.output_tokens, f.timeout_s);
    driver.set_client_ids(f.client_ids);
    out.client_ids = f.client_ids;
    PrintLevelHeader();
    if (f.pattern == "alternate") {
      const AlternateOptions o{(int)f.cycles, (int)f.high, (int)f.low, f.max_rss_growth_mib,
                               f.timeout_s};
      const std::string why = Alternate(*c->stub, driver, o, targets, &out);
      out.pattern = PatternResult{"alternate", why.empty(), why};
      std::printf("%s%s\n", why.empty() ? "PASS" : "FAIL: ", why.c_str());
      all_ok = why.empty();
    } else {
      all_ok = RunSweep(driver, c->stub.get(), sweep, &out);
    }
  }
  out.finished_at = utc_now();
  if (!f.json.empty()) {
    if (absl::Status s = WriteBenchResult(f.json, out); !s.ok()) return Fail("bench", s);
  }
  return all_ok ? 0 : 1;
}

}  // namespace pdq
