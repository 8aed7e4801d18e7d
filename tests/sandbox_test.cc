// eval/sandbox.h: generated code runs without a network, within CPU,
// memory and wall-clock limits, in a directory removed afterwards; a run
// that breaks a rule is stopped and is not a pass.
#include "eval/sandbox.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace pdq {
namespace {

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  }
  // Runs a Python program; skips the test where no sandbox can be made.
  SandboxResult Python(const std::string& program, SandboxLimits limits = {}) {
    absl::StatusOr<SandboxResult> r = RunSandboxed({"python3", "-c", program}, "", limits);
    if (!r.ok() && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      skipped_ = std::string(r.status().message());
      return {};
    }
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SandboxResult{};
  }
  std::string skipped_;
};

TEST_F(SandboxTest, APassingProgramPassesWithItsOutput) {
  const SandboxResult r = Python("import sys; print(6 * 7); sys.stderr.write('err\\n')");
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(r.passed()) << OutcomeName(r.outcome) << ": " << r.output;
  EXPECT_NE(r.output.find("42"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("err"), std::string::npos) << r.output;
  // A failing assertion is a failure, with its exit code.
  const SandboxResult f = Python("assert 1 + 1 == 3");
  EXPECT_EQ(f.outcome, SandboxResult::Outcome::kFailed);
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_NE(f.output.find("AssertionError"), std::string::npos) << f.output;
}

TEST_F(SandboxTest, ANetworkSocketCannotReachAnything) {
  // A listener on this machine's loopback: the sandboxed program tries it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const SandboxResult r = Python(
      "import socket\n"
      "s = socket.create_connection(('127.0.0.1', " +
      std::to_string(port) +
      "), timeout=2)\n"
      "print('connected')\n");
  if (!skipped_.empty()) {
    close(fd);
    GTEST_SKIP() << skipped_;
  }
  EXPECT_FALSE(r.passed()) << r.output;
  EXPECT_EQ(r.output.find("connected"), std::string::npos) << r.output;
  // And nothing reached the listener.
  timeval tv{0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  EXPECT_LT(accept(fd, nullptr, nullptr), 0) << "the sandbox reached the host's loopback";
  close(fd);
  // Nor does a name resolve or an outside address answer.
  const SandboxResult dns = Python("import socket; socket.create_connection(('1.1.1.1', 53), 2)");
  EXPECT_FALSE(dns.passed()) << dns.output;
}

TEST_F(SandboxTest, RunsPastTheirLimitsAreStopped) {
  SandboxLimits cpu;
  cpu.cpu_seconds = 1;
  cpu.wall = absl::Seconds(20);
  const SandboxResult spin = Python("while True: pass", cpu);
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_EQ(spin.outcome, SandboxResult::Outcome::kKilled) << OutcomeName(spin.outcome);
  EXPECT_LT(spin.seconds, 10);

  SandboxLimits wall;
  wall.wall = absl::Milliseconds(500);
  const SandboxResult sleep = Python("import time; time.sleep(30)", wall);
  EXPECT_EQ(sleep.outcome, SandboxResult::Outcome::kTimedOut);
  EXPECT_LT(sleep.seconds, 5);

  SandboxLimits memory;
  memory.memory_bytes = int64_t{256} << 20;
  const SandboxResult big = Python("x = bytearray(1 << 30)", memory);
  EXPECT_FALSE(big.passed());
  EXPECT_NE(big.output.find("MemoryError"), std::string::npos) << big.output;

  // A child it leaves running past the wall clock is killed with it.
  const SandboxResult fork =
      Python("import os, time\nif os.fork() == 0:\n    time.sleep(30)\n", wall);
  EXPECT_FALSE(fork.passed());
  EXPECT_LT(fork.seconds, 5);
}

TEST_F(SandboxTest, ItWorksInATemporaryDirectoryThatIsRemoved) {
  const SandboxResult r = Python(
      "import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())\n"
      "print(sorted(k for k in os.environ if k != 'LC_CTYPE'))\n");
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  ASSERT_TRUE(r.passed()) << r.output;
  const std::string dir = r.output.substr(0, r.output.find('\n'));
  EXPECT_EQ(dir.rfind("/tmp/pdq-sandbox-", 0), 0u) << dir;
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " was left behind";
  EXPECT_NE(r.output.find("['HOME', 'LANG', 'PATH', 'TMPDIR']"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace pdq
