// Two router replicas across simulated hosts (network namespaces, as in
// netns_test): routers on hosts r1 and r2, a prefill and a decode worker on
// their own hosts, the client on a fifth. The workers are given the routers
// as one name with both addresses, `dns:///routers:PORT` (what a Kubernetes
// headless Service over the router pods gives them), and register with
// both. Killing one router ends only its own stream; the other's stream,
// registrations and answers are untouched.
//
// Needs root (CAP_NET_ADMIN) and `ip`; skips with a message otherwise.
#include "netns_hosts.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

TEST(RouterReplicasTest, KillingOneRouterAcrossHostsLeavesTheOthersStreamsAndWorkers) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  Hosts hosts({"r1", "r2", "p", "d", "c"});
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  for (const char* worker_host : {"p", "d"}) {
    ASSERT_TRUE(hosts.NameOn(worker_host, "routers", {"r1", "r2"}));
  }
  ASSERT_TRUE(hosts.Enter("c"));
  Cluster c;
  // The same port on both router hosts, as pods behind one Service have.
  const std::string port = "50151";
  auto router_on = [&](const std::string& host) {
    return c.Router({"--listen", hosts.Address(host) + ":" + port, "--metrics-listen",
                     hosts.Address(host) + ":0"},
                    hosts.On(host));
  };
  const Proc a = router_on("r1"), b = router_on("r2");
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string routers = "dns:///routers:" + port;
  const Proc prefill =
      c.Worker(routers, "prefill", "fp16", hosts.Listening("p", {}), hosts.On("p"));
  const Proc decode = c.Worker(routers, "decode", "fp16", hosts.Listening("d", {}), hosts.On("d"));
  ASSERT_TRUE(prefill.ok() && decode.ok());
  ExpectOneRouterLostLeavesTheOther(c, a, b, prefill, decode);
}

}  // namespace
}  // namespace pdq::testing
