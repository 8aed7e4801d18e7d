// Prometheus metrics for every pdq process: counters, gauges and histograms
// in one process-wide registry, rendered in the Prometheus text format
// (version 0.0.4) and served over HTTP at /metrics (ServeMetrics).
//
// Metrics are created once and then updated lock-free:
//   static Counter& sent = Metrics::Global().GetCounter(
//       "pdq_kv_bytes_sent_total", "KV bytes sent to decode workers");
//   sent.Add(bytes);
// A label set names one series of a family ({{"code", "OK"}}); looking one
// up takes a lock, so hot paths keep the reference.
//
// Every family is pdq_* except process_*, which follow the names of
// Prometheus' own client libraries so dashboards find them.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq::server {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, the last for +Inf; sum; count.
  std::vector<uint64_t> counts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Bucket bounds for latencies in seconds: 1 ms to 60 s, about 2.5x apart.
std::vector<double> LatencyBuckets();

class Metrics {
 public:
  // The registry /metrics serves.
  static Metrics& Global();

  // The series `labels` of family `name`, created on first use. Asking for
  // an existing name with another type is a programming error (checked).
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> upper_bounds, const Labels& labels = {});
  // A gauge read when scraped (queue depths, free blocks). Replaces an
  // earlier function of the same series.
  void SetGaugeFunction(const std::string& name, const std::string& help,
                        std::function<double()> read, const Labels& labels = {});
  // Removes a family's gauge functions (their captures are going away).
  void ClearGaugeFunctions(const std::string& name);

  // The Prometheus text exposition of every family, plus process_* figures.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, Series> series;  // by rendered label set
  };
  Series& Get(const std::string& name, const std::string& help, Type type, const Labels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // guarded by mu_
};

// The figures every serving process keeps the same way.
// This process's resident memory now and its peak since start, bytes.
struct ProcessMemory {
  int64_t resident = 0, peak = 0;
};
ProcessMemory ReadProcessMemory();

// pdq_requests_total{code}: calls answered, by status code name ("OK",
// "INVALID_ARGUMENT", ...; gRPC's names). `pool`, when not empty, adds a
// pool label (A/B splits: policy/traffic_split.h).
void CountRequest(absl::StatusCode code, const std::string& pool = "");
// pdq_ttft_seconds and pdq_tpot_seconds (one mean per request), as this
// process saw them; `pool` as for CountRequest.
void ObserveLatencies(double ttft_seconds, double mean_tpot_seconds, int64_t output_tokens,
                      const std::string& pool = "");

// An HTTP server answering GET /metrics (Metrics::Global().Render()) and
// GET /healthz ("ok"), on its own threads. Destroying it stops it.
class MetricsServer {
 public:
  virtual ~MetricsServer() = default;
  virtual std::string address() const = 0;  // host:port, the port resolved
};
// Listens on `listen` ("host:port", port 0: a free one). Unavailable when
// it cannot.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& listen);

// Fetches http://address/metrics and returns every sample by its series
// as written ("pdq_requests_total{code=\"OK\"}"). Unavailable when the
// process does not answer within `timeout_seconds`.
absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(const std::string& address,
                                                            int timeout_seconds = 10);

}  // namespace pdq::server
