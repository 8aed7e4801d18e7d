// Serving across hosts, simulated: the router, the prefill worker, the
// decode worker and this test's client each run in their own network
// namespace with their own address, joined by veth links to a bridge in a
// fifth namespace (iproute2). Nothing is on loopback between them, so every
// gRPC call and every KV byte crosses a network interface. Greedy answers
// match the monolithic worker's over every KV transport.
//
// Needs root (CAP_NET_ADMIN) and `ip`; skips with a message otherwise. The
// namespaces are this test's own (named after its pid) and removed at the
// end; nothing is added to the machine's own namespace.
#include "kvtransfer/transport.h"
#include "netns_hosts.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

// This binary's only test: it moves its thread into the client's namespace
// before any gRPC thread exists, so the client's calls cross the bridge too.
TEST(CrossHostTest, RouterPrefillAndDecodeOnSeparateHostsMatchTheMonolithicWorker) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  Hosts hosts({"r", "p", "d", "c"});
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  ASSERT_TRUE(hosts.Enter("c"));
  Cluster c;
  // gRPC and /metrics on the host's own address (loopback is per namespace).
  auto on = [&hosts](const std::string& host, std::vector<std::string> args) {
    return hosts.Listening(host, std::move(args));
  };

  // The reference: one process doing both, on the decode host.
  const Proc mono = c.Router(on("r", {}), hosts.On("r"));
  ASSERT_TRUE(mono.ok());
  ASSERT_TRUE(c.Worker(mono.address, "both", "w4a16", on("d", {"--prefill-precision", "w8a8"}),
                       hosts.On("d"))
                  .ok());
  auto m = Client(mono.address);
  ASSERT_TRUE(WaitForWorkers(*m, 1));
  std::vector<Answer> want;
  for (const std::string& p : kPrompts) {
    want.push_back(Generate(*m, Chat(p, 16)));
    ASSERT_TRUE(want.back().status.ok()) << want.back().status.error_message();
  }

  for (const std::string& transport : kvtransfer::TransportNames()) {
    SCOPED_TRACE("KV over " + transport);
    const Proc router = c.Router(on("r", {}), hosts.On("r"));
    ASSERT_TRUE(router.ok());
    EXPECT_EQ(router.address.rfind(hosts.Address("r") + ":", 0), 0u) << router.address;
    const Proc prefill = c.Worker(router.address, "prefill", "w8a8",
                                  on("p", {"--kv-transport", transport}), hosts.On("p"));
    const Proc decode = c.Worker(router.address, "decode", "w4a16",
                                 on("d", {"--kv-transport", transport}), hosts.On("d"));
    ASSERT_TRUE(prefill.ok() && decode.ok());
    auto stub = Client(router.address);
    ASSERT_TRUE(WaitForWorkers(*stub, 2));
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const Answer a = Generate(*stub, Chat(kPrompts[i], 16));
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
      EXPECT_EQ(a.tokens, want[i].tokens) << kPrompts[i];
    }
    // The KV crossed from the prefill host to the decode host.
    const double sent = Metric(prefill.metrics, "pdq_kv_bytes_sent_total");
    EXPECT_GT(sent, 0);
    EXPECT_EQ(Metric(decode.metrics, "pdq_kv_bytes_received_total"), sent);
  }
}

}  // namespace
}  // namespace pdq::testing
