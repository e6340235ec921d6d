// A whole decode step of a standard Llama layer stack (bfloat16, up to kMaxSkinnyRows sequences,
// one new token each) in one native call and one parallel region.
//
// The Python forward makes about twenty calls per layer, and each decode GEMV opens its own
// OpenMP parallel region. The scheduler keeps libgomp's spin short (GOMP_SPINCOUNT=100, so that a
// busy neighbour process does not stall it), so the other threads sleep between regions and every
// region starts with a futex wake-up: measured here, a decode step of the `small` preset took
// 3 ms longer with the short spin than with a 10000-iteration one, out of 20 ms. This kernel opens
// one region per step; inside it the threads meet at a barrier that spins with `pause` for a
// bounded time and then sleeps on a futex, so both threads stay awake between the phases of a
// step (microseconds apart) without spinning through the idle time between steps.
//
// Per layer, with the roundings of the Python forward (zerolayer/scheduler/model/llama.py): every
// intermediate is rounded to bfloat16 where torch would round it.
//   x = rms_norm(h)             (the previous layer's MLP output added to h first)
//   q, k, v = x Wq^T, x Wk^T, x Wv^T      (the decode GEMV of skinny_linear.cpp, rows split)
//   q, k = RoPE(q), RoPE(k); k, v written to their cache slots
//   a = softmax(q K^T * scale) V over the sequence's blocks (float32; the scores, their
//       maximum, then the weights, rounded to bfloat16 as they multiply V but summed in
//       float32, as torch's attention; GQA: kv head g serves q heads g * G .. g * G + G - 1)
//   h = h + a Wo^T; x = rms_norm(h)
//   m = silu(x Wg^T) * (x Wu^T); d = m Wd^T
// and after the last layer rms_norm(h + d) with the final norm. Float32 sums run in other orders
// than torch's (the GEMVs, as skinny_linear; the norms, as elementwise.cpp; attention, as
// paged_attention.cpp) and expf is not torch's, so values can differ by a bfloat16 rounding.
//
// Each matrix is bfloat16 (skinny_linear's row kernels), int8 (zerolayer quantize, int8_gemv.h)
// or of a GGUF type (gguf_kernels.h: bfloat16 x quantized once per projection input for the
// domains that phase's matrices need, Q8_0 and/or Q8_K; the float types against x widened), each
// matrix of its own type (a Q4_K_M file mixes Q4_K and Q6_K). A GGUF llama file's q and k rows
// are in llama.cpp's interleaved rotary layout (qk_rows_interleaved): their outputs are mapped
// back to the rotate-half layout before RoPE, as the Python forward does.
//
// Models with biases, q/k norms, another activation or norm, sliding windows, logit soft-capping
// or fused projections take the Python forward (zerolayer/scheduler/model/decode_forward.py
// decides).

#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "api.h"
#include "elementwise.h"
#include "gemv.h"
#include "gguf_kernels.h"
#include "int8_gemv.h"
#include "kernels.h"
#include "simd.h"

namespace zerolayer {
namespace {

using simd::to_bf16;

using simd::round_bf16;
inline float widen(uint16_t h) { return simd::from_bf16(h); }

inline void cpu_pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// A barrier for the threads of one parallel region: a waiting thread spins with pause for about
// kSpins rounds (the phases of a decode step are microseconds apart), then sleeps on a futex
// until the last thread arrives, so that a thread descheduled by a busy neighbour does not keep
// the other spinning for its whole time slice.
class SpinBarrier {
 public:
  // Every thread calls this with the team size before its first wait (all the same value).
  void set_size(int n) { size_.store(n, std::memory_order_relaxed); }

