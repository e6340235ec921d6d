// The vector part of paged_attention.cpp's tile kernel, for vectors of ZL_TILE_LANES floats: 16
// (AVX-512's registers) or 8 (AVX2's). paged_attention.cpp includes this file once per width,
// each time in a namespace of its own after Problem, WorkItem, Scratch and row_offset (so it has
// no include guard, on purpose).
//
// Why two widths: GCC's vector extensions wider than the target's registers are not split into
// registers but kept on the stack, every operation a store and reloads. Compiled for AVX2, the
// 16-float kernel ran 10-25x slower than for AVX-512 (the `small` preset's attention, 1 thread:
// decode at context 256 0.30 against 0.03 ms, a 512-token prefill 137-292 against 16-20 ms);
// with 8-float vectors each is one AVX2 register. The width is also the number of keys per chunk
// (their scores are one vector).

constexpr int64_t kLanes = ZL_TILE_LANES;  // floats per vector, and keys per chunk
constexpr int64_t kGroup = 2 * kLanes;  // head-dim elements per step of the vector path
// rows whose accumulators (2 vectors each) stay in registers together: 32 or 16 registers
constexpr int kMaxBlockRows = kLanes == 16 ? 8 : 6;
constexpr int64_t kAhead = 48 / kLanes;  // chunks whose rows are requested before they are used
constexpr int64_t kRing = kAhead + 1;
static_assert(kLanes <= kMaxLanes, "Scratch holds kMaxLanes scores per row");

typedef float VecF __attribute__((vector_size(4 * kLanes)));
typedef int32_t VecI __attribute__((vector_size(4 * kLanes)));

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

#if ZL_TILE_LANES == 16
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

// out[j] = sum of the lanes of x[j], for kLanes vectors, by pairwise transposition.
ZL_INLINE VecF sum_lanes_chunk(const VecF* x) {
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

#else
ZL_INLINE float max_lanes(VecF v) {
  v = max(v, ZL_SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
  v = max(v, ZL_SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
  v = max(v, ZL_SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  return v[0];
}

ZL_INLINE float sum_lanes(VecF v) {
  v += ZL_SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v += ZL_SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
  v += ZL_SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  return v[0];
}

// out[j] = sum of the lanes of x[j], for kLanes vectors, by pairwise transposition.
ZL_INLINE VecF sum_lanes_chunk(const VecF* x) {
  VecF b[4], c[2];
  for (int i = 0; i < 4; ++i) {
    b[i] = ZL_SHUFFLE(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
        ZL_SHUFFLE(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = ZL_SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
        ZL_SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  // lanes: the sums of vectors 0, 4, 2, 6, 1, 5, 3, 7
  const VecF d = ZL_SHUFFLE(c[0], c[1], 0, 8, 2, 10, 4, 12, 6, 14) +
      ZL_SHUFFLE(c[0], c[1], 1, 9, 3, 11, 5, 13, 7, 15);
  return ZL_SHUFFLE(d, d, 0, 4, 2, 6, 1, 5, 3, 7);
}

#endif

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
// The vector path (head_dim % kGroup == 0) reads K and V rows straight from the cache kGroup
// elements at a time as two float vectors (load_group). For bfloat16 those are the kLanes
// even-indexed then the kLanes odd-indexed elements of the group: a 32-bit lane holding two bf16
// widens to both with one shift and one mask. q rows and the accumulators use the same permuted
// "kernel layout", so dot products and sums are unchanged, and the output is permuted back
// (layout_index).
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

// Scores of one query row (kernel layout, pre-scaled) against the kLanes keys of a chunk.
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
  return sum_lanes_chunk(acc);
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

// The same for head dims that are not a multiple of kGroup: plain loops, identity layout.
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

// Locates chunk c (keys [c * kLanes, (c + 1) * kLanes)) and asks for its rows: a chunk's keys
// sit in scattered blocks, which the hardware prefetcher does not follow. The hint is "into L2"
// (locality 1): asking for a whole chunk into L1 fills the L1 miss buffers and measured no
// faster than no prefetch.
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

  VecI lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
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
