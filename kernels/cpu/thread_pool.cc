// Fork-join pool: a generation counter publishes each job; workers spin on
// it briefly, then block on a condition variable.
#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include "common/check.h"

namespace pdq {
namespace {
constexpr int kSpinIterations = 1 << 15;
}

namespace {
// Cores this process may run on (affinity mask), not all the machine's.
int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return (int)std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : UsableCores()) {
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
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::Run(const std::function<void(int)>& fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: ordered before the sleepers_ read
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  fn(0);
  while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
}

void ThreadPool::ParallelFor(int64_t n, int64_t align,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  PDQ_CHECK(align > 0);
  const int64_t units = (n + align - 1) / align;
  const int threads = (int)std::min<int64_t>(num_threads_, units);
  if (threads <= 1) {
    fn(0, n, 0);
    return;
  }
  Run([&](int t) {
    if (t >= threads) return;
    const int64_t begin = std::min(n, units * t / threads * align);
    const int64_t end = std::min(n, units * (t + 1) / threads * align);
    if (begin < end) fn(begin, end, t);
  });
}

}  // namespace pdq
