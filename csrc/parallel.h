// OpenMP work sharing for the kernels, with at::parallel_for's split (ATen/ParallelOpenMP.h).
//
// The library shares torch's OpenMP runtime: it is loaded after torch, so its libgomp.so.1 is the
// one torch already mapped, and a region here uses the same thread pool as torch's own ops. The
// thread count comes from the caller (torch.get_num_threads()): OpenMP's own count is a per-thread
// setting that torch sets only on the threads it runs ops from.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

namespace zerolayer {

// Calls f(b, e) on disjoint ranges covering [begin, end), in parallel on up to num_threads
// threads: as at::parallel_for, serially when the range has at most `grain` items, a single
// item, one thread or is already inside a parallel region; otherwise a region of num_threads
// threads (always the same size, so OpenMP keeps its pool) in which the first
// min(num_threads, ceil(n / grain)) take one contiguous range each. An exception f throws is
// rethrown here after the region.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, int num_threads, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  if (n <= grain || n == 1 || num_threads <= 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
#pragma omp parallel num_threads(num_threads)
  {
    int64_t tasks = omp_get_num_threads();
    if (grain > 0) tasks = std::min(tasks, (n + grain - 1) / grain);
    const int64_t tid = omp_get_thread_num();
    const int64_t chunk = (n + tasks - 1) / tasks;
    const int64_t first = begin + tid * chunk;
    if (tid < tasks && first < end) {
      try {
        f(first, std::min(end, first + chunk));
      } catch (...) {
        if (!failed.test_and_set()) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace zerolayer
