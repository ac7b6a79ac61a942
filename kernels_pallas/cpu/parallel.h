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
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace pagedjax_parallel {

// Sleeps while *word == value (or until woken, or for at most 1 ms): a futex on
// Linux, a yield elsewhere.
inline void sleep_while(std::atomic<int32_t>* word, int32_t value) {
#ifdef __linux__
  const timespec limit{0, 1000000};
  syscall(SYS_futex, reinterpret_cast<int32_t*>(word), FUTEX_WAIT_PRIVATE, value, &limit,
          nullptr, 0);
#else
  (void)word, (void)value;
  std::this_thread::yield();
#endif
}

inline void wake(std::atomic<int32_t>* word) {
#ifdef __linux__
  syscall(SYS_futex, reinterpret_cast<int32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr,
          nullptr, 0);
#else
  (void)word;
#endif
}

struct Tasks {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<int32_t> sleeping{0};  // 1 while the caller sleeps on it (wait_all)
  int64_t n_tasks = 1;

  // The next unclaimed task, or -1 when every task is claimed.
  int64_t claim() {
    const int64_t t = next.fetch_add(1, std::memory_order_relaxed);
    return t < n_tasks ? t : -1;
  }
  void finish() {
    if (done.fetch_add(1, std::memory_order_seq_cst) + 1 == n_tasks &&
        sleeping.load(std::memory_order_seq_cst)) {
      sleeping.store(0, std::memory_order_seq_cst);
      wake(&sleeping);
    }
  }
  // Waits until every task has finished: yields for a few microseconds (a helper's
  // last task usually ends within them), then sleeps, so that a helper the OS
  // preempted (a busy machine: the host's own thread wants a core too) can run on
  // this core instead of waiting for the one it was preempted on.
  void wait_all() {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (done.load(std::memory_order_acquire) < n_tasks) {
      if (std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      sleeping.store(1, std::memory_order_seq_cst);
      if (done.load(std::memory_order_seq_cst) >= n_tasks) break;
      sleep_while(&sleeping, 1);
    }
  }
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
  work->wait_all();
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
