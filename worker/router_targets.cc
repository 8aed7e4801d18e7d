#include "worker/router_targets.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdq::worker {
namespace {

// host:port or [v6]:port into its parts; false when it is neither.
bool SplitHostPort(absl::string_view s, std::string* host, std::string* port) {
  size_t colon;
  if (absl::StartsWith(s, "[")) {
    const size_t close = s.find(']');
    if (close == absl::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return false;
    }
    *host = std::string(s.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = s.rfind(':');
    if (colon == absl::string_view::npos) return false;
    *host = std::string(s.substr(0, colon));
    if (host->find(':') != std::string::npos) return false;  // v6 wants brackets
  }
  *port = std::string(s.substr(colon + 1));
  int p;
  return !host->empty() && absl::SimpleAtoi(*port, &p) && p > 0 && p < 65536;
}

std::string JoinHostPort(const std::string& host, const std::string& port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<std::vector<RouterEntry>> ParseRouterList(const std::string& list) {
  std::vector<RouterEntry> entries;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    RouterEntry e;
    absl::string_view rest = part;
    if (absl::ConsumePrefix(&rest, "dns:///")) e.dns = true;
    if (!SplitHostPort(rest, &e.host, &e.port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("router '", part, "': want host:port, [v6]:port or dns:///NAME:PORT"));
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return absl::InvalidArgumentError("no router given");
  return entries;
}

absl::StatusOr<std::vector<std::string>> SystemResolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot look up ", host, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0 &&
        std::find(out.begin(), out.end(), buf) == out.end()) {
      out.push_back(buf);
    }
  }
  freeaddrinfo(res);
  return out;
}

std::vector<RouterTarget> ResolveRouterTargets(const std::vector<RouterEntry>& entries,
                                               const Resolver& resolve,
                                               const std::vector<RouterTarget>& previous,
                                               std::vector<std::string>* errors) {
  std::vector<RouterTarget> out;
  auto add = [&](RouterTarget t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(std::move(t));
  };
  for (const RouterEntry& e : entries) {
    if (!e.dns) {
      add({JoinHostPort(e.host, e.port), e.host});
      continue;
    }
    absl::StatusOr<std::vector<std::string>> addrs = resolve(e.host);
    if (addrs.ok()) {
      for (const std::string& a : *addrs) add({JoinHostPort(a, e.port), e.host});
      continue;
    }
    errors->push_back(std::string(addrs.status().message()));
    // Keep what this entry had: previous targets named after it.
    for (const RouterTarget& t : previous) {
      if (t.tls_name == e.host && absl::EndsWith(t.address, absl::StrCat(":", e.port))) add(t);
    }
  }
  return out;
}

}  // namespace pdq::worker
