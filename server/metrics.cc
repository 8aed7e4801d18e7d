#include "server/metrics.h"

#include <httplib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "server/http_server.h"

namespace pdq::server {
namespace {

std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[32];  // the shortest text that reads back as the same double
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// {a="x",b="y"} with the text format's escapes; "" for no labels.
std::string RenderLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ',';
    absl::StrAppend(&out, labels[i].first, "=\"");
    for (char c : labels[i].second) {
      if (c == '\\' || c == '"') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    out += '"';
  }
  return out + "}";
}

// The label set with one more label appended (a histogram's "le").
std::string WithLabel(const std::string& rendered, const std::string& name,
                      const std::string& value) {
  const std::string extra = absl::StrCat(name, "=\"", value, "\"");
  if (rendered.empty()) return absl::StrCat("{", extra, "}");
  return absl::StrCat(rendered.substr(0, rendered.size() - 1), ",", extra, "}");
}

void AppendProcessMetrics(std::string* out) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu =
      ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  const ProcessMemory mem = ReadProcessMemory();
  absl::StrAppend(out,
                  "# HELP process_cpu_seconds_total User and system CPU time spent, seconds.\n"
                  "# TYPE process_cpu_seconds_total counter\n"
                  "process_cpu_seconds_total ",
                  FormatValue(cpu),
                  "\n# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                  "# TYPE process_resident_memory_bytes gauge\n"
                  "process_resident_memory_bytes ",
                  FormatValue(double(mem.resident)),
                  "\n# HELP process_peak_resident_memory_bytes Largest resident memory size "
                  "since the process started, bytes.\n"
                  "# TYPE process_peak_resident_memory_bytes gauge\n"
                  "process_peak_resident_memory_bytes ",
                  FormatValue(double(mem.peak)), "\n");
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  m.resident = int64_t(resident) * sysconf(_SC_PAGESIZE);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  m.peak = int64_t(ru.ru_maxrss) * 1024;
  return m;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  PDQ_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
}

void CountRequest(absl::StatusCode code, const std::string& pool) {
  Labels labels = {{"code", absl::StatusCodeToString(code)}};
  if (!pool.empty()) labels.push_back({"pool", pool});
  Metrics::Global()
      .GetCounter("pdq_requests_total", "Calls answered, by status code.", labels)
      .Add();
}

void ObserveLatencies(double ttft_seconds, double mean_tpot_seconds, int64_t output_tokens,
                      const std::string& pool) {
  static constexpr char kTtft[] = "pdq_ttft_seconds",
                        kTtftHelp[] =
                            "Time to first token: from a call's arrival to its first token.",
                        kTpot[] = "pdq_tpot_seconds",
                        kTpotHelp[] =
                            "Time per output token after the first, one mean per request.";
  Metrics& m = Metrics::Global();
  // The unlabelled series (no A/B split) are found once; a pool's on use.
  static Histogram& ttft_all = m.GetHistogram(kTtft, kTtftHelp, LatencyBuckets());
  static Histogram& tpot_all = m.GetHistogram(kTpot, kTpotHelp, LatencyBuckets());
  const Labels labels = {{"pool", pool}};
  if (output_tokens > 0) {
    (pool.empty() ? ttft_all : m.GetHistogram(kTtft, kTtftHelp, LatencyBuckets(), labels))
        .Observe(ttft_seconds);
  }
  if (output_tokens > 1) {
    (pool.empty() ? tpot_all : m.GetHistogram(kTpot, kTpotHelp, LatencyBuckets(), labels))
        .Observe(mean_tpot_seconds);
  }
}

Metrics& Metrics::Global() {
  static Metrics* metrics = new Metrics;  // never destroyed: used until exit
  return *metrics;
}

Metrics::Series& Metrics::Get(const std::string& name, const std::string& help, Type type,
                              const Labels& labels) {
  auto [it, inserted] = families_.try_emplace(name, Family{type, help, {}});
  PDQ_CHECK(it->second.type == type);
  return it->second.series[RenderLabels(labels)];
}

Counter& Metrics::GetCounter(const std::string& name, const std::string& help,
                             const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = Get(name, help, Type::kCounter, labels);
  if (!s.counter) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& Metrics::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = Get(name, help, Type::kGauge, labels);
  if (!s.gauge) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& Metrics::GetHistogram(const std::string& name, const std::string& help,
                                 std::vector<double> upper_bounds, const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = Get(name, help, Type::kHistogram, labels);
  if (!s.histogram) s.histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  return *s.histogram;
}

void Metrics::SetGaugeFunction(const std::string& name, const std::string& help,
                               std::function<double()> read, const Labels& labels) {
  std::lock_guard lock(mu_);
  Get(name, help, Type::kGauge, labels).read = std::move(read);
}

void Metrics::ClearGaugeFunctions(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  for (auto& [labels, s] : it->second.series) s.read = nullptr;
}

std::string Metrics::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, s] : f.series) {
      if (s.counter)
        absl::StrAppend(&out, name, labels, " ", FormatValue(s.counter->value()), "\n");
      if (s.read) {
        absl::StrAppend(&out, name, labels, " ", FormatValue(s.read()), "\n");
      } else if (s.gauge) {
        absl::StrAppend(&out, name, labels, " ", FormatValue(s.gauge->value()), "\n");
      }
      if (s.histogram) {
        const std::vector<uint64_t> counts = s.histogram->counts();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le =
              i < s.histogram->bounds().size() ? FormatValue(s.histogram->bounds()[i]) : "+Inf";
          absl::StrAppend(&out, name, "_bucket", WithLabel(labels, "le", le), " ", cumulative,
                          "\n");
        }
        absl::StrAppend(&out, name, "_sum", labels, " ", FormatValue(s.histogram->sum()), "\n",
                        name, "_count", labels, " ", cumulative, "\n");
      }
    }
  }
  AppendProcessMetrics(&out);
  return out;
}

namespace {

class HttpMetricsServer : public MetricsServer {
 public:
  std::string address() const override { return server_.address(); }

  absl::Status Start(const std::string& listen) {
    server_.http().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(Metrics::Global().Render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.http().Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    // Scrapes are rare and small: two threads are plenty.
    return server_.Start(listen, 2, "/metrics");
  }

 private:
  HttpServer server_;
};

}  // namespace

absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(const std::string& address,
                                                            int timeout_seconds) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  httplib::Client client(address.substr(0, colon), port);
  client.set_connection_timeout(timeout_seconds);
  client.set_read_timeout(timeout_seconds);
  httplib::Result r = client.Get("/metrics");
  if (!r || r->status != 200) {
    return absl::UnavailableError(absl::StrCat(
        "GET http://", address, "/metrics: ",
        r ? absl::StrCat("status ", r->status) : httplib::to_string(r.error())));
  }
  std::map<std::string, double> samples;
  size_t start = 0;
  while (start < r->body.size()) {
    size_t end = r->body.find('\n', start);
    if (end == std::string::npos) end = r->body.size();
    const std::string_view line(r->body.data() + start, end - start);
    start = end + 1;
    const size_t space = line.rfind(' ');
    if (line.empty() || line[0] == '#' || space == std::string_view::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(std::string(line.substr(space + 1)), &v)) {
      samples[std::string(line.substr(0, space))] = v;
    }
  }
  return samples;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& listen) {
  auto server = std::make_unique<HttpMetricsServer>();
  if (absl::Status s = server->Start(listen); !s.ok()) return s;
  return server;
}

}  // namespace pdq::server