  void wait() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size_.load(std::memory_order_relaxed) - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) futex(FUTEX_WAKE_PRIVATE, INT32_MAX);
      return;
    }
    for (int spins = 0; spins < kSpins; ++spins) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      cpu_pause();
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (generation_.load(std::memory_order_seq_cst) == generation) {
      futex(FUTEX_WAIT_PRIVATE, generation);  // returns at once if the generation moved on
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  void futex(int op, int value) {
    static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex word");
    syscall(SYS_futex, reinterpret_cast<int*>(&generation_), op, value, nullptr, nullptr, 0);
  }

  // Measured in-process on the `small` preset (ms per token, quiet / beside one busy process):
  // 50 pauses 11.7 / 22.2, 300 10.0-11.3 / 22.5-23.8, 600 11.2-11.9 / 18.8-22.7, 2000 10.5 /
  // 27.0, 10000 10.5 / 46.2 (the layer-by-layer forward: 14.1 / 24.6-25.6). Longer spins keep a
  // thread on its core while the other is descheduled, which a busy neighbour then pays for.
  static constexpr int kSpins = 500;
  std::atomic<int> size_{1};
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
  std::atomic<int> sleepers_{0};
};

// Rows [lo, hi) of thread tid of nt for total rows.
inline void share(int64_t total, int tid, int nt, int64_t* lo, int64_t* hi) {
  *lo = total * tid / nt;
  *hi = total * (tid + 1) / nt;
}

// The rows of one projection phase, shared out with work stealing. Each thread first takes its
// own share (as share() splits them) chunk by chunk from its cursor, then takes chunks from the
// other threads' cursors. A thread that loses its core for a while (another process of the stack
// wakes up on it: on two cores, the scheduler's gRPC loop, the frontend and the client take about
// 1.5 ms of CPU per generated token) then delays the phase by the chunk it holds, not by the rest
// of its share. Cursors are advanced with fetch_add, so a chunk goes to exactly one thread.
class RowQueue {
 public:
  explicit RowQueue(int num_threads) : cursors_(static_cast<size_t>(num_threads)) {}

  // Thread tid's share of rows [0, total) for the next phase. Each thread calls this for itself
  // after the barrier that ends the previous projection phase and before the barrier that starts
  // this one (which publishes it to the others).
  void arm(int tid, int nt, int64_t total) {
    int64_t lo, hi;
    share(total, tid, nt, &lo, &hi);
    cursors_[tid].next.store(lo, std::memory_order_relaxed);
    cursors_[tid].end = hi;
  }

  // The next chunk [*lo, *hi) of at most `chunk` rows for thread tid: its own first, then any
  // other thread's. False when no row is left.
  bool claim(int tid, int nt, int64_t chunk, int64_t* lo, int64_t* hi) {
    for (int i = 0; i < nt; ++i) {
      Cursor& c = cursors_[(tid + i) % nt];
      if (c.next.load(std::memory_order_relaxed) >= c.end) continue;
      const int64_t start = c.next.fetch_add(chunk, std::memory_order_relaxed);
      if (start < c.end) {
        *lo = start;
        *hi = std::min(start + chunk, c.end);
        return true;
      }
    }
    return false;
  }

 private:
  struct alignas(64) Cursor {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::vector<Cursor> cursors_;
};

// Rows per work-stealing chunk for weight rows of row_bytes: about kChunkBytes of weights, a
// multiple of 4 rows (the int8 kernel's row block).
inline int64_t chunk_rows(int64_t row_bytes) {
  constexpr int64_t kChunkBytes = 32 * 1024;
  const int64_t rows = std::max<int64_t>(4, kChunkBytes / std::max<int64_t>(row_bytes, 1));
  return (rows + 3) / 4 * 4;
}

// q . k in simd::kLanes partial sums (so that the compiler vectorizes it).
ZL_MULTIVERSION float dot(const float* q, const uint16_t* k, int64_t d) {
  float lanes[simd::kLanes] = {};
  int64_t j = 0;
  for (; j + simd::kLanes <= d; j += simd::kLanes) {
    for (int64_t l = 0; l < simd::kLanes; ++l) lanes[l] += q[j + l] * widen(k[j + l]);
  }
  for (; j < d; ++j) lanes[0] += q[j] * widen(k[j]);
  float s = 0.f;
  for (float v : lanes) s += v;
  return s;
}

ZL_MULTIVERSION void add_scaled(float* acc, float w, const uint16_t* v, int64_t d) {
  for (int64_t j = 0; j < d; ++j) acc[j] += w * widen(v[j]);
}

// How a matrix is stored (Matrix::type): bfloat16, int8 with scales, else a GGUF type id.
constexpr int32_t kDenseBf16 = -1;
constexpr int32_t kInt8 = -2;

// One matrix of a layer: bfloat16 [n, k], int8 with float32 scales [n, k / G], or the blocks of
// a GGUF type.
struct Matrix {
  const void* w;
  const float* scales;  // int8 only
  int32_t type;
};

// What a projection phase's input needs before its matrices read it.
struct Needs {
  bool dense = false, int8 = false, q8_0 = false, q8_k = false, gguf = false;

