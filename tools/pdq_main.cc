// `pdq`: the command line for running, scoring and benchmarking models.
#include <cstdio>
#include <cstring>

#include "tools/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: pdq <command> [flags]\n"
    "\n"
    "commands:\n"
    "  generate      generate text from a prompt\n"
    "  perplexity    perplexity of a text file (llama-perplexity's method)\n"
    "  bench-engine  prefill and decode tokens/s against the machine's rooflines\n"
    "  drift         how greedy generation drifts under a prefill/decode precision pair\n"
    "  code-eval     HumanEval: solution perplexity and sandboxed pass@1 under a precision pair\n"
    "  quantize      write quantized weights (w8a8, w4a16) for workers to load\n"
    "  up            start a router and its workers from a config (deploy/local/)\n"
    "  client        stream an answer from a router\n"
    "  bench         load-test a router: TTFT, TPOT, throughput, goodput\n"
    "  status        a router's workers: role, precision, health, queue, KV blocks\n"
    "  migrate       move a decode worker's streams, with their KV, to other decode workers\n"
    "  plan          worker counts and autoscaler targets for a rate, from pdq bench\n"
    "  profile       measure the step times, KV link and router cost that pdq sim runs on\n"
    "  sim           simulate a deployment serving a workload, from a profile\n"
    "  eval          the whole evaluation of deployments (speed, stability, accuracy) and its "
    "report\n"
    "\n"
    "Run `pdq <command> --help` for its flags. The default model is\n"
    "models/SmolLM2-135M-Instruct.Q4_1.gguf (override with --model or PDQ_MODEL).\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return pdq::GenerateCommand(argc, argv);
  if (command == "perplexity") return pdq::PerplexityCommand(argc, argv);
  if (command == "bench-engine") return pdq::BenchEngineCommand(argc, argv);
  if (command == "drift") return pdq::DriftCommand(argc, argv);
  if (command == "code-eval") return pdq::CodeEvalCommand(argc, argv);
  if (command == "quantize") return pdq::QuantizeCommand(argc, argv);
  if (command == "client") return pdq::ClientCommand(argc, argv);
  if (command == "up") return pdq::UpCommand(argc, argv);
  if (command == "bench") return pdq::BenchCommand(argc, argv);
  if (command == "status") return pdq::StatusCommand(argc, argv);
  if (command == "migrate") return pdq::MigrateCommand(argc, argv);
  if (command == "plan") return pdq::PlanCommand(argc, argv);
  if (command == "profile") return pdq::ProfileCommand(argc, argv);
  if (command == "sim") return pdq::SimCommand(argc, argv);
  if (command == "eval") return pdq::EvalCommand(argc, argv);
  std::fprintf(stderr, "pdq: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
