// Which routers a worker registers with (worker/router_targets.h): the
// --router list and the dns:/// names looked up into every router replica.
#include "worker/router_targets.h"

#include "gtest/gtest.h"

namespace pdq::worker {
namespace {

TEST(RouterTargetsTest, ParsesAListOfAddressesAndNames) {
  auto e = ParseRouterList("10.0.0.1:50051, [::1]:7000,dns:///routers.pdq.svc:50051");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].host, "10.0.0.1");
  EXPECT_EQ((*e)[0].port, "50051");
  EXPECT_FALSE((*e)[0].dns);
  EXPECT_EQ((*e)[1].host, "::1");
  EXPECT_EQ((*e)[1].port, "7000");
  EXPECT_EQ((*e)[2].host, "routers.pdq.svc");
  EXPECT_TRUE((*e)[2].dns);
}

TEST(RouterTargetsTest, RefusesWhatIsNotAnAddressNamingIt) {
  for (const char* bad : {"", " , ", "router", "router:", "router:0", "router:70000", "::1:50051",
                          "[::1]50051", "dns:///:50051", "a:1,b"}) {
    auto e = ParseRouterList(bad);
    EXPECT_FALSE(e.ok()) << "'" << bad << "'";
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto e = ParseRouterList("a:1,b");
  EXPECT_NE(std::string(e.status().message()).find("router 'b'"), std::string::npos)
      << e.status();
}

TEST(RouterTargetsTest, ANameStandsForEveryAddressItHas) {
  auto entries = ParseRouterList("dns:///routers:50051,127.0.0.1:6000,dns:///routers:50051");
  ASSERT_TRUE(entries.ok());
  int lookups = 0;
  Resolver resolve = [&](const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
    ++lookups;
    EXPECT_EQ(host, "routers");
    return std::vector<std::string>{"10.1.0.7", "fd00::7"};
  };
  std::vector<std::string> errors;
  std::vector<RouterTarget> t = ResolveRouterTargets(*entries, resolve, {}, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(lookups, 2);
  // Repeats appear once; TLS names the entry's host, not the address.
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0], (RouterTarget{"10.1.0.7:50051", "routers"}));
  EXPECT_EQ(t[1], (RouterTarget{"[fd00::7]:50051", "routers"}));
  EXPECT_EQ(t[2], (RouterTarget{"127.0.0.1:6000", "127.0.0.1"}));
}

TEST(RouterTargetsTest, AFailedLookupKeepsTheRoutersItHadAndSaysWhy) {
  auto entries = ParseRouterList("dns:///routers:50051,dns:///other:50051");
  ASSERT_TRUE(entries.ok());
  std::vector<std::string> errors;
  std::vector<RouterTarget> before = ResolveRouterTargets(
      *entries,
      [](const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
        return std::vector<std::string>{host == "routers" ? "10.1.0.7" : "10.2.0.9"};
      },
      {}, &errors);
  ASSERT_EQ(before.size(), 2u);
  // "routers" fails to resolve for a moment; "other" now has a new pod.
  std::vector<RouterTarget> after = ResolveRouterTargets(
      *entries,
      [](const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
        if (host == "routers") return absl::UnavailableError("cannot look up routers: timeout");
        return std::vector<std::string>{"10.2.0.10"};
      },
      before, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("routers"), std::string::npos);
  EXPECT_EQ(after, (std::vector<RouterTarget>{{"10.1.0.7:50051", "routers"},
                                              {"10.2.0.10:50051", "other"}}));
}

TEST(RouterTargetsTest, TheSystemResolverFindsLoopback) {
  auto a = SystemResolve("127.0.0.1");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, std::vector<std::string>{"127.0.0.1"});
  EXPECT_FALSE(SystemResolve("no-such-host.invalid").ok());
}

}  // namespace
}  // namespace pdq::worker
