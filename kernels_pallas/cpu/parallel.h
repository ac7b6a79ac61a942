// The parallel-for every C++ CPU kernel runs on XLA's intra-op thread pool:
// tasks 0..n_tasks-1 are claimed from an atomic counter by the calling thread
// and by up to (pool threads - 1) helpers, and the caller returns once every
// task has finished. A kernel's work object derives from Tasks and runs
// `for (int64_t t; (t = claim()) >= 0; finish()) ...` in its run(); it is held
// by a shared_ptr, so a helper the pool starts late (after the caller
// returned) only finds the counter exhausted.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

namespace pagedjax_parallel {

struct Tasks {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t n_tasks = 1;

  // The next unclaimed task, or -1 when every task is claimed.
  int64_t claim() {
    const int64_t t = next.fetch_add(1, std::memory_order_relaxed);
    return t < n_tasks ? t : -1;
  }
  void finish() { done.fetch_add(1, std::memory_order_release); }
};

// Runs work->run() here and on up to threads - 1 helpers handed to `schedule`
// (none unless `worth_helpers`: waking a thread costs more than small work),
// then waits for the tasks the helpers hold.
template <typename Work, typename Schedule>
void run(const std::shared_ptr<Work>& work, int64_t threads, bool worth_helpers,
         Schedule schedule) {
  const int64_t helpers = worth_helpers ? std::min<int64_t>(threads, work->n_tasks) - 1 : 0;
  for (int64_t i = 0; i < helpers; ++i) schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->n_tasks) std::this_thread::yield();
}

// The same on an XLA FFI thread pool (ffi::ThreadPool: num_threads, Schedule).
template <typename Work, typename Pool>
void run_on_pool(const std::shared_ptr<Work>& work, Pool& pool, bool worth_helpers) {
  run(work, pool.num_threads(), worth_helpers,
      [&pool](auto task) { pool.Schedule(std::move(task)); });
}

// The same on the calling thread alone (the self-tests).
template <typename Work>
void run_inline(const std::shared_ptr<Work>& work) {
  run(work, 1, false, [](auto task) { task(); });
}

}  // namespace pagedjax_parallel
