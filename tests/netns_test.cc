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
#include <fcntl.h>
#include <sched.h>

#include <cstdlib>

#include "kvtransfer/transport.h"
#include "serving_cluster.h"

namespace pdq::testing {
namespace {

// Runs a command through the shell; its exit status.
int Run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

class Hosts {
 public:
  // Hosts r (router), p (prefill), d (decode), c (client) at 10.77.0.1-4.
  Hosts() : prefix_("pdq" + std::to_string(getpid()) + "-") {
    if (geteuid() != 0) {
      why_ = "needs root to create network namespaces";
      return;
    }
    if (Run("ip -V") != 0) {
      why_ = "iproute2 ('ip') is not installed";
      return;
    }
    const std::string sw = Name("sw");
    if (Run("ip netns add " + sw) != 0) {
      why_ = "cannot create a network namespace here (ip netns add failed)";
      return;
    }
    created_.push_back(sw);
    bool ok = Run("ip -n " + sw + " link add br0 type bridge") == 0 &&
              Run("ip -n " + sw + " link set br0 up") == 0;
    const char* hosts[] = {"r", "p", "d", "c"};
    for (int i = 0; i < 4 && ok; ++i) {
      const std::string ns = Name(hosts[i]), peer = std::string("v") + hosts[i];
      ok = Run("ip netns add " + ns) == 0;
      if (ok) created_.push_back(ns);
      ok = ok &&
           Run("ip link add eth0 netns " + ns + " type veth peer name " + peer + " netns " + sw) ==
               0 &&
           Run("ip -n " + sw + " link set " + peer + " master br0 up") == 0 &&
           Run("ip -n " + ns + " addr add " + Address(hosts[i]) + "/24 dev eth0") == 0 &&
           Run("ip -n " + ns + " link set eth0 up") == 0 &&
           Run("ip -n " + ns + " link set lo up") == 0;
    }
    if (!ok) why_ = "setting up veth links and addresses failed";
  }
  ~Hosts() {
    for (const std::string& ns : created_) Run("ip netns del " + ns);
  }

  const std::string& why_not() const { return why_; }
  std::string Name(const std::string& host) const { return prefix_ + host; }
  static std::string Address(const std::string& host) {
    return std::string("10.77.0.") + (host == "r"   ? "1"
                                      : host == "p" ? "2"
                                      : host == "d" ? "3"
                                                    : "4");
  }
  std::vector<std::string> On(const std::string& host) const {
    return {"ip", "netns", "exec", Name(host)};
  }
  // Moves the calling thread (and the threads it starts later) into the
  // host's namespace.
  bool Enter(const std::string& host) const {
    const int fd = open(("/var/run/netns/" + Name(host)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
  }

 private:
  std::string prefix_, why_;
  std::vector<std::string> created_;
};

// This binary's only test: it moves its thread into the client's namespace
// before any gRPC thread exists, so the client's calls cross the bridge too.
TEST(CrossHostTest, RouterPrefillAndDecodeOnSeparateHostsMatchTheMonolithicWorker) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (make model)";
  Hosts hosts;
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  ASSERT_TRUE(hosts.Enter("c"));
  Cluster c;
  // gRPC and /metrics on the host's own address (loopback is per namespace).
  auto on = [](const std::string& host, std::vector<std::string> args) {
    for (const char* flag : {"--listen", "--metrics-listen"}) {
      args.push_back(flag);
      args.push_back(Hosts::Address(host) + ":0");
    }
    return args;
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
    EXPECT_EQ(router.address.rfind(Hosts::Address("r") + ":", 0), 0u) << router.address;
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
