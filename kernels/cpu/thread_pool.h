// A fixed pool of spinning worker threads for fork-join kernel calls: a
// decode step issues hundreds of short parallel regions, so wake-up latency
// matters more than idle CPU. Workers sleep after ~1 ms without work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
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

  // Runs fn(thread_index) once on every thread (the caller is index 0) and
  // returns when all are done. Not reentrant; one caller at a time.
  void Run(const std::function<void(int)>& fn);

  // Splits [0, n) into size() contiguous ranges, aligned to `align`, and runs
  // fn(begin, end, thread_index) on each non-empty range.
  void ParallelFor(int64_t n, int64_t align,
                   const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace pdq
