#include "serving_cluster.h"

#include "server/metrics.h"

namespace pdq::testing {

double Metric(const std::string& metrics_address, const std::string& series) {
  absl::StatusOr<std::map<std::string, double>> samples = server::ScrapeMetrics(metrics_address);
  if (!samples.ok()) return -1;
  auto it = samples->find(series);
  return it == samples->end() ? -1 : it->second;
}

double MetricSoon(const std::string& metrics_address, const std::string& series, double want) {
  const auto end = Clock::now() + std::chrono::seconds(20);
  double v = Metric(metrics_address, series);
  while (v != want && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    v = Metric(metrics_address, series);
  }
  return v;
}

void ExpectOneRouterLostLeavesTheOther(Cluster& c, const Proc& a, const Proc& b,
                                       const Proc& prefill, const Proc& decode) {
  auto stub_a = Client(a.address), stub_b = Client(b.address);
  ASSERT_TRUE(WaitForWorkers(*stub_a, 2));
  ASSERT_TRUE(WaitForWorkers(*stub_b, 2));
  const Answer before = Generate(*stub_b, Chat(kPrompts[0], 16));
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  EXPECT_EQ(Generate(*stub_a, Chat(kPrompts[0], 16)).tokens, before.tokens);

  // A long stream through each router; A dies once both are decoding.
  v1::GenerateRequest long_request;
  long_request.set_text(LongText(20));
  long_request.set_max_tokens(300);
  long_request.set_ignore_eos(true);
  grpc::ClientContext ctx_a, ctx_b;
  ctx_a.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  ctx_b.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader_a = stub_a->Generate(&ctx_a, long_request);
  auto reader_b = stub_b->Generate(&ctx_b, long_request);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader_a->Read(&m));
  ASSERT_TRUE(reader_b->Read(&m));
  int tokens_b = m.delta().token_ids_size();
  c.Kill(a);
  const auto killed = Clock::now();
  while (reader_a->Read(&m)) {
  }
  const grpc::Status sa = reader_a->Finish();
  EXPECT_FALSE(sa.ok()) << "a stream through the killed router cannot finish";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - killed).count(), 10.0);
  bool got_summary = false;
  while (reader_b->Read(&m)) {
    tokens_b += m.delta().token_ids_size();
    got_summary |= m.has_summary();
  }
  const grpc::Status sb = reader_b->Finish();
  EXPECT_TRUE(sb.ok()) << sb.error_message();
  EXPECT_TRUE(got_summary);
  EXPECT_EQ(tokens_b, 300);

  // B still has both workers and serves as before; the sequence of the
  // killed router's stream freed its blocks.
  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_b->GetModelInfo(&info_ctx, {}, &info).ok());
  EXPECT_EQ(info.live_workers(), 2);
  for (int i = 0; i < 3; ++i) {
    const Answer after = Generate(*stub_b, Chat(kPrompts[0], 16));
    EXPECT_TRUE(after.status.ok()) << after.status.error_message();
    EXPECT_EQ(after.tokens, before.tokens);
  }
  ExpectAllBlocksFree(decode.address, "the decode worker");
  ExpectAllBlocksFree(prefill.address, "the prefill worker");
}

}  // namespace pdq::testing