  Needs(std::initializer_list<const Matrix*> ws) {
    for (const Matrix* w : ws) add(*w);
  }

  void add(const Matrix& w) {
    dense |= w.type == kDenseBf16;
    int8 |= w.type == kInt8;
    if (w.type >= 0) {
      const gguf::Domain domain = gguf::type_info(w.type)->domain;
      gguf = true;
      q8_0 |= domain == gguf::Domain::kQ8_0;
      q8_k |= domain == gguf::Domain::kQ8_K;
    }
  }
};

// The bytes of one row of k values of w (int8: with its float32 scales).
int64_t row_bytes_of(const Matrix& w, int64_t k, int64_t group_size) {
  if (w.type == kDenseBf16) return 2 * k;
  if (w.type == kInt8) return k + k / group_size * 4;
  return gguf::row_bytes(*gguf::type_info(w.type), k);
}

// A head's dimensions from llama.cpp's interleaved rotary layout (pairs (2i, 2i + 1)) to the
// rotate-half one (pairs (i, i + D/2)), in place, for `heads` heads of d values.
void rotate_half_layout(uint16_t* x, int64_t heads, int64_t d) {
  uint16_t tmp[1024];
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t* row = x + h * d;
    for (int64_t i = 0; i < d / 2; ++i) tmp[i] = row[2 * i], tmp[d / 2 + i] = row[2 * i + 1];
    std::memcpy(row, tmp, d * sizeof(uint16_t));
  }
}

// The weights of one layer (the caller's memory, read in place).
struct Layer {
  const uint16_t* input_norm;  // [hidden]
  const uint16_t* post_norm;   // [hidden]
  Matrix q, k, v, o, gate, up, down;
};

// A whole decode step of a standard Llama layer stack: the state behind zl_decode_forward_*.
class DecodeForward {
 public:
  DecodeForward(std::vector<Layer> layers, const uint16_t* final_norm, int64_t hidden,
                int64_t intermediate, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                int64_t group_size, float eps, float scale, bool qk_rows_interleaved)
      : layers_(std::move(layers)),
        final_norm_(final_norm),
        hidden_(hidden),
        intermediate_(intermediate),
        group_size_(group_size),
        num_heads_(num_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        eps_(eps),
        scale_(scale),
        qk_rows_interleaved_(qk_rows_interleaved) {
    ZL_CHECK(!layers_.empty(), "DecodeForward: no layers");
    ZL_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
             "DecodeForward: num_heads must be a multiple of num_kv_heads");
    ZL_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 1024,
             "DecodeForward: even head_dim up to 1024 expected");
    ZL_CHECK(hidden % simd::kLanes == 0 && intermediate % simd::kLanes == 0 &&
                 (num_heads * head_dim) % simd::kLanes == 0,
             "DecodeForward: projection inputs must be multiples of 16");
    if (group_size_ > 0) Int8Gemv check(group_size_);  // refuses a group size no kernel takes, here
    for (const Layer& l : layers_) {
      const int64_t q_dim = num_heads * head_dim;
      for (const auto& [w, k] : {std::pair<const Matrix*, int64_t>{&l.q, hidden}, {&l.k, hidden},
                                 {&l.v, hidden}, {&l.o, q_dim}, {&l.gate, hidden},
                                 {&l.up, hidden}, {&l.down, intermediate}}) {
        check_matrix(*w, k);
      }
    }
  }

  // One decode step of m sequences (api.h: zl_decode_forward_run) on `threads` threads.
  void forward(const uint16_t* h, int64_t m, void* const* k_caches, void* const* v_caches,
               int64_t num_blocks, int64_t block_size, const int64_t* slot_p,
               const int64_t* table_p, int64_t table_width, const int64_t* len_p,
               const uint16_t* cos_p, const uint16_t* sin_p, uint16_t* op, int threads) const;

 private:
  std::vector<Layer> layers_;
  const uint16_t* final_norm_;
  int64_t hidden_, intermediate_;
  int64_t group_size_;  // int8 group size; 0 for bfloat16 matrices
  int64_t num_heads_, num_kv_heads_, head_dim_;
  float eps_, scale_;
  bool qk_rows_interleaved_;
  const gguf::IsaKernels* gguf_ = nullptr;  // the GGUF kernels, where a matrix is of a GGUF type

