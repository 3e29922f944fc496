// How a parallel matmul shares its panels (or tasks) out between its threads.
//
// Each thread owns a contiguous range and takes its items from the front, so its
// weights stream from memory in one run that the prefetchers follow; a thread whose
// range is empty takes items from the back of another's, so a thread that loses its
// core (to the server's event loop) leaves its items to the others. Handing out
// single items to whoever asks next (OpenMP's dynamic schedule) interleaves the
// threads' streams: one-token and 32-token decode steps ran 6-7% slower that way,
// 4,096-token prefills 10% (benchmarks/README.md, session 22). Which thread computes
// an item never changes its result.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace amity {

class PanelQueue {
 public:
  // Before the parallel region: items 0 .. num_items - 1, split between as many owners
  // as the region may have threads (`parallel`: OpenMP's maximum, else one). A region
  // given fewer threads still empties every range.
  PanelQueue(int64_t num_items, bool parallel)
      : num_owners_(parallel ? std::clamp(omp_get_max_threads(), 1, kMostOwners) : 1) {
    for (int t = 0; t < num_owners_; ++t)
      ranges_[t].bounds.store(pack(num_items * t / num_owners_, num_items * (t + 1) / num_owners_),
                              std::memory_order_relaxed);
  }

  // Inside the region: the calling thread's next item, or -1 when none is left.
  int64_t next() {
    const int self = omp_get_thread_num();
    if (self < num_owners_) {
      const int64_t item = take(self, /*front=*/true);
      if (item >= 0) return item;
    }
    for (int i = 1; i <= num_owners_; ++i) {
      const int64_t item = take((self + i) % num_owners_, /*front=*/false);
      if (item >= 0) return item;
    }
    return -1;
  }

 private:
  static constexpr int kMostOwners = 64;
  struct alignas(64) Range {
    std::atomic<uint64_t> bounds;  // [first, end) packed, each 32 bits
  };

  static uint64_t pack(int64_t first, int64_t end) {
    return static_cast<uint64_t>(first) << 32 | static_cast<uint64_t>(end);
  }

  int64_t take(int owner, bool front) {
    std::atomic<uint64_t>& bounds = ranges_[owner].bounds;
    uint64_t packed = bounds.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t first = static_cast<int64_t>(packed >> 32), end = static_cast<int64_t>(packed & 0xFFFFFFFFu);
      if (first >= end) return -1;
      const uint64_t rest = front ? pack(first + 1, end) : pack(first, end - 1);
      if (bounds.compare_exchange_weak(packed, rest, std::memory_order_relaxed)) return front ? first : end - 1;
    }
  }

  const int num_owners_;
  Range ranges_[kMostOwners];
};

}  // namespace amity
