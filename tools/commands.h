// The `pdq` subcommands. Each returns the process exit code and prints its
// own errors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "flags/flags.h"
#include "quant/model_flags.h"
#include "server/security.h"

namespace pdq {

int GenerateCommand(int argc, char** argv);
int PerplexityCommand(int argc, char** argv);
int BenchEngineCommand(int argc, char** argv);
int DriftCommand(int argc, char** argv);
int CodeEvalCommand(int argc, char** argv);
int QuantizeCommand(int argc, char** argv);
int ClientCommand(int argc, char** argv);
int UpCommand(int argc, char** argv);
int BenchCommand(int argc, char** argv);
int StatusCommand(int argc, char** argv);
int MigrateCommand(int argc, char** argv);
int PlanCommand(int argc, char** argv);
int ProfileCommand(int argc, char** argv);
int SimCommand(int argc, char** argv);
int EvalCommand(int argc, char** argv);
int BlindAbCommand(int argc, char** argv);  // pdq eval blind-ab
int TallyCommand(int argc, char** argv);    // pdq eval tally

// How a command reaches a router: --tls-ca (TLS, checking the router's
// certificate against it), --tls-cert and --tls-key (this client's own,
// where the server asks for one), --tls-server-name, and --api-key (default
// $PDQ_API_KEY).
struct ConnectionFlags {
  server::TlsFiles tls;
  std::string server_name, api_key;
  void Register(FlagParser& flags);
  // Errors name the flag and the file.
  absl::StatusOr<server::Dialing> Dialing() const;
};
// Prints "pdq <command>: <status message>" to stderr and returns 1.
int Fail(const std::string& command, const absl::Status& status);
// Deterministic pseudo-random token ids spread over the vocabulary (xorshift
// from a fixed state; `salt` varies it), for timing runs.
std::vector<int32_t> BenchTokens(int64_t n, int vocab, uint64_t salt);
// Parses flags; returns -1 to continue, else an exit code (help or error).
int ParseOrExit(FlagParser& flags, int argc, char** argv);

}  // namespace pdq
