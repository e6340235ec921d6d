// Causal grouped-query attention over a paged KV cache, on the CPU (float32 and bfloat16).
//
// Every sequence of the step (decodes and prefill chunks alike) attends over its context by reading
// K and V straight from the cache blocks its block table names (Kwon et al. 2023, "PagedAttention");
// no contiguous copy of a context is ever made. Scores go through an online softmax (Milakov &
// Gimelshein 2018; Dao et al. 2022, "FlashAttention"): a running max and sum per query row, so the
// state is O(head_dim) per (query, head) whatever the context length. In bfloat16 the weights
// are rounded to bfloat16 as they multiply V and summed in float32 for the normaliser, as torch's
// scaled_dot_product_attention (what transformers runs) and FlashAttention do.
//
// Work is split into items (sequence, kv head, tile of up to kQueriesPerTile queries). An item's rows
// are its queries times the q heads sharing that kv head, so all of them use each 16-key chunk of
// K/V while it sits in L1; chunks are prefetched a few ahead since blocks are scattered. Items are
// sorted by cost and handed out through an atomic counter, since causal prefill tiles differ a lot
// in length. Each output row is computed by one thread in a fixed order, so results do not depend
// on the thread count.
//
// Vectors are GCC/Clang vector extensions of 16 floats rather than intrinsics, and the hot
// functions are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and baseline with the right one
// picked at load time (target_clones), so the build needs no -march flag and the cached library is
// safe to run on another CPU.
//
// Python reference this is tested against: zerolayer/scheduler/model/attention.py.

#include "api.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#define ZL_INLINE inline __attribute__((always_inline))

#if defined(__clang__)
#define ZL_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ZL_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, VecI{__VA_ARGS__})
#endif