  // Refuses a matrix of k columns this step cannot multiply.
  void check_matrix(const Matrix& w, int64_t k) {
    ZL_CHECK(w.w != nullptr, "DecodeForward: a matrix is missing");
    if (w.type == kInt8) {
      ZL_CHECK(group_size_ > 0 && w.scales != nullptr, "DecodeForward: int8 without scales");
    } else if (w.type != kDenseBf16) {
      const gguf::TypeInfo* info = gguf::type_info(w.type);
      ZL_CHECK(info != nullptr, "DecodeForward: unknown GGUF type id ", w.type);
      ZL_CHECK(k % info->block_size == 0, "DecodeForward: ", info->name, " rows of ", k,
               " values are not whole blocks");
      if (gguf_ == nullptr) gguf_ = &gguf::isa_kernels(nullptr);
    }
  }
};

// Checks every index of the step before the region: nothing inside it may throw.
void check_step(int64_t m, int64_t num_blocks, int64_t block_size, const int64_t* slot_p,
                const int64_t* table_p, int64_t table_width, const int64_t* len_p) {
  ZL_CHECK(m >= 1 && m <= kMaxSkinnyRows, "decode_forward: 1 <= M <= ", kMaxSkinnyRows);
  for (int64_t s = 0; s < m; ++s) {
    ZL_CHECK(slot_p[s] >= 0 && slot_p[s] < num_blocks * block_size,
             "decode_forward: slot out of range");
    ZL_CHECK(len_p[s] >= 1 && len_p[s] <= table_width * block_size,
             "decode_forward: a sequence is longer than its block table");
    for (int64_t b = 0; b < (len_p[s] + block_size - 1) / block_size; ++b) {
      const int64_t id = table_p[s * table_width + b];
      ZL_CHECK(id >= 0 && id < num_blocks, "decode_forward: block id out of range");
    }
    ZL_CHECK(table_p[s * table_width + (len_p[s] - 1) / block_size] * block_size +
                     (len_p[s] - 1) % block_size ==
                 slot_p[s],
             "decode_forward: the new token's slot is not the sequence's last position");
  }
}

// A buffer of n values, uninitialized (as at::empty): every element is written before it is read.
template <typename T>
std::unique_ptr<T[]> buffer(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(n)]);
}

