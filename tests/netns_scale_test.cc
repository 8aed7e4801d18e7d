// Scaling out across simulated hosts: a router, two prefill and two decode
// workers, each in its own network namespace (tests/netns_hosts.h), serve a
// steady load from a client on a sixth host; meanwhile a third decode
// worker joins and one prefill worker is drained with SIGTERM, as an
// autoscaler or a node drain would do. No request may fail, the router must
// use the new worker, and the drained worker must have finished what it
// held (every KV block back) before exiting with status 0.
//
// Needs root and `ip`; skips with a message otherwise.
#include <atomic>
#include <thread>

#include "netns_hosts.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

TEST(ScaleOutTest, AddingADecodeWorkerAndDrainingAPrefillWorkerUnderLoadFailsNoRequest) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  Hosts hosts({"r", "p1", "p2", "d1", "d2", "d3", "c"});
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  ASSERT_TRUE(hosts.Enter("c"));  // before any gRPC thread exists
  Cluster c;
  auto on = [&hosts](const std::string& host, std::vector<std::string> args) {
    return hosts.Listening(host, std::move(args));
  };
  const Proc router = c.Router(on("r", {}), hosts.On("r"));
  ASSERT_TRUE(router.ok());
  // The drained worker gets time to finish what it holds.
  const Proc p1 =
      c.Worker(router.address, "prefill", "w8a8",
               on("p1", {"--worker-id", "p1", "--drain-seconds", "60"}), hosts.On("p1"));
  const Proc p2 =
      c.Worker(router.address, "prefill", "w8a8", on("p2", {"--worker-id", "p2"}), hosts.On("p2"));
  const Proc d1 =
      c.Worker(router.address, "decode", "w4a16", on("d1", {"--worker-id", "d1"}), hosts.On("d1"));
  const Proc d2 =
      c.Worker(router.address, "decode", "w4a16", on("d2", {"--worker-id", "d2"}), hosts.On("d2"));
  ASSERT_TRUE(p1.ok() && p2.ok() && d1.ok() && d2.ok());
  auto stub = Client(router.address);
  ASSERT_TRUE(WaitForWorkers(*stub, 4));

  // Steady load: three clients sending back to back.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        v1::GenerateRequest r = Chat(kPrompts[(t + i) % kPrompts.size()], 24);
        r.set_ignore_eos(true);
        const Answer a = Generate(*stub, r);
        if (a.status.ok() && a.tokens.size() == 24) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard lock(mu);
          errors.push_back(a.status.error_message());
        }
      }
    });
  }
  auto wait_for_answers = [&](int n) {
    const int target = ok + n;
    const auto end = Clock::now() + std::chrono::seconds(120);
    while (ok < target && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return ok >= target;
  };
  ASSERT_TRUE(wait_for_answers(6)) << "no steady load to begin with";

  // Scale out: a third decode worker joins and is used.
  const Proc d3 =
      c.Worker(router.address, "decode", "w4a16", on("d3", {"--worker-id", "d3"}), hosts.On("d3"));
  ASSERT_TRUE(d3.ok());
  ASSERT_TRUE(WaitForWorkers(*stub, 5));
  ASSERT_TRUE(wait_for_answers(9));
  EXPECT_GT(Metric(d3.metrics, "pdq_generated_tokens_total"), 0) << "the router never used d3";

  // Scale in: p1 drains (SIGTERM) while the load goes on.
  ASSERT_EQ(::kill(p1.pid, SIGTERM), 0);
  int status = -1;
  const auto end = Clock::now() + std::chrono::seconds(90);
  while (waitpid(p1.pid, &status, WNOHANG) == 0 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Status 0: it drained (nothing queued, every KV block free) before
  // exiting; 3 would mean the drain timed out and requests were ended.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "p1 exit status " << status;
  ASSERT_TRUE(WaitForWorkers(*stub, 4));
  ASSERT_TRUE(wait_for_answers(6)) << "the load stopped after the drain";

  stop = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failed, 0) << "first error: " << (errors.empty() ? "" : errors[0]);
  EXPECT_GT(ok, 20);
  for (const Proc* w : {&p2, &d1, &d2, &d3}) ExpectAllBlocksFree(w->address, "after the load");
}

}  // namespace
}  // namespace pdq::testing
