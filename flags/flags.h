// A small command-line flag parser for the pdq subcommands: --name value or
// --name=value, typed targets with range checks, and generated --help text.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pdq {

class FlagParser {
 public:
  // `command` is a pdq subcommand ("bench": shown as "pdq bench"), or with
  // `program` true an executable of its own ("pdq-router").
  FlagParser(std::string command, std::string summary, bool program = false)
      : command_(program ? command : "pdq " + command), summary_(std::move(summary)) {}

  void String(const std::string& name, std::string* out, const std::string& help);
  void Int(const std::string& name, int64_t* out, int64_t min, int64_t max,
           const std::string& help);
  void Float(const std::string& name, double* out, double min, double max, const std::string& help);
  void Bool(const std::string& name, bool* out, const std::string& help);

  // Parses argv[first..argc). InvalidArgument names the offending flag.
  absl::Status Parse(int argc, char** argv, int first);
  bool help_requested() const { return help_; }
  // True when the flag was given on the command line.
  bool Given(const std::string& name) const;
  // The flags whose values differ now from those they held when registered
  // (their defaults), as "--name=value" arguments, in registration order:
  // a command line that gives another parser of the same flags these values.
  std::vector<std::string> Changed() const;
  std::string Help() const;

 private:
  enum class Kind { kString, kInt, kFloat, kBool };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    double min, max;
    std::string help;
    std::string default_text;
    bool given = false;
  };
  absl::Status Set(Flag& flag, const std::string& value);
  // The target's value as text (--help's default, Changed's value).
  static std::string ValueText(Kind kind, const void* target);

  std::string command_, summary_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

// What every server process (router, worker) takes for TLS and its
// plaintext health port: --tls-cert, --tls-key and --tls-ca (its identity
// and the CA its peers are checked against), --health-listen and
// --health-address-file.
struct ServerSecurityFlags {
  std::string tls_cert, tls_key, tls_ca, health_listen, health_address_file;
  void Register(FlagParser& flags);
};

// Parses argv[first..argc) for `program` (as errors name it): -1 to go on,
// 0 after printing --help, 2 after printing the error.
int ParseOrExit(FlagParser& flags, int argc, char** argv, int first, const std::string& program);

// A flag's comma-separated list of numbers ("1,2,4"; spaces around entries
// are allowed), each from `min` to `max`: whole numbers for IntList; for
// FloatList, with `open` the bounds themselves excluded. InvalidArgument
// naming the flag and the entry for a bad number, an empty entry ("1,,2",
// "4,") or an empty list.
absl::StatusOr<std::vector<int64_t>> IntList(const std::string& flag, const std::string& text,
                                             int64_t min, int64_t max);
absl::StatusOr<std::vector<double>> FloatList(const std::string& flag, const std::string& text,
                                              double min, double max, bool open = false);

// The whole file; NotFound naming `what` and the path when it cannot be read.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);
// The status with the library's parameter names (whole words) replaced by
// the flags that set them: {{"ctx", "--ctx"}} turns "ctx must be ..." into
// "--ctx must be ...".
absl::Status WithFlagNames(const absl::Status& status,
                           std::initializer_list<std::pair<const char*, const char*>> names);

}  // namespace pdq
