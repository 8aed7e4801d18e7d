// Fork-join pool: a generation counter publishes each job; workers spin on
// it briefly, then block on a condition variable.
#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>

#include "common/check.h"

namespace pdq {
namespace {
constexpr int kSpinIterations = 1 << 15;
constexpr int kSpinsPerYield = 256;
// Enough chunks that a late thread's share is small, few enough that each
// still streams a contiguous run of weights.
constexpr int64_t kChunksPerThread = 4;
}  // namespace

int ThreadPool::UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return (int)std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : UsableCores()),
      shares_(new NextChunk[num_threads_]) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        _mm_pause();
        if (spins % kSpinsPerYield == 0) sched_yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    seen = gen;
    if (stop_.load()) return;
    // Enter only while this very job is open: the caller closes it (open_gen_
    // = 0) and then waits for active_ to drain, so job_ stays valid for
    // whoever entered, and a worker that saw an older generation can never
    // run the next job's function under the old one's bookkeeping.
    active_.fetch_add(1);
    if (open_gen_.load() == gen) {
      (*job_)(index);
      if (every_thread_) pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

// Spins on `done`, yielding now and then to whatever the OS runs instead.
template <typename Done>
static void SpinUntil(Done done) {
  for (int spins = 1; !done(); ++spins) {
    _mm_pause();
    if (spins % kSpinsPerYield == 0) sched_yield();
  }
}

void ThreadPool::Dispatch(const std::function<void(int)>& fn, bool every_thread) {
  if (busy_.exchange(true, std::memory_order_acquire)) {
    std::fprintf(stderr,
                 "pdq: ThreadPool used by two callers at once, or from inside one of its own "
                 "jobs; give each concurrently computing thread its own pool\n");
    std::abort();
  }
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;  // only we write it
  job_ = &fn;
  every_thread_ = every_thread;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  open_gen_.store(gen, std::memory_order_relaxed);
  generation_.store(gen);  // seq_cst: publishes the above; ordered before sleepers_
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  fn(0);
  if (every_thread) SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; });
  open_gen_.store(0);  // seq_cst against the workers' active_ increment
  SpinUntil([&] { return active_.load() == 0; });
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::Run(const std::function<void(int)>& fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  Dispatch(fn, /*every_thread=*/true);
}

void ThreadPool::ParallelFor(int64_t n, int64_t align,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  PDQ_CHECK(align > 0);
  const int64_t units = (n + align - 1) / align;
  const int64_t chunks = std::min<int64_t>(units, (int64_t)num_threads_ * kChunksPerThread);
  if (num_threads_ == 1 || chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  // Owned shares rather than one shared counter: with one counter the
  // threads took alternate chunks, and batch-1 decode ran 6-20% slower
  // (bench/RESULTS.md, "Each thread its own run of weights").
  const int64_t per_share = (chunks + num_threads_ - 1) / num_threads_;
  for (int t = 0; t < num_threads_; ++t) {
    shares_[t].next.store(std::min(chunks, t * per_share), std::memory_order_relaxed);
    shares_[t].end = std::min(chunks, (t + 1) * per_share);
  }
  Dispatch(
      [&](int t) {
        for (int i = 0; i < num_threads_; ++i) {
          NextChunk& share = shares_[(t + i) % num_threads_];
          for (int64_t c; (c = share.next.fetch_add(1, std::memory_order_relaxed)) < share.end;) {
            const int64_t begin = std::min(n, units * c / chunks * align);
            const int64_t end = std::min(n, units * (c + 1) / chunks * align);
            if (begin < end) fn(begin, end, t);
          }
        }
      },
      /*every_thread=*/false);
}

void ThreadPool::ParallelForEach(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  Dispatch(
      [&](int t) {
        for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i, t);
      },
      /*every_thread=*/false);
}

}  // namespace pdq
