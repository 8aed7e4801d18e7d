// A fixed pool of spinning worker threads for fork-join kernel calls: a
// decode step issues hundreds of short parallel regions, so wake-up latency
// matters more than idle CPU. Workers sleep after ~1 ms without work, and
// yield while spinning so other processes on the same cores (a prefill and a
// decode worker on one box) still run. ParallelFor hands out chunks
// dynamically: the caller never waits for a worker the OS has not scheduled,
// which keeps a busy machine from costing a time slice per parallel region.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pdq {

class ThreadPool {
 public:
  // num_threads includes the calling thread; 0 means all online cores.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }
  // Cores this process may run on (its affinity mask), not all the machine's.
  static int UsableCores();

  // Runs fn(thread_index) once on every thread (the caller is index 0) and
  // returns when all are done. One caller at a time, and not from inside a
  // job: a second caller or a nested call aborts with a message rather
  // than corrupting the job in flight (the same holds for ParallelFor and
  // ParallelForEach). Threads that compute at once each need a pool.
  void Run(const std::function<void(int)>& fn);

  // Splits [0, n) into contiguous chunks aligned to `align` (a few per
  // thread) and runs fn(begin, end, thread_index) on each; a thread index is
  // never used by two chunks at once. Thread t owns the t-th contiguous share
  // of the chunks and runs them in order first, then takes what is left of
  // the others' shares (t + 1, t + 2, ... in turn), each again in order: a
  // thread streams one run of weights while all are on time, and a late or
  // descheduled thread's share still gets done.
  void ParallelFor(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn);

  // Runs fn(i, thread_index) for every i in [0, n), threads taking one index
  // at a time: for items of uneven cost (attention rows of a causal prompt).
  void ParallelForEach(int64_t n, const std::function<void(int64_t, int)>& fn);

 private:
  void WorkerLoop(int index);
  // Publishes fn to the workers and runs it on the caller too. With
  // `every_thread`, returns once every worker has run it; otherwise closes
  // the job when the caller's fn returns, and workers that have not started
  // by then skip it.
  void Dispatch(const std::function<void(int)>& fn, bool every_thread);

  const int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  bool every_thread_ = false;
  std::atomic<int> pending_{0};        // workers yet to run an every-thread job
  std::atomic<int> active_{0};         // workers inside (or entering) a job
  std::atomic<uint64_t> open_gen_{0};  // generation of the open job; 0 when closed
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a caller is inside Dispatch
  std::mutex mu_;
  std::condition_variable cv_;
  // ParallelFor's per-thread shares: the next chunk of share t, and its end.
  struct alignas(64) NextChunk {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<NextChunk[]> shares_;
};

}  // namespace pdq