void DecodeForward::forward(const uint16_t* h, int64_t m, void* const* k_caches,
                            void* const* v_caches, int64_t num_blocks, int64_t block_size,
                            const int64_t* slot_p, const int64_t* table_p, int64_t table_width,
                            const int64_t* len_p, const uint16_t* cos_p, const uint16_t* sin_p,
                            uint16_t* op, int threads) const {
  const int64_t hidden = hidden_, inter = intermediate_, dim = head_dim_;
  const int64_t heads = num_heads_, kv_heads = num_kv_heads_, group = heads / kv_heads;
  const int64_t q_dim = heads * dim, kv_dim = kv_heads * dim;
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  check_step(m, num_blocks, block_size, slot_p, table_p, table_width, len_p);
  const GemvRows rows = gemv_rows(m);
  ZL_CHECK(rows.fn != nullptr, "decode_forward: no GEMV for ", m, " rows");
  auto resid = buffer<uint16_t>(m * hidden), x = buffer<uint16_t>(m * hidden);
  auto q = buffer<uint16_t>(m * q_dim), k = buffer<uint16_t>(m * kv_dim);
  auto v = buffer<uint16_t>(m * kv_dim), attn = buffer<uint16_t>(m * q_dim);
  auto o = buffer<uint16_t>(m * hidden), gate = buffer<uint16_t>(m * inter);
  auto up = buffer<uint16_t>(m * inter), act = buffer<uint16_t>(m * inter);
  auto down = buffer<uint16_t>(m * hidden);
  auto x32 = buffer<float>(m * std::max({hidden, q_dim, inter}));
  std::memcpy(resid.get(), h, m * hidden * sizeof(uint16_t));
  uint16_t *rp = resid.get(), *xp = x.get(), *qp = q.get(), *kp = k.get();
  uint16_t *vp = v.get(), *ap = attn.get(), *orow = o.get(), *gp = gate.get(), *up_p = up.get();
  uint16_t *actp = act.get(), *dp = down.get();
  float* x32p = x32.get();
  const float eps = eps_, scale = scale_;

  // The residual stream h += delta (rounded; none when delta is null), then out = rms_norm(h).
  auto add_norm = [&](const uint16_t* delta, const uint16_t* weight, uint16_t* norm_out) {
    for (int64_t s = 0; s < m; ++s) {
      uint16_t* hr = rp + s * hidden;
      if (delta != nullptr) {
        for (int64_t j = 0; j < hidden; ++j) {
          hr[j] = to_bf16(widen(hr[j]) + widen(delta[s * hidden + j]));
        }
      }
      rms_norm_row(hr, weight, norm_out + s * hidden, hidden, eps);
    }
  };

  // Projections, each matrix by its type: bfloat16 (the GEMV row kernel, x as it is or
  // widened), int8 or GGUF (x quantized once per phase). prepare runs on thread 0 between
  // barriers, for what the phase's matrices need.
  std::unique_ptr<Int8Gemv> int8;
  if (group_size_ > 0) int8.reset(new Int8Gemv(group_size_));
  gguf::QuantizedActs acts;
  const bool prepares = int8 != nullptr || gguf_ != nullptr || rows.x != GemvX::kBf16;
  auto prepare = [&](const uint16_t* src, int64_t cols, const Needs& needs) {
    if (needs.int8) int8->quantize(src, m, cols);
    if (needs.gguf) acts.quantize(src, true, m, cols, needs.q8_0, needs.q8_k, 1);
    if (needs.dense && rows.x != GemvX::kBf16) {  // float32 [M, cols] for the widening kernels
      gemv_prepare_x(rows, src, m * cols, x32p);
    }
  };
  // rows [lo, hi) of y [M, n] = x [M, k] @ w^T (its scales for int8)
  auto project = [&](const uint16_t* x16, const Matrix& w, uint16_t* y, int64_t n, int64_t k,
                     int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    if (w.type == kInt8) {
      int8->rows(static_cast<const int8_t*>(w.w), w.scales, y, n, lo, hi);
    } else if (w.type == kDenseBf16) {
      rows.fn(rows.x == GemvX::kBf16 ? static_cast<const void*>(x16) : x32p,
              static_cast<const uint16_t*>(w.w), y, k, n, lo, hi);
    } else {
      const gguf::TypeInfo& info = *gguf::type_info(w.type);
      const gguf::WeightRows rows_of_w{w.type, static_cast<const uint8_t*>(w.w),
                                       gguf::row_bytes(info, k), n, y, true};
      if (info.domain == gguf::Domain::kFloat) {
        gguf_->float_rows(acts.widened(), k, 0, m, rows_of_w, lo, hi);
      } else {
        gguf_->int_rows(acts.view(), 0, m, rows_of_w, lo, hi);
      }
    }
  };

  SpinBarrier barrier;
  RowQueue queue(threads);
  // rows of a work-stealing chunk of w, k columns
  auto chunk_for = [&](const Matrix& w, int64_t k) {
    return chunk_rows(row_bytes_of(w, k, group_size_));
  };
  // A phase that ends with y [M, hidden] = src [M, k] @ w^T, called by every thread after its
  // share of the previous phase: arms the queue (before the barrier that ends that phase),
  // quantizes or widens src on thread 0 where the kernel needs it, then shares the rows out.
  auto project_to_hidden = [&](int tid, int nt, const uint16_t* src, int64_t k, const Matrix& w,
                               uint16_t* y) {
    const int64_t chunk = chunk_for(w, k);
    queue.arm(tid, nt, hidden);
    barrier.wait();
    if (prepares) {
      if (tid == 0) prepare(src, k, Needs{&w});
      barrier.wait();
    }
    int64_t lo, hi;
    while (queue.claim(tid, nt, chunk, &lo, &hi)) project(src, w, y, hidden, k, lo, hi);
    barrier.wait();
  };
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    barrier.set_size(nt);
    std::vector<float> qf(group * dim), acc(group * dim), best(group), total(group), scores;
    int64_t lo, hi;
    for (int64_t l = 0; l < num_layers; ++l) {
      const Layer& w = layers_[l];
      // 1. the residual add of the previous MLP and the input norm (thread 0)
      // NOTE: each projection phase's queue is armed after the barrier that ended the previous
      // one (see RowQueue::arm).
      if (tid == 0) {
        add_norm(l > 0 ? dp : nullptr, w.input_norm, xp);
        prepare(xp, hidden, Needs{&w.q, &w.k, &w.v});
      }
      const int64_t hidden_chunk = chunk_for(w.q, hidden);
      queue.arm(tid, nt, q_dim + 2 * kv_dim);
      barrier.wait();
      // 2. q, k, v
      {
        const int64_t starts[4] = {0, q_dim, q_dim + kv_dim, q_dim + 2 * kv_dim};
        const Matrix* ws[3] = {&w.q, &w.k, &w.v};
        uint16_t* ys[3] = {qp, kp, vp};
        while (queue.claim(tid, nt, hidden_chunk, &lo, &hi)) {
          for (int i = 0; i < 3; ++i) {
            const int64_t a = std::max(lo, starts[i]), b = std::min(hi, starts[i + 1]);
            project(xp, *ws[i], ys[i], starts[i + 1] - starts[i], hidden, a - starts[i],
                    b - starts[i]);
          }
        }
      }
      barrier.wait();
      // 3. RoPE of q and k (rows of llama.cpp's layout mapped to rotate-half first), k and v
      // into their cache slots (thread 0)
      if (tid == 0) {
        uint16_t* kc = static_cast<uint16_t*>(k_caches[l]);
        uint16_t* vc = static_cast<uint16_t*>(v_caches[l]);
        for (int64_t s = 0; s < m; ++s) {
          if (qk_rows_interleaved_) {
            rotate_half_layout(qp + s * q_dim, heads, dim);
            rotate_half_layout(kp + s * kv_dim, kv_heads, dim);
          }
          rotary_rows(qp + s * q_dim, cos_p + s * dim, sin_p + s * dim, qp + s * q_dim, heads, dim);
          rotary_rows(kp + s * kv_dim, cos_p + s * dim, sin_p + s * dim, kp + s * kv_dim, kv_heads,
                      dim);
          std::memcpy(kc + slot_p[s] * kv_dim, kp + s * kv_dim, kv_dim * sizeof(uint16_t));
          std::memcpy(vc + slot_p[s] * kv_dim, vp + s * kv_dim, kv_dim * sizeof(uint16_t));
        }
      }
      barrier.wait();
      // 4. attention: (sequence, kv head) items shared out
      {
        const uint16_t* kc = static_cast<const uint16_t*>(k_caches[l]);
        const uint16_t* vc = static_cast<const uint16_t*>(v_caches[l]);
        share(m * kv_heads, tid, nt, &lo, &hi);
        for (int64_t item = lo; item < hi; ++item) {
          const int64_t s = item / kv_heads, g = item % kv_heads, len = len_p[s];
          for (int64_t i = 0; i < group; ++i) {
            const uint16_t* qr = qp + s * q_dim + (g * group + i) * dim;
            for (int64_t j = 0; j < dim; ++j) qf[i * dim + j] = widen(qr[j]);
            best[i] = -std::numeric_limits<float>::infinity();
            total[i] = 0.f;
          }
          std::fill(acc.begin(), acc.end(), 0.f);
          // two passes: the scores and their maximum, then the softmax weights and sum of V
          scores.resize(group * len);
          for (int64_t p = 0; p < len; ++p) {
            const int64_t slot = table_p[s * table_width + p / block_size] * block_size + p % block_size;
            const uint16_t* kr = kc + (slot * kv_heads + g) * dim;
            for (int64_t i = 0; i < group; ++i) {
              const float score = dot(&qf[i * dim], kr, dim) * scale;
              scores[i * len + p] = score;
              best[i] = std::max(best[i], score);
            }
          }
          for (int64_t p = 0; p < len; ++p) {
            const int64_t slot = table_p[s * table_width + p / block_size] * block_size + p % block_size;
            const uint16_t* vr = vc + (slot * kv_heads + g) * dim;
            for (int64_t i = 0; i < group; ++i) {
              const float e = std::exp(scores[i * len + p] - best[i]);
              total[i] += e;
              // bfloat16 weights times V, a float32 sum: as paged_attention.cpp (and torch).
              add_scaled(&acc[i * dim], round_bf16(e), vr, dim);
            }
          }
          for (int64_t i = 0; i < group; ++i) {
            uint16_t* ar = ap + s * q_dim + (g * group + i) * dim;
            const float inv = 1.f / total[i];
            for (int64_t j = 0; j < dim; ++j) ar[j] = to_bf16(acc[i * dim + j] * inv);
          }
        }
      }
      // 5. the output projection
      project_to_hidden(tid, nt, ap, q_dim, w.o, orow);
      // 6. the residual add and the post-attention norm (thread 0)
      if (tid == 0) {
        add_norm(orow, w.post_norm, xp);
        prepare(xp, hidden, Needs{&w.gate, &w.up});
      }
      const int64_t gate_chunk = chunk_for(w.gate, hidden);
      queue.arm(tid, nt, 2 * inter);
      barrier.wait();
      // 7. gate and up
      while (queue.claim(tid, nt, gate_chunk, &lo, &hi)) {
        project(xp, w.gate, gp, inter, hidden, lo, std::min(hi, inter));
        project(xp, w.up, up_p, inter, hidden, std::max(lo, inter) - inter, hi - inter);
      }
      barrier.wait();
      // 8. silu(gate) * up, each rounded (elements shared out)
      share(m * inter, tid, nt, &lo, &hi);
      for (int64_t i = lo; i < hi; ++i) {
        const float g = widen(gp[i]);
        actp[i] = to_bf16(round_bf16(g / (1.f + std::exp(-g))) * widen(up_p[i]));
      }
      // 9. the down projection
      project_to_hidden(tid, nt, actp, inter, w.down, dp);
    }
    if (tid == 0) add_norm(dp, final_norm_, op);
  }
}

}  // namespace
}  // namespace zerolayer

