// Simulated hosts for the tests of what crosses a network: each host is a
// network namespace with its own address (10.77.0.N), joined by veth links
// to a bridge in one more namespace (iproute2). The namespaces are the
// test's own (named after its pid) and removed at the end; nothing is added
// to the machine's own namespace. Needs root (CAP_NET_ADMIN) and `ip`;
// why_not() says why not otherwise, for GTEST_SKIP.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace pdq::testing {

class Hosts {
 public:
  // Hosts named `names`, at 10.77.0.1, .2, ... in that order.
  explicit Hosts(std::vector<std::string> names)
      : names_(std::move(names)), prefix_("pdq" + std::to_string(getpid()) + "-") {
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
    for (size_t i = 0; i < names_.size() && ok; ++i) {
      const std::string ns = Name(names_[i]), peer = "v" + std::to_string(i);
      ok = Run("ip netns add " + ns) == 0;
      if (ok) created_.push_back(ns);
      ok = ok &&
           Run("ip link add eth0 netns " + ns + " type veth peer name " + peer + " netns " + sw) ==
               0 &&
           Run("ip -n " + sw + " link set " + peer + " master br0 up") == 0 &&
           Run("ip -n " + ns + " addr add " + Address(names_[i]) + "/24 dev eth0") == 0 &&
           Run("ip -n " + ns + " link set eth0 up") == 0 &&
           Run("ip -n " + ns + " link set lo up") == 0;
    }
    if (!ok) why_ = "setting up veth links and addresses failed";
  }
  ~Hosts() {
    for (const std::string& ns : created_) Run("ip netns del " + ns);
    for (const std::string& dir : etc_dirs_) Run("rm -rf " + dir);
  }

  // Gives `host` its own /etc/hosts (`ip netns exec` mounts
  // /etc/netns/NAME/hosts over it), naming `name` at the addresses of
  // `hosts`: a name with several addresses, as a Kubernetes headless
  // Service's is, without a DNS server. False when it cannot be written.
  bool NameOn(const std::string& host, const std::string& name,
              const std::vector<std::string>& hosts) {
    const std::string dir = "/etc/netns/" + Name(host);
    if (Run("mkdir -p " + dir) != 0) return false;
    etc_dirs_.push_back(dir);
    std::string text = "127.0.0.1 localhost\n";
    for (const std::string& h : hosts) text += Address(h) + " " + name + "\n";
    FILE* f = std::fopen((dir + "/hosts").c_str(), "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs(text.c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  }

  const std::string& why_not() const { return why_; }
  std::string Name(const std::string& host) const { return prefix_ + host; }
  std::string Address(const std::string& host) const {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == host) return "10.77.0." + std::to_string(i + 1);
    }
    return "0.0.0.0";  // not a host of this test: nothing will listen there
  }
  // `args` plus --listen and --metrics-listen on the host's own address
  // (port 0): loopback is per namespace.
  std::vector<std::string> Listening(const std::string& host, std::vector<std::string> args) const {
    for (const char* flag : {"--listen", "--metrics-listen"}) {
      args.push_back(flag);
      args.push_back(Address(host) + ":0");
    }
    return args;
  }
  // A command prefix that runs a process on `host`.
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
  // Runs a command through the shell; its exit status.
  static int Run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str());
  }

  std::vector<std::string> names_;
  std::string prefix_, why_;
  std::vector<std::string> created_, etc_dirs_;
};

}  // namespace pdq::testing
