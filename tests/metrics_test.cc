// The Prometheus exposition every pdq process serves: counters, labelled
// series, gauge functions and cumulative histograms in the text format, and
// the HTTP endpoint answering /metrics and /healthz.
#include "server/metrics.h"

#include <httplib.h>

#include "gtest/gtest.h"

namespace pdq::server {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, RendersCountersGaugesAndLabelsInTheTextFormat) {
  Metrics& m = Metrics::Global();
  m.GetCounter("test_events_total", "Events.").Add(3);
  m.GetCounter("test_events_total", "Events.").Add(0.5);  // the same series
  m.GetCounter("test_calls_total", "Calls.", {{"code", "OK"}}).Add();
  m.GetCounter("test_calls_total", "Calls.", {{"code", "UNAVAILABLE"}}).Add(2);
  m.GetGauge("test_depth", "Depth.").Set(7);
  m.GetCounter("test_odd_total", "Odd labels.", {{"path", "a\"b\\c\nd"}}).Add();
  int reads = 0;
  m.SetGaugeFunction("test_live", "Read when scraped.", [&reads] { return ++reads * 10.0; });
  const std::string text = m.Render();
  EXPECT_TRUE(Has(text, "# HELP test_events_total Events.")) << text;
  EXPECT_TRUE(Has(text, "# TYPE test_events_total counter"));
  EXPECT_TRUE(Has(text, "test_events_total 3.5"));
  EXPECT_TRUE(Has(text, "test_calls_total{code=\"OK\"} 1"));
  EXPECT_TRUE(Has(text, "test_calls_total{code=\"UNAVAILABLE\"} 2"));
  EXPECT_TRUE(Has(text, "# TYPE test_depth gauge"));
  EXPECT_TRUE(Has(text, "test_depth 7"));
  EXPECT_TRUE(Has(text, "test_odd_total{path=\"a\\\"b\\\\c\\nd\"} 1"));
  EXPECT_TRUE(Has(text, "test_live 10"));
  EXPECT_TRUE(Has(m.Render(), "test_live 20"));
  m.ClearGaugeFunctions("test_live");
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(m.Render().find("\ntest_live "), std::string::npos);  // no stale value
  EXPECT_NE(text.find("process_resident_memory_bytes "), std::string::npos);
  EXPECT_NE(text.find("process_cpu_seconds_total "), std::string::npos);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithSumAndCount) {
  Histogram& h = Metrics::Global().GetHistogram("test_latency_seconds", "Latency.", {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.Observe(v);
  const std::string text = Metrics::Global().Render();
  EXPECT_TRUE(Has(text, "# TYPE test_latency_seconds histogram"));
  EXPECT_TRUE(Has(text, "test_latency_seconds_bucket{le=\"0.1\"} 2")) << text;  // le is inclusive
  EXPECT_TRUE(Has(text, "test_latency_seconds_bucket{le=\"1\"} 3"));
  EXPECT_TRUE(Has(text, "test_latency_seconds_bucket{le=\"10\"} 4"));
  EXPECT_TRUE(Has(text, "test_latency_seconds_bucket{le=\"+Inf\"} 5"));
  EXPECT_TRUE(Has(text, "test_latency_seconds_sum 22.65"));
  EXPECT_TRUE(Has(text, "test_latency_seconds_count 5"));
}

TEST(MetricsTest, CountRequestLabelsByGrpcCodeName) {
  CountRequest(absl::StatusCode::kInvalidArgument);
  CountRequest(absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(Metrics::Global().Render(), "pdq_requests_total{code=\"INVALID_ARGUMENT\"} 2"));
}

TEST(MetricsTest, ServesMetricsAndHealthOverHttp) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = ServeMetrics("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  Metrics::Global().GetCounter("test_http_total", "Scraped over HTTP.").Add(42);
  const std::string address = (*server)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  httplib::Result r = client.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(Has(r->body, "test_http_total 42"));
  r = client.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "ok\n");
  r = client.Get("/nothing-here");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);

  // And read back by the scraper pdq bench uses.
  absl::StatusOr<std::map<std::string, double>> samples = ScrapeMetrics(address);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ((*samples)["test_http_total"], 42);
  EXPECT_GT((*samples)["process_resident_memory_bytes"], 0);
  server->reset();
  EXPECT_EQ(ScrapeMetrics(address, 2).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ScrapeMetrics("no-port").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MetricsTest, BadOrTakenAddressesAreClearErrors) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> bad = ServeMetrics("no-port");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not host:port"), std::string::npos);
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = ServeMetrics("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::unique_ptr<MetricsServer>> second = ServeMetrics((*first)->address());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos);
}

}  // namespace
}  // namespace pdq::server
