// The fused decode step of a standard Llama layer stack (csrc/decode_forward.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace zerolayer {

class DecodeForward {
 public:
  // layers: per layer [input_norm [H], q [Hq*D, H], k [Hkv*D, H], v [Hkv*D, H], o [H, Hq*D],
  // post_attention_norm [H], gate [I, H], up [I, H], down [H, I]], matrices contiguous bfloat16
  // or int8 (held, not copied), norms bfloat16 or float32 (rounded to bfloat16 copies).
  // scales: empty for bfloat16 matrices; for int8 ones (zerolayer quantize), per layer the
  // float32 [N, K / G] scales of q, k, v, o, gate, up, down (one group size G).
  DecodeForward(const std::vector<std::vector<at::Tensor>>& layers,
                const std::vector<std::vector<at::Tensor>>& scales, const at::Tensor& final_norm,
                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
                double scale);

  // One decode step of M <= kMaxSkinnyRows sequences, one token each: h [M, H] the token
  // embeddings, the per-layer caches [num_blocks, block_size, Hkv, D] (written at the slots),
  // slot_mapping [M], block_tables [M, N], seq_lens [M] (int64; after this step), cos and sin
  // [M, 1, D] bfloat16; num_threads: threads of the step's region, at most torch's count (0: all).
  // Returns the final-norm hidden states [M, H] in bfloat16.
  at::Tensor forward(const at::Tensor& h, const std::vector<at::Tensor>& k_caches,
                     const std::vector<at::Tensor>& v_caches, const at::Tensor& slot_mapping,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& cos, const at::Tensor& sin, int64_t num_threads) const;

 private:
  struct Layer {
    at::Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
    at::Tensor scales[7];  // int8: of q, k, v, o, gate, up, down
  };
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  int64_t hidden_ = 0, intermediate_ = 0;
  int64_t group_size_ = 0;  // int8 group size; 0 for bfloat16 matrices
  int64_t num_heads_, num_kv_heads_, head_dim_;
  float eps_, scale_;
};

}  // namespace zerolayer
