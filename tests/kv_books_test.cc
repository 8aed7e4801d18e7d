// The router's books of a decode worker's KV blocks and streams between
// heartbeats (router/kv_books.h), in every order a send, a sample, an end
// and the heartbeat carrying the sample can reach the router.
#include "router/kv_books.h"

#include <initializer_list>

#include "gtest/gtest.h"

namespace pdq::router {
namespace {

google::protobuf::RepeatedPtrField<std::string> Ids(std::initializer_list<const char*> ids) {
  google::protobuf::RepeatedPtrField<std::string> out;
  for (const char* id : ids) *out.Add() = id;
  return out;
}

// A heartbeat of a worker that lists both.
void Beat(KvBooks& b, std::initializer_list<const char*> taken,
          std::initializer_list<const char*> released) {
  b.Heartbeat(Ids(taken), true, Ids(released), true);
}

TEST(KvBooksTest, ASentRequestIsBookedUntilListedTakenAndCreditedFromItsEndUntilListedFreed) {
  KvBooks b;
  b.Book("a", 5);
  EXPECT_EQ(b.booked_blocks(), 5);
  EXPECT_EQ(b.booked_streams(), 1);
  Beat(b, {"a"}, {});  // the free count now holds it
  EXPECT_EQ(b.booked_blocks(), 0);
  EXPECT_EQ(b.booked_streams(), 0);
  EXPECT_EQ(b.credited_blocks(), 0);
  b.Done("a", 5);  // the free count still holds it
  EXPECT_EQ(b.credited_blocks(), 5);
  EXPECT_EQ(b.credited_streams(), 1);
  Beat(b, {}, {"a"});  // freed in the sample
  EXPECT_EQ(b.credited_blocks(), 0);
  EXPECT_EQ(b.credited_streams(), 0);
}

// The order the books before them got wrong: a heartbeat sampled before
// the stream ended there reaches the router after the end did. Its free
// count still holds the blocks, so the credit stays until one lists them
// freed.
TEST(KvBooksTest, AHeartbeatSampledBeforeTheEndButArrivingAfterItKeepsTheCredit) {
  KvBooks b;
  b.Book("a", 5);
  Beat(b, {"a"}, {});
  b.Done("a", 5);
  Beat(b, {}, {});  // sampled before "a" was freed
  EXPECT_EQ(b.credited_blocks(), 5);
  EXPECT_EQ(b.credited_streams(), 1);
  Beat(b, {}, {"a"});
  EXPECT_EQ(b.credited_blocks(), 0);
}

// The worker freed it and a heartbeat said so before the end reached the
// router: the free count already has it, so no credit (else counted twice).
TEST(KvBooksTest, ARequestFreedBeforeItsEndReachedTheRouterIsNotCreditedTwice) {
  KvBooks b;
  b.Book("a", 5);
  Beat(b, {"a"}, {});
  Beat(b, {}, {"a"});
  b.Done("a", 5);
  EXPECT_EQ(b.credited_blocks(), 0);
  EXPECT_EQ(b.credited_streams(), 0);
  // Taken and freed within one sample, and the end after it.
  b.Book("b", 3);
  Beat(b, {"b"}, {"b"});
  EXPECT_EQ(b.booked_blocks(), 0);
  b.Done("b", 3);
  EXPECT_EQ(b.credited_blocks(), 0);
}

// A short request ends before any heartbeat listed it: its booking goes,
// and a later heartbeat sampled while the worker held it lists it taken:
// its free count holds the blocks, so they are credited until one lists
// them freed.
TEST(KvBooksTest, ARequestEndingBeforeAnyHeartbeatListedItIsCreditedWhenOneDoes) {
  KvBooks b;
  b.Book("a", 5);
  b.Book("b", 2);
  b.Done("a", 5);
  EXPECT_EQ(b.booked_blocks(), 2);
  EXPECT_EQ(b.booked_streams(), 1);
  EXPECT_EQ(b.credited_blocks(), 0);
  Beat(b, {"a", "b"}, {});
  EXPECT_EQ(b.booked_blocks(), 0);
  EXPECT_EQ(b.credited_blocks(), 5);
  EXPECT_EQ(b.credited_streams(), 1);
  Beat(b, {}, {"a"});
  EXPECT_EQ(b.credited_blocks(), 0);
  // Listed taken and freed by the same heartbeat: nothing to credit.
  b.Book("c", 3);
  b.Done("c", 3);
  Beat(b, {"c"}, {"c"});
  EXPECT_EQ(b.credited_blocks(), 0);
  // Never listed (the worker refused it, or it never got there): after a
  // few heartbeats a late listing is another router's.
  b.Book("d", 4);
  b.Done("d", 4);
  for (int i = 0; i < KvBooks::kMaxCreditHeartbeats; ++i) Beat(b, {}, {});
  Beat(b, {"d"}, {});
  EXPECT_EQ(b.credited_blocks(), 0);
}

TEST(KvBooksTest, AnotherRoutersRequestsInTheListsChangeNothing) {
  KvBooks b;
  b.Book("a", 5);
  Beat(b, {"x"}, {"y"});
  EXPECT_EQ(b.booked_blocks(), 5);
  b.Done("x", 9);
  EXPECT_EQ(b.credited_blocks(), 0);
}

// A lost heartbeat loses its lists: a credit none clears is dropped after
// kMaxCreditHeartbeats, so the books err towards a fuller worker.
TEST(KvBooksTest, ACreditNoHeartbeatClearsIsDroppedAfterAFew) {
  KvBooks b;
  b.Book("a", 5);
  Beat(b, {"a"}, {});
  b.Done("a", 5);
  for (int i = 1; i < KvBooks::kMaxCreditHeartbeats; ++i) {
    Beat(b, {}, {});
    EXPECT_EQ(b.credited_blocks(), 5) << i;
  }
  Beat(b, {}, {});
  EXPECT_EQ(b.credited_blocks(), 0);
  EXPECT_EQ(b.credited_streams(), 0);
}

// Workers that predate the lists: books and credits last one heartbeat.
TEST(KvBooksTest, WithoutTheListsBooksAndCreditsLastOneHeartbeat) {
  KvBooks b;
  b.Book("a", 5);
  b.Heartbeat(Ids({"a"}), true, Ids({}), false);  // lists taken, not freed
  b.Done("a", 5);
  EXPECT_EQ(b.credited_blocks(), 5);
  b.Heartbeat(Ids({}), true, Ids({}), false);
  EXPECT_EQ(b.credited_blocks(), 0);
  b.Book("b", 4);
  b.Heartbeat(Ids({}), false, Ids({}), false);  // lists neither
  EXPECT_EQ(b.booked_blocks(), 0);              // its free count holds everything sent
  b.Done("b", 4);
  EXPECT_EQ(b.credited_blocks(), 4);
  b.Heartbeat(Ids({}), false, Ids({}), false);
  EXPECT_EQ(b.credited_blocks(), 0);
}

}  // namespace
}  // namespace pdq::router