void* zl_decode_forward_create(int64_t num_layers, const void* const* layers,
                               const float* const* scales, const int32_t* types,
                               const uint16_t* final_norm, int64_t hidden, int64_t intermediate,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t group_size, double eps, double scale,
                               int32_t qk_rows_interleaved) {
  using namespace zerolayer;
  DecodeForward* made = nullptr;
  guarded([&] {
    ZL_CHECK((group_size > 0) == (scales != nullptr),
             "DecodeForward: int8 scales for every layer or none");
    std::vector<Layer> stack;
    for (int64_t i = 0; i < num_layers; ++i) {
      const void* const* l = layers + 9 * i;
      const float* const* s = scales != nullptr ? scales + 7 * i : nullptr;
      auto matrix = [&](int index, int scale_index) {
        const int32_t type = types != nullptr ? types[7 * i + scale_index]
                             : s != nullptr   ? kInt8
                                              : kDenseBf16;
        return Matrix{l[index], type == kInt8 && s != nullptr ? s[scale_index] : nullptr, type};
      };
      stack.push_back({static_cast<const uint16_t*>(l[0]), static_cast<const uint16_t*>(l[5]),
                       matrix(1, 0), matrix(2, 1), matrix(3, 2), matrix(4, 3), matrix(6, 4),
                       matrix(7, 5), matrix(8, 6)});
    }
    made = new DecodeForward(std::move(stack), final_norm, hidden, intermediate, num_heads,
                             num_kv_heads, head_dim, group_size, static_cast<float>(eps),
                             static_cast<float>(scale), qk_rows_interleaved != 0);
  });
  return made;
}

void zl_decode_forward_destroy(void* handle) {
  delete static_cast<zerolayer::DecodeForward*>(handle);
}

int32_t zl_decode_forward_run(void* handle, const uint16_t* h, int64_t m, void* const* k_caches,
                              void* const* v_caches, int64_t num_blocks, int64_t block_size,
                              const int64_t* slot_mapping, const int64_t* block_tables,
                              int64_t table_width, const int64_t* seq_lens, const uint16_t* cos,
                              const uint16_t* sin, uint16_t* out, int32_t num_threads,
                              int32_t max_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(num_threads >= 0, "decode_forward: num_threads must be >= 0");
    const int all = std::max<int32_t>(1, max_threads);
    const int threads = omp_in_parallel()  ? 1
                        : num_threads == 0 ? all
                                           : std::min<int32_t>(num_threads, all);
    static_cast<const DecodeForward*>(handle)->forward(h, m, k_caches, v_caches, num_blocks,
                                                       block_size, slot_mapping, block_tables,
                                                       table_width, seq_lens, cos, sin, out,
                                                       threads);
  });
}
