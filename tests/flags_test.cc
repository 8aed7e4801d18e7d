// The flag parser's typed values and its comma-separated number lists.
#include "flags/flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdq {
namespace {

absl::Status ParseArgs(FlagParser& flags, std::vector<std::string> args) {
  std::vector<char*> argv = {const_cast<char*>("pdq")};
  for (std::string& a : args) argv.push_back(a.data());
  return flags.Parse((int)argv.size(), argv.data(), 1);
}

TEST(FlagsTest, TypedValuesAndRanges) {
  FlagParser flags("test", "a test");
  int64_t n = 3;
  double x = 0.5;
  bool on = true;
  std::string s = "a";
  flags.Int("n", &n, 1, 10, "n");
  flags.Float("x", &x, 0, 1, "x");
  flags.Bool("on", &on, "on");
  flags.String("s", &s, "s");
  ASSERT_TRUE(ParseArgs(flags, {"--n", "7", "--x=0.25", "--on=false", "--s", "b"}).ok());
  EXPECT_EQ(n, 7);
  EXPECT_EQ(x, 0.25);
  EXPECT_FALSE(on);
  EXPECT_EQ(s, "b");
  EXPECT_TRUE(flags.Given("n"));
  FlagParser more("test", "a test");
  more.Int("n", &n, 1, 10, "n");
  more.Bool("on", &on, "on");
  EXPECT_EQ(ParseArgs(more, {"--n", "11"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseArgs(more, {"--on=maybe"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseArgs(more, {"--other"}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ParseArgs(more, {"--on"}).ok());
  EXPECT_TRUE(on);
}

// Changed gives the flags whose values moved from their registered
// defaults, as arguments another parser of the same flags takes back.
TEST(FlagsTest, ChangedFlagsRoundTripThroughAnotherParser) {
  std::string s = "a";
  int64_t i = 3;
  double d = 0.75;
  bool b = true;
  FlagParser p("x", "");
  p.String("s", &s, "");
  p.Int("i", &i, 0, 10, "");
  p.Float("d", &d, 0, 1, "");
  p.Bool("b", &b, "");
  EXPECT_TRUE(p.Changed().empty());
  i = 7;
  d = 0.5;
  b = false;
  EXPECT_EQ(p.Changed(), (std::vector<std::string>{"--i=7", "--d=0.5", "--b=false"}));
  s = "x=y";
  std::string s2 = "a";
  int64_t i2 = 3;
  double d2 = 0.75;
  bool b2 = true;
  FlagParser q("x", "");
  q.String("s", &s2, "");
  q.Int("i", &i2, 0, 10, "");
  q.Float("d", &d2, 0, 1, "");
  q.Bool("b", &b2, "");
  std::vector<std::string> args = p.Changed();
  std::vector<char*> argv = {const_cast<char*>("x")};
  for (std::string& a : args) argv.push_back(a.data());
  ASSERT_TRUE(q.Parse((int)argv.size(), argv.data(), 1).ok());
  EXPECT_EQ(s2, "x=y");
  EXPECT_EQ(i2, 7);
  EXPECT_EQ(d2, 0.5);
  EXPECT_FALSE(b2);
}

TEST(FlagsTest, IntListsTakeWholeNumbersInRange) {
  absl::StatusOr<std::vector<int64_t>> l = IntList("levels", "1, 2,16", 1, 16);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(*l, (std::vector<int64_t>{1, 2, 16}));
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"1,17", "--levels: '17' is not a whole number from 1 to 16"},
           {"0", "'0' is not"},
           {"2.5", "'2.5' is not"},
           {"x", "'x' is not"},
           {"1,,2", "--levels: an empty entry in '1,,2'"},
           {"4,", "an empty entry"},
           {"", "--levels is empty"},
           {"  ", "--levels is empty"}}) {
    absl::StatusOr<std::vector<int64_t>> bad = IntList("levels", text, 1, 16);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(std::string(bad.status().message()).find(says), std::string::npos)
        << text << ": " << bad.status();
  }
}

TEST(FlagsTest, FloatListsHonourOpenAndClosedBounds) {
  absl::StatusOr<std::vector<double>> l = FloatList("shares", "0.25,0.5", 0, 1, true);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(*l, (std::vector<double>{0.25, 0.5}));
  EXPECT_TRUE(FloatList("shares", "0,1", 0, 1).ok());
  absl::StatusOr<std::vector<double>> open = FloatList("shares", "0.5,1", 0, 1, true);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(std::string(open.status().message()).find("--shares: '1' is not a number in (0, 1)"),
            std::string::npos)
      << open.status();
  EXPECT_FALSE(FloatList("shares", "nan", 0, 1).ok());
  EXPECT_FALSE(FloatList("shares", "inf", 0, 1e300).ok());
  EXPECT_FALSE(FloatList("shares", "0.5,", 0, 1).ok());
}

}  // namespace
}  // namespace pdq
