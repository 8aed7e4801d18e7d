// Flag parsing with errors a user can act on.
#include "flags/flags.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace pdq {

std::string FlagParser::ValueText(Kind kind, const void* target) {
  switch (kind) {
    case Kind::kString:
      return *static_cast<const std::string*>(target);
    case Kind::kInt:
      return absl::StrCat(*static_cast<const int64_t*>(target));
    case Kind::kFloat:
      return absl::StrCat(*static_cast<const double*>(target));
    case Kind::kBool:
      return *static_cast<const bool*>(target) ? "true" : "false";
  }
  return "";
}

void FlagParser::String(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, Kind::kString, out, 0, 0, help, ValueText(Kind::kString, out)});
}
void FlagParser::Int(const std::string& name, int64_t* out, int64_t min, int64_t max,
                     const std::string& help) {
  flags_.push_back(
      {name, Kind::kInt, out, (double)min, (double)max, help, ValueText(Kind::kInt, out)});
}
void FlagParser::Float(const std::string& name, double* out, double min, double max,
                       const std::string& help) {
  flags_.push_back({name, Kind::kFloat, out, min, max, help, ValueText(Kind::kFloat, out)});
}
void FlagParser::Bool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, Kind::kBool, out, 0, 0, help, ValueText(Kind::kBool, out)});
}

std::vector<std::string> FlagParser::Changed() const {
  std::vector<std::string> args;
  for (const Flag& f : flags_) {
    const std::string now = ValueText(f.kind, f.target);
    if (now != f.default_text) args.push_back(absl::StrCat("--", f.name, "=", now));
  }
  return args;
}

bool FlagParser::Given(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.given;
  }
  return false;
}

absl::Status FlagParser::Set(Flag& flag, const std::string& value) {
  flag.given = true;
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.target) = value;
      return absl::OkStatus();
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.target) = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes true or false, got '", value, "'"));
      }
      return absl::OkStatus();
    case Kind::kInt: {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes an integer, got '", value, "'"));
      }
      if ((double)v < flag.min || (double)v > flag.max) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag.name, " must be in [",
                                                       (int64_t)flag.min, ", ", (int64_t)flag.max,
                                                       "], got ", v));
      }
      *static_cast<int64_t*>(flag.target) = v;
      return absl::OkStatus();
    }
    case Kind::kFloat: {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v == v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes a number, got '", value, "'"));
      }
      if (v < flag.min || v > flag.max) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " must be in [", flag.min, ", ", flag.max, "], got ", v));
      }
      *static_cast<double*>(flag.target) = v;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status FlagParser::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (see ", command_, " --help)"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = nullptr;
    for (Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", command_, " --help)"));
    }
    if (!has_value) {
      if (flag->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Set(*flag, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagParser::Help() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string left = absl::StrCat("  --", f.name, f.kind == Kind::kBool ? "" : " VALUE");
    absl::StrAppendFormat(&out, "%-26s %s", left, f.help);
    if (!f.default_text.empty() && f.kind != Kind::kBool) {
      absl::StrAppend(&out, " (default: ", f.default_text, ")");
    }
    out += "\n";
  }
  absl::StrAppend(&out, "  --help                     show this help\n");
  return out;
}

int ParseOrExit(FlagParser& flags, int argc, char** argv, int first, const std::string& program) {
  const absl::Status s = flags.Parse(argc, argv, first);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  return -1;
}

void ServerSecurityFlags::Register(FlagParser& flags) {
  flags.String("tls-cert", &tls_cert,
               "PEM certificate chain: this process's identity for mutual TLS (with --tls-key and "
               "--tls-ca; none of the three: plaintext)");
  flags.String("tls-key", &tls_key, "PEM private key of --tls-cert");
  flags.String("tls-ca", &tls_ca, "PEM CA bundle the peers' certificates are checked against");
  flags.String("health-listen", &health_listen,
               "also serve grpc.health.v1 alone, in plaintext, on this host:port (for probes that "
               "cannot speak TLS); empty: none");
  flags.String("health-address-file", &health_address_file,
               "write the health port's address here once serving");
}

namespace {

// Each entry of a comma-separated list, trimmed, to `parse` (false: not a
// number in range, described by `range`).
template <typename T, typename Parse>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text,
                                         const std::string& range, Parse parse) {
  std::vector<T> out;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty: give ", range));
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": an empty entry in '", text, "'"));
    }
    T v{};
    if (!parse(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not ", range));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> IntList(const std::string& flag, const std::string& text,
                                             int64_t min, int64_t max) {
  return ParseList<int64_t>(flag, text, absl::StrCat("a whole number from ", min, " to ", max),
                            [&](absl::string_view part, int64_t* v) {
                              return absl::SimpleAtoi(part, v) && *v >= min && *v <= max;
                            });
}

absl::StatusOr<std::vector<double>> FloatList(const std::string& flag, const std::string& text,
                                              double min, double max, bool open) {
  const std::string range = open ? absl::StrCat("a number in (", min, ", ", max, ")")
                                 : absl::StrCat("a number from ", min, " to ", max);
  return ParseList<double>(flag, text, range, [&](absl::string_view part, double* v) {
    if (!absl::SimpleAtod(part, v) || !std::isfinite(*v)) return false;
    return open ? *v > min && *v < max : *v >= min && *v <= max;
  });
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WithFlagNames(const absl::Status& status,
                           std::initializer_list<std::pair<const char*, const char*>> names) {
  std::string message(status.message());
  auto is_word = [](char c) { return std::isalnum((unsigned char)c) || c == '_'; };
  for (const auto& [param, flag] : names) {
    const std::string p = param;
    for (size_t at = message.find(p); at != std::string::npos; at = message.find(p, at)) {
      const bool starts = at == 0 || !is_word(message[at - 1]);
      const bool ends = at + p.size() == message.size() || !is_word(message[at + p.size()]);
      if (starts && ends) {
        message.replace(at, p.size(), flag);
        at += std::string(flag).size();
      } else {
        at += p.size();
      }
    }
  }
  return absl::Status(status.code(), message);
}

}  // namespace pdq