namespace zerolayer {
namespace {

constexpr int64_t kLanes = 16;  // floats per vector, and keys per chunk
constexpr int64_t kGroup = 2 * kLanes;  // head-dim elements per step of the vector path
constexpr int64_t kQueriesPerTile = 16;
constexpr int kMaxBlockRows = 8;  // rows whose accumulators stay in registers together
constexpr int64_t kAhead = 3;  // chunks whose rows are requested before they are used
constexpr int64_t kRing = kAhead + 1;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef float VecF __attribute__((vector_size(64)));
typedef int32_t VecI __attribute__((vector_size(64)));

ZL_INLINE VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

ZL_INLINE void store(float* p, VecF v) {
  std::memcpy(p, &v, sizeof(v));
}

ZL_INLINE VecF max(VecF a, VecF b) {
  return a > b ? a : b;
}

ZL_INLINE float max_lanes(VecF v) {
  v = max(v, ZL_SHUFFLE(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = max(v, ZL_SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = max(v, ZL_SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  v = max(v, ZL_SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return v[0];
}

ZL_INLINE float sum_lanes(VecF v) {
  v += ZL_SHUFFLE(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += ZL_SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += ZL_SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += ZL_SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// out[j] = sum of the lanes of x[j], for 16 vectors, by pairwise transposition.
ZL_INLINE VecF sum_lanes_16(const VecF* x) {
  VecF a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {
    a[i] = ZL_SHUFFLE(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        ZL_SHUFFLE(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    b[i] = ZL_SHUFFLE(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
        ZL_SHUFFLE(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = ZL_SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
        ZL_SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return ZL_SHUFFLE(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
      ZL_SHUFFLE(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// exp(x) for x <= 0, -inf included (Cephes expf polynomial, relative error ~1e-7).
ZL_INLINE VecF exp_nonpositive(VecF x) {
  const VecF lowest = VecF{} - 87.33654f;
  const VecI underflow = x < lowest;
  x = underflow ? lowest : x;
  const VecF magic = VecF{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VecF n = (x * 1.44269504f + magic) - magic;
  const VecF r = x - n * 0.693359375f + n * 2.12194440e-4f;
  VecF p = VecF{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const VecI two_n = (__builtin_convertvector(n, VecI) + 127) << 23;
  return underflow ? VecF{} : p * (VecF)two_n;
}

// Element types of q and the caches: how they widen to float32 and the output narrows back.
//
// The vector path (head_dim % 32 == 0) reads K and V rows straight from the cache 32 elements at
// a time as two float vectors (load_group). For bfloat16 those are the 16 even-indexed then the
// 16 odd-indexed elements of the group: a 32-bit lane holding two bf16 widens to both with one
// shift and one mask. q rows and the accumulators use the same permuted "kernel layout", so dot
// products and sums are unchanged, and the output is permuted back (layout_index).
struct Float32 {
  using T = float;
  static ZL_INLINE float to_float(float x) {
    return x;
  }
  static ZL_INLINE float from_float(float x) {
    return x;
  }
  static ZL_INLINE void load_group(const float* src, VecF& first, VecF& second) {
    first = load(src);
    second = load(src + kLanes);
  }
  // Position of element i of a row in the kernel layout.
  static ZL_INLINE int64_t layout_index(int64_t i) {
    return i;
  }
  // The softmax weights as they multiply V (see BFloat16::value_weights).
  static ZL_INLINE VecF value_weights(VecF prob) {
    return prob;
  }
};

struct BFloat16 {
  using T = uint16_t;
  static ZL_INLINE float to_float(uint16_t x) {
    uint32_t bits = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  // Round to nearest even, as c10::BFloat16 does.
  static ZL_INLINE uint16_t from_float(float f) {
    if (std::isnan(f)) {
      return 0x7fc0;
    }
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bits += 0x7fff + ((bits >> 16) & 1);
    return static_cast<uint16_t>(bits >> 16);
  }
  static ZL_INLINE void load_group(const uint16_t* src, VecF& even, VecF& odd) {
    VecI pairs;
    std::memcpy(&pairs, src, sizeof(pairs));
    even = (VecF)(pairs << 16);
    odd = (VecF)(pairs & static_cast<int32_t>(0xffff0000u));
  }
  static ZL_INLINE int64_t layout_index(int64_t i) {
    const int64_t r = i % kGroup;
    return i - r + (r & 1) * kLanes + (r >> 1);
  }
  // The softmax weights rounded to bfloat16 (to nearest even) before they multiply V, while
  // their sum (the normaliser) adds the float32 values: what torch's CPU
  // scaled_dot_product_attention does for bfloat16 (transformers' attention), as FlashAttention
  // and the Triton kernel (triton_attention_kernel.py) do. With float32 weights here, about a
  // quarter of the outputs differed from torch's by a bfloat16 ulp, and greedy tokens of bfloat16
  // models parted from transformers' at near-ties (issue 29). Weights lie in [0, 1]: no sign,
  // infinity or NaN to care for.
  static ZL_INLINE VecF value_weights(VecF prob) {
    VecI bits = (VecI)prob;
    bits += 0x7fff + ((bits >> 16) & 1);
    return (VecF)(bits & static_cast<int32_t>(0xffff0000u));
  }
};

// Scores of one query row (kernel layout, pre-scaled) against the 16 keys of a chunk.
template <class E>
ZL_INLINE VecF chunk_scores(const float* q, const typename E::T* const* k, int64_t d) {
  VecF acc[kLanes] = {};
  for (int64_t g = 0; g < d; g += kGroup) {
    const VecF q0 = load(q + g);
    const VecF q1 = load(q + g + kLanes);
#pragma GCC unroll 16
    for (int j = 0; j < kLanes; ++j) {
      VecF k0, k1;
      E::load_group(k[j] + g, k0, k1);
      acc[j] += q0 * k0;
      acc[j] += q1 * k1;
    }
  }
  return sum_lanes_16(acc);
}

// acc[r] = acc[r] * alpha[r] + sum_j prob[r][j] * v[j] for kRows consecutive rows, whose
// accumulators stay in registers while each value row is loaded (and widened) once.
template <class E, int kRows>
ZL_INLINE void accumulate_values(
    float* acc,
    const float* prob,
    const float* alpha,
    const typename E::T* const* v,
    int64_t n,
    int64_t d) {
  for (int64_t g = 0; g < d; g += kGroup) {
    VecF a0[kRows], a1[kRows];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      a0[r] = load(acc + r * d + g) * alpha[r];
      a1[r] = load(acc + r * d + g + kLanes) * alpha[r];
    }
    for (int64_t j = 0; j < n; ++j) {
      VecF v0, v1;
      E::load_group(v[j] + g, v0, v1);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const float p = prob[r * kLanes + j];
        a0[r] += p * v0;
        a1[r] += p * v1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      store(acc + r * d + g, a0[r]);
      store(acc + r * d + g + kLanes, a1[r]);
    }
  }
}

template <class E>
ZL_INLINE void accumulate_value_rows(
    float* acc,
    const float* prob,
    const float* alpha,
    const typename E::T* const* v,
    int64_t n,
    int64_t d,
    int64_t num_rows) {
  for (int64_t r = 0; r < num_rows; r += kMaxBlockRows) {
    float* a = acc + r * d;
    const float* p = prob + r * kLanes;
    switch (std::min<int64_t>(kMaxBlockRows, num_rows - r)) {
      case 1: accumulate_values<E, 1>(a, p, alpha + r, v, n, d); break;
      case 2: accumulate_values<E, 2>(a, p, alpha + r, v, n, d); break;
      case 3: accumulate_values<E, 3>(a, p, alpha + r, v, n, d); break;
      case 4: accumulate_values<E, 4>(a, p, alpha + r, v, n, d); break;
      case 5: accumulate_values<E, 5>(a, p, alpha + r, v, n, d); break;
      case 6: accumulate_values<E, 6>(a, p, alpha + r, v, n, d); break;
      case 7: accumulate_values<E, 7>(a, p, alpha + r, v, n, d); break;
      default: accumulate_values<E, 8>(a, p, alpha + r, v, n, d); break;
    }
  }
}

// The same for head dims that are not a multiple of 32: plain loops, identity layout.
template <class E>
ZL_INLINE VecF chunk_scores_scalar(const float* q, const typename E::T* const* k, int64_t d) {
  VecF s;
  for (int j = 0; j < kLanes; ++j) {
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      sum += q[i] * E::to_float(k[j][i]);
    }
    s[j] = sum;
  }
  return s;
}

template <class E>
ZL_INLINE void accumulate_value_rows_scalar(
    float* acc,
    const float* prob,
    const float* alpha,
    const typename E::T* const* v,
    int64_t n,
    int64_t d,
    int64_t num_rows) {
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      float a = acc[r * d + i] * alpha[r];
      for (int64_t j = 0; j < n; ++j) {
        a += prob[r * kLanes + j] * E::to_float(v[j][i]);
      }
      acc[r * d + i] = a;
    }
  }
}

struct Problem {
  const void* q;  // [T, Hq, D], contiguous
  void* out;  // [T, Hq, D], contiguous
  const void* k_cache;  // [num_blocks, block_size, Hkv, D], innermost dim contiguous
  const void* v_cache;
  int64_t k_strides[3];  // elements between blocks, slots, heads
  int64_t v_strides[3];
  const int64_t* query_start_loc;  // [B + 1]
  const int64_t* seq_lens;  // [B]
  const int64_t* block_tables;  // [B, max_blocks], contiguous
  int64_t max_blocks;
  int64_t block_size;
  int64_t num_q_heads;
  int64_t group;  // q heads per kv head
  int64_t head_dim;
  float scale;
};

struct WorkItem {
  int64_t seq;
  int64_t kv_head;
  int64_t first_query;  // within the sequence's queries
  int64_t num_queries;
  int64_t cost;  // rows * keys, for ordering
};

// One thread's buffers, sized for the largest tile: O(rows * head_dim), whatever the context.
struct Scratch {
  explicit Scratch(const Problem& p)
      : q(kQueriesPerTile * p.group * p.head_dim),
        acc(kQueriesPerTile * p.group * p.head_dim),
        prob(kQueriesPerTile * p.group * kLanes),
        alpha(kQueriesPerTile * p.group),
        m(kQueriesPerTile * p.group),
        l(kQueriesPerTile * p.group) {}
  std::vector<float> q;  // [rows, D] queries, kernel layout, times the softmax scale
  std::vector<float> acc;  // [rows, D] unnormalised outputs, kernel layout
  std::vector<float> prob;  // [rows, 16] the chunk's scores, then their exp(score - max)
  std::vector<float> alpha;  // [rows] exp(old max - new max): rescales acc for this chunk
  std::vector<float> m;  // [rows] running max of the scores
  std::vector<float> l;  // [rows] running sum of exp(score - m)
};

// Cache rows of K and V of the keys at positions [start, start + n) of a sequence.
template <typename T>
ZL_INLINE void locate_keys(
    const Problem& p,
    const int64_t* table,
    int64_t kv_head,
    int64_t start,
    int64_t n,
    const T** k_rows,
    const T** v_rows) {
  const T* k_cache = static_cast<const T*>(p.k_cache) + kv_head * p.k_strides[2];
  const T* v_cache = static_cast<const T*>(p.v_cache) + kv_head * p.v_strides[2];
  int64_t block_index = start / p.block_size;
  int64_t slot = start - block_index * p.block_size;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t block = table[block_index];
    k_rows[j] = k_cache + block * p.k_strides[0] + slot * p.k_strides[1];
    v_rows[j] = v_cache + block * p.v_strides[0] + slot * p.v_strides[1];
    if (++slot == p.block_size) {
      slot = 0;
      ++block_index;
    }
  }
  // Lanes past the last key read a real row too; their scores are masked out.
  for (int64_t j = n; j < kLanes; ++j) {
    k_rows[j] = k_rows[0];
    v_rows[j] = v_rows[0];
  }
}

// Locates chunk c (keys [16c, 16c + 16)) and asks for its rows: a chunk's keys sit in scattered
// blocks, which the hardware prefetcher does not follow. The hint is "into L2" (locality 1): asking
// for a whole chunk into L1 fills the L1 miss buffers and measured no faster than no prefetch.
template <typename T>
ZL_INLINE void fetch_chunk(
    const Problem& p,
    const int64_t* table,
    int64_t kv_head,
    int64_t c,
    int64_t num_keys,
    int64_t row_bytes,
    const T** k_rows,
    const T** v_rows) {
  const int64_t n = std::min(kLanes, num_keys - c * kLanes);
  locate_keys(p, table, kv_head, c * kLanes, n, k_rows, v_rows);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t offset = 0; offset < row_bytes; offset += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(k_rows[j]) + offset, 0, 1);
      __builtin_prefetch(reinterpret_cast<const char*>(v_rows[j]) + offset, 0, 1);
    }
  }
}

// Row r of an item is query r / group of the tile with q head kv_head * group + r % group.
ZL_INLINE int64_t row_offset(const Problem& p, const WorkItem& w, int64_t r) {
  const int64_t token = p.query_start_loc[w.seq] + w.first_query + r / p.group;
  const int64_t head = w.kv_head * p.group + r % p.group;
  return (token * p.num_q_heads + head) * p.head_dim;
}

template <class E, bool kVec>
ZL_INLINE void start_rows(const Problem& p, const WorkItem& w, Scratch& s) {
  const int64_t d = p.head_dim;
  const auto* q = static_cast<const typename E::T*>(p.q);
  for (int64_t r = 0; r < w.num_queries * p.group; ++r) {
    const auto* src = q + row_offset(p, w, r);
    for (int64_t i = 0; i < d; ++i) {
      s.q[r * d + (kVec ? E::layout_index(i) : i)] = E::to_float(src[i]) * p.scale;
    }
    std::fill_n(s.acc.data() + r * d, d, 0.0f);
    s.m[r] = kNegInf;
    s.l[r] = 0.0f;
  }
}

// Online softmax over one chunk: scores in s.prob become probabilities relative to the new
// running max (as they multiply V: E::value_weights), alpha rescales what was accumulated under
// the old one.
template <class E>
ZL_INLINE void update_softmax(Scratch& s, int64_t first_row, int64_t rows) {
  for (int64_t r = first_row; r < rows; ++r) {
    const VecF scores = load(s.prob.data() + r * kLanes);
    // Finite: the first chunk holds key 0, which every query sees.
    const float new_max = std::max(s.m[r], max_lanes(scores));
    const VecF prob = exp_nonpositive(scores - new_max);
    const float alpha = new_max == s.m[r] ? 1.0f : std::exp(s.m[r] - new_max);
    store(s.prob.data() + r * kLanes, E::value_weights(prob));
    s.alpha[r] = alpha;
    s.l[r] = s.l[r] * alpha + sum_lanes(prob);
    s.m[r] = new_max;
  }
}

template <class E, bool kVec>
ZL_INLINE void finish_rows(const Problem& p, const WorkItem& w, const Scratch& s) {
  const int64_t d = p.head_dim;
  auto* out = static_cast<typename E::T*>(p.out);
  for (int64_t r = 0; r < w.num_queries * p.group; ++r) {
    auto* dst = out + row_offset(p, w, r);
    const float inv = 1.0f / s.l[r];
    for (int64_t i = 0; i < d; ++i) {
      dst[i] = E::from_float(s.acc[r * d + (kVec ? E::layout_index(i) : i)] * inv);
    }
  }
}

// One work item: the rows (query, q head) of a query tile against all keys they see.
template <class E, bool kVec>
ZL_INLINE void attend_tile(const Problem& p, const WorkItem& w, Scratch& s) {
  using T = typename E::T;
  const int64_t d = p.head_dim;
  const int64_t rows = w.num_queries * p.group;
  const int64_t num_seq_queries = p.query_start_loc[w.seq + 1] - p.query_start_loc[w.seq];
  // Query i of the sequence sits at absolute position seq_len - num_queries + i.
  const int64_t first_pos = p.seq_lens[w.seq] - num_seq_queries + w.first_query;
  const int64_t num_keys = first_pos + w.num_queries;
  const int64_t* table = p.block_tables + w.seq * p.max_blocks;
  const int64_t row_bytes = d * static_cast<int64_t>(sizeof(T));
  start_rows<E, kVec>(p, w, s);

  const VecI lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  // Rows of the chunks located so far, by chunk index modulo kRing.
  const T* k_ring[kRing][kLanes];
  const T* v_ring[kRing][kLanes];
  const int64_t num_chunks = (num_keys + kLanes - 1) / kLanes;
  for (int64_t c = 0; c < std::min(kAhead, num_chunks); ++c) {
    fetch_chunk(p, table, w.kv_head, c, num_keys, row_bytes, k_ring[c % kRing], v_ring[c % kRing]);
  }
  for (int64_t c = 0; c < num_chunks; ++c) {
    if (c + kAhead < num_chunks) {
      const int64_t slot = (c + kAhead) % kRing;
      fetch_chunk(p, table, w.kv_head, c + kAhead, num_keys, row_bytes, k_ring[slot], v_ring[slot]);
    }
    const T* const* k_rows = k_ring[c % kRing];
    const T* const* v_rows = v_ring[c % kRing];
    const int64_t start = c * kLanes;
    const int64_t n = std::min(kLanes, num_keys - start);
    // Queries before `start` see nothing of this chunk; the later ones form a suffix of rows.
    const int64_t first = std::max<int64_t>(0, start - first_pos) * p.group;
    // All scores first, then the softmax updates: rows are independent, so splitting the two
    // lets the core overlap one row's reductions and exp with the next row's.
    for (int64_t r = first; r < rows; ++r) {
      const int64_t pos = first_pos + r / p.group;
      const int32_t visible = static_cast<int32_t>(std::min(n, pos - start + 1));
      const VecF scores = kVec ? chunk_scores<E>(s.q.data() + r * d, k_rows, d)
                               : chunk_scores_scalar<E>(s.q.data() + r * d, k_rows, d);
      store(s.prob.data() + r * kLanes, lane < visible ? scores : VecF{} + kNegInf);
    }
    update_softmax<E>(s, first, rows);
    float* acc = s.acc.data() + first * d;
    const float* prob = s.prob.data() + first * kLanes;
    const float* alpha = s.alpha.data() + first;
    if constexpr (kVec) {
      accumulate_value_rows<E>(acc, prob, alpha, v_rows, n, d, rows - first);
    } else {
      accumulate_value_rows_scalar<E>(acc, prob, alpha, v_rows, n, d, rows - first);
    }
  }
  finish_rows<E, kVec>(p, w, s);
}

ZL_MULTIVERSION void attend_tile_f32(const Problem& p, const WorkItem& w, Scratch& s) {
  if (p.head_dim % kGroup == 0) {
    attend_tile<Float32, true>(p, w, s);
  } else {
    attend_tile<Float32, false>(p, w, s);
  }
}

ZL_MULTIVERSION void attend_tile_bf16(const Problem& p, const WorkItem& w, Scratch& s) {
  if (p.head_dim % kGroup == 0) {
    attend_tile<BFloat16, true>(p, w, s);
  } else {
    attend_tile<BFloat16, false>(p, w, s);
  }
}

// Checks the step's layout against the cache so that no read can leave it.
void check_layout(const Problem& p, int64_t batch, int64_t num_tokens, int64_t num_blocks) {
  const int64_t* qsl = p.query_start_loc;
  ZL_CHECK(qsl[0] == 0 && qsl[batch] == num_tokens, "query_start_loc must run from 0 to T");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t num_queries = qsl[b + 1] - qsl[b];
    ZL_CHECK(num_queries >= 0, "query_start_loc must not decrease (sequence ", b, ")");
    ZL_CHECK(p.seq_lens[b] >= num_queries, "seq_lens[", b,
             "] is smaller than its number of queries");
    if (num_queries == 0) {
      continue;
    }
    const int64_t used = (p.seq_lens[b] + p.block_size - 1) / p.block_size;
    ZL_CHECK(used <= p.max_blocks, "block_tables row ", b, " is too short for seq_lens[", b, "]");
    for (int64_t i = 0; i < used; ++i) {
      const int64_t block = p.block_tables[b * p.max_blocks + i];
      ZL_CHECK(block >= 0 && block < num_blocks, "block_tables[", b, ", ", i, "] = ", block,
               " is not a block of the cache");
    }
  }
}

std::vector<WorkItem> make_work(const Problem& p, int64_t batch, int64_t num_kv_heads) {
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t num_queries = p.query_start_loc[b + 1] - p.query_start_loc[b];
    for (int64_t first = 0; first < num_queries; first += kQueriesPerTile) {
      const int64_t count = std::min(kQueriesPerTile, num_queries - first);
      const int64_t num_keys = p.seq_lens[b] - num_queries + first + count;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        items.push_back({b, h, first, count, count * p.group * num_keys});
      }
    }
  }
  // Longest first, then greedy: the threads finish close together.
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
    return a.cost > b.cost;
  });
  return items;
}

}  // namespace
}  // namespace zerolayer

int32_t zl_paged_attention(int32_t dtype, const void* q, void* out, int64_t num_tokens,
                           int64_t num_q_heads, int64_t head_dim, const void* k_cache,
                           const void* v_cache, int64_t num_blocks, int64_t block_size,
                           int64_t num_kv_heads, int64_t k_block_stride, int64_t k_slot_stride,
                           int64_t k_head_stride, int64_t v_block_stride, int64_t v_slot_stride,
                           int64_t v_head_stride, const int64_t* query_start_loc,
                           const int64_t* seq_lens, int64_t batch, const int64_t* block_tables,
                           int64_t max_blocks, float scale, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(dtype == ZL_FLOAT32 || dtype == ZL_BFLOAT16, "q must be float32 or bfloat16");
    ZL_CHECK(block_size > 0, "block_size must be positive");
    ZL_CHECK(num_kv_heads > 0 && num_q_heads % num_kv_heads == 0,
             "the number of q heads must be a multiple of the number of kv heads");
    ZL_CHECK(head_dim > 0, "head_dim must be positive");
    Problem p{};
    p.q = q;
    p.out = out;
    p.k_cache = k_cache;
    p.v_cache = v_cache;
    p.k_strides[0] = k_block_stride;
    p.k_strides[1] = k_slot_stride;
    p.k_strides[2] = k_head_stride;
    p.v_strides[0] = v_block_stride;
    p.v_strides[1] = v_slot_stride;
    p.v_strides[2] = v_head_stride;
    p.query_start_loc = query_start_loc;
    p.seq_lens = seq_lens;
    p.block_tables = block_tables;
    p.max_blocks = max_blocks;
    p.block_size = block_size;
    p.num_q_heads = num_q_heads;
    p.group = num_q_heads / num_kv_heads;
    p.head_dim = head_dim;
    p.scale = scale;
    check_layout(p, batch, num_tokens, num_blocks);
    if (num_tokens == 0) {
      return;
    }
    const std::vector<WorkItem> items = make_work(p, batch, num_kv_heads);
    const int64_t num_items = static_cast<int64_t>(items.size());
    const int64_t num_workers = std::min<int64_t>(num_threads, num_items);
    auto* tile = dtype == ZL_FLOAT32 ? &attend_tile_f32 : &attend_tile_bf16;
    std::atomic<int64_t> next{0};
    parallel_for(0, num_workers, 1, num_threads, [&](int64_t, int64_t) {
      Scratch scratch(p);
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
        tile(p, items[i], scratch);
      }
    });
  });
}
