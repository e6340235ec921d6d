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
// Vectors are GCC/Clang vector extensions rather than intrinsics (paged_attention_tile.h), of 16
// floats for AVX-512 and of 8 for AVX2 and the baseline; the tile kernel is compiled for AVX-512
// (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline and the best one under the build's cap is
// picked at load time (cpu_has), so the build needs no -march flag and the cached library is safe
// to run on another CPU; zl_paged_attention also takes a path by name (tests).
//
// Python reference this is tested against: zerolayer/scheduler/model/attention.py.

#include "api.h"
#include "cpu_features.h"
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

constexpr int64_t kMaxLanes = 16;  // most floats per vector (and keys per chunk) of a width
constexpr int64_t kQueriesPerTile = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
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
        prob(kQueriesPerTile * p.group * kMaxLanes),
        alpha(kQueriesPerTile * p.group),
        m(kQueriesPerTile * p.group),
        l(kQueriesPerTile * p.group) {}
  std::vector<float> q;  // [rows, D] queries, kernel layout, times the softmax scale
  std::vector<float> acc;  // [rows, D] unnormalised outputs, kernel layout
  std::vector<float> prob;  // [rows, kLanes] the chunk's scores, then their exp(score - max)
  std::vector<float> alpha;  // [rows] exp(old max - new max): rescales acc for this chunk
  std::vector<float> m;  // [rows] running max of the scores
  std::vector<float> l;  // [rows] running sum of exp(score - m)
};

// Row r of an item is query r / group of the tile with q head kv_head * group + r % group.
ZL_INLINE int64_t row_offset(const Problem& p, const WorkItem& w, int64_t r) {
  const int64_t token = p.query_start_loc[w.seq] + w.first_query + r / p.group;
  const int64_t head = w.kv_head * p.group + r % p.group;
  return (token * p.num_q_heads + head) * p.head_dim;
}

// The tile kernel at each vector width (paged_attention_tile.h).
namespace w16 {
#define ZL_TILE_LANES 16
#include "paged_attention_tile.h"
#undef ZL_TILE_LANES
}  // namespace w16

namespace w8 {
#define ZL_TILE_LANES 8
#include "paged_attention_tile.h"
#undef ZL_TILE_LANES
}  // namespace w8

using TileFn = void (*)(const Problem&, const WorkItem&, Scratch&);

// One work item with the kernel of width W for element type E (its vector path where the head
// dim is a multiple of the width's group).
#define ZL_TILE_KERNEL(NAME, TARGET, W, E)                                             \
  TARGET void NAME(const Problem& p, const WorkItem& w, Scratch& s) {                  \
    if (p.head_dim % W::kGroup == 0) {                                                 \
      W::attend_tile<W::E, true>(p, w, s);                                             \
    } else {                                                                           \
      W::attend_tile<W::E, false>(p, w, s);                                            \
    }                                                                                  \
  }

#if ZL_X86
ZL_TILE_KERNEL(tile_f32_avx512, ZL_TARGET_AVX512, w16, Float32)
ZL_TILE_KERNEL(tile_bf16_avx512, ZL_TARGET_AVX512, w16, BFloat16)
ZL_TILE_KERNEL(tile_f32_avx2, ZL_TARGET_AVX2, w8, Float32)
ZL_TILE_KERNEL(tile_bf16_avx2, ZL_TARGET_AVX2, w8, BFloat16)
#endif
ZL_TILE_KERNEL(tile_f32_portable, , w8, Float32)
ZL_TILE_KERNEL(tile_bf16_portable, , w8, BFloat16)
#undef ZL_TILE_KERNEL

struct Path {
  const char* name;
  bool (*usable)();
  TileFn f32, bf16;
};

// Best first.
const Path kPaths[] = {
#if ZL_X86
    {"avx512", [] { return cpu_has(CpuFeature::kAvx512); }, &tile_f32_avx512, &tile_bf16_avx512},
    {"avx2", [] { return cpu_has(CpuFeature::kAvx2Fma); }, &tile_f32_avx2, &tile_bf16_avx2},
#endif
    {"portable", [] { return true; }, &tile_f32_portable, &tile_bf16_portable},
};

// The path named isa (nullptr: the best this CPU and build run).
const Path& path_for(const char* isa) {
  for (const Path& path : kPaths) {
    if (isa == nullptr ? path.usable() : std::strcmp(path.name, isa) == 0) {
      ZL_CHECK(path.usable(), "paged_attention: ", path.name, " does not run on this CPU or build");
      return path;
    }
  }
  fail("paged_attention: unknown ISA ", isa);
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

const char* paged_attention_isa() {
  static const char* best = path_for(nullptr).name;
  return best;
}

}  // namespace zerolayer

const char* zl_paged_attention_isa(void) { return zerolayer::paged_attention_isa(); }

int32_t zl_paged_attention(int32_t dtype, const void* q, void* out, int64_t num_tokens,
                           int64_t num_q_heads, int64_t head_dim, const void* k_cache,
                           const void* v_cache, int64_t num_blocks, int64_t block_size,
                           int64_t num_kv_heads, int64_t k_block_stride, int64_t k_slot_stride,
                           int64_t k_head_stride, int64_t v_block_stride, int64_t v_slot_stride,
                           int64_t v_head_stride, const int64_t* query_start_loc,
                           const int64_t* seq_lens, int64_t batch, const int64_t* block_tables,
                           int64_t max_blocks, float scale, const char* isa,
                           int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(dtype == ZL_FLOAT32 || dtype == ZL_BFLOAT16, "q must be float32 or bfloat16");
    const Path& path = path_for(isa);
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
    const TileFn tile = dtype == ZL_FLOAT32 ? path.f32 : path.bf16;
    std::atomic<int64_t> next{0};
    parallel_for(0, num_workers, 1, num_threads, [&](int64_t, int64_t) {
      Scratch scratch(p);
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
        tile(p, items[i], scratch);
      }
    });
  });
}
