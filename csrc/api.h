/* The C ABI of libzerolayer_kernels.so, which Python loads with ctypes
 * (zerolayer/scheduler/model/native/library.py, whose wrappers mirror these declarations).
 *
 * Tensors are raw pointers to their first element plus sizes (and strides where a kernel reads
 * a strided view); the wrappers check dtypes, shapes and contiguity before calling and allocate
 * the outputs. What only the data can tell (a block id, a slot, a sequence length) is checked
 * here before anything is read or written. bfloat16 values are uint16_t bit patterns.
 *
 * Every function that can fail returns 0, or 1 with the reason in zl_last_error() (per thread,
 * valid until that thread's next call). num_threads: the threads of the call's parallel region,
 * torch.get_num_threads() of the caller (the library shares torch's OpenMP runtime). */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZL_EXPORT __attribute__((visibility("default")))

/* Bumped whenever a declaration below changes; the loader refuses a library of another one. */
#define ZL_ABI_VERSION 3

/* dtype codes */
#define ZL_FLOAT32 0
#define ZL_BFLOAT16 1

ZL_EXPORT int32_t zl_abi_version(void);
ZL_EXPORT const char* zl_last_error(void);
/* The build's cap on the kernels' instruction sets (ZL_ISA_CAP, cpu_features.h): "native"
 * (whatever the CPU has), "avx2" or "portable". */
ZL_EXPORT const char* zl_isa_cap(void);
/* The best level the kernels run on this CPU under that cap: "avx512", "avx2" or "portable". */
ZL_EXPORT const char* zl_isa_level(void);
/* Most rows of x the decode GEMVs (skinny and int8) take. */
ZL_EXPORT int32_t zl_max_skinny_rows(void);
/* Whether zl_skinny_linear uses AVX-512 BF16's vdpbf16ps on this CPU. */
ZL_EXPORT int32_t zl_has_bf16_dot(void);
/* The path zl_skinny_linear takes on this CPU: "avx512bf16", "avx512", "avx2" or "portable";
 * widened: the best one without vdpbf16ps. */
ZL_EXPORT const char* zl_skinny_linear_isa(int32_t widened);
/* The int8 kernel this CPU runs for groups of group_size: "avx512vnni", "avxvnni", "portable". */
ZL_EXPORT const char* zl_int8_linear_isa(int64_t group_size);

/* Causal GQA over a paged cache (paged_attention.cpp): q, out [T, Hq, D] contiguous, dtype
 * ZL_FLOAT32 or ZL_BFLOAT16 for q, out and the caches; caches [num_blocks, block_size, Hkv, D]
 * with the given strides (elements; the innermost one is 1); query_start_loc [batch + 1],
 * seq_lens [batch], block_tables [batch, max_blocks] contiguous. isa: NULL for the best path,
 * else one of zl_paged_attention_isa's answers (fails where it does not run; for tests). */
ZL_EXPORT int32_t zl_paged_attention(int32_t dtype, const void* q, void* out, int64_t num_tokens,
                                     int64_t num_q_heads, int64_t head_dim, const void* k_cache,
                                     const void* v_cache, int64_t num_blocks, int64_t block_size,
                                     int64_t num_kv_heads, int64_t k_block_stride,
                                     int64_t k_slot_stride, int64_t k_head_stride,
                                     int64_t v_block_stride, int64_t v_slot_stride,
                                     int64_t v_head_stride, const int64_t* query_start_loc,
                                     const int64_t* seq_lens, int64_t batch,
                                     const int64_t* block_tables, int64_t max_blocks, float scale,
                                     const char* isa, int32_t num_threads);
/* The path zl_paged_attention takes on this CPU: "avx512", "avx2" or "portable". */
ZL_EXPORT const char* zl_paged_attention_isa(void);

/* y [m, n] = x [m, k] @ w [n, k]^T in bfloat16, float32 accumulation (skinny_linear.cpp);
 * 1 <= m <= zl_max_skinny_rows(), k a multiple of 16. isa: NULL for the best path, else one of
 * zl_skinny_linear_isa's answers or "widened" (fails where it does not run; for tests and
 * comparisons). */
ZL_EXPORT int32_t zl_skinny_linear(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m,
                                   int64_t k, int64_t n, const char* isa, int32_t num_threads);
/* The same for `count` weights ws[i] [ns[i], k] sharing x, into ys[i] [m, ns[i]], in one
 * parallel region. */
ZL_EXPORT int32_t zl_skinny_linear_multi(const uint16_t* x, int64_t m, int64_t k, int64_t count,
                                         const uint16_t* const* ws, const int64_t* ns,
                                         uint16_t* const* ys, int32_t num_threads);

/* y [m, n] = x [m, k] @ w [n, k]^T in bfloat16 for any m, float32 accumulation (bf16_gemm.cpp);
 * k a multiple of 16, all contiguous. Fails where zl_bf16_gemm_isa() is NULL. */
ZL_EXPORT int32_t zl_bf16_gemm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m,
                               int64_t k, int64_t n, int32_t num_threads);
/* The path zl_bf16_gemm takes on this CPU ("avx2"), or NULL where it has none; the scheduler
 * takes it instead of torch's matmul where skinny_linear has no vdpbf16ps either. */
ZL_EXPORT const char* zl_bf16_gemm_isa(void);

/* y [m, n] = x [m, k] @ w [n, k]^T, x, w and y all ZL_FLOAT32 or all ZL_BFLOAT16, with a fixed
 * reduction order per output (invariant_linear.cpp); any m and k. */
ZL_EXPORT int32_t zl_invariant_linear(int32_t dtype, const void* x, const void* w, void* y,
                                      int64_t m, int64_t k, int64_t n, int32_t num_threads);

/* ys[i] [m, ns[i]] (x's dtype) = x [m, k] @ dequant(wqs[i] int8 [ns[i], k], wss[i] float32
 * [ns[i], k / group_size])^T for `count` weights (int8_linear.cpp); x ZL_FLOAT32 or
 * ZL_BFLOAT16, 1 <= m <= zl_max_skinny_rows(). isa: NULL for the best kernel, else one of
 * zl_int8_linear_isa's answers or "avx512vnni256" (fails where it does not run). */
ZL_EXPORT int32_t zl_int8_linear(int32_t x_dtype, const void* x, int64_t m, int64_t k,
                                 int64_t group_size, int64_t count, const int8_t* const* wqs,
                                 const float* const* wss, const int64_t* ns, void* const* ys,
                                 const char* isa, int32_t num_threads);

/* GGUF's tensor types (gguf_linear.cpp, gguf_dequant.cpp), by their ggml type ids: F32 0, F16 1,
 * Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14, BF16 30. A weight [n, k] is
 * n rows of k / block_size blocks, read in place. isa: NULL for the best kernels this CPU runs,
 * else "avx512vnni", "avx2" or "portable" (fails where it does not run). */
/* The kernels zl_gguf_linear takes on this CPU. */
ZL_EXPORT const char* zl_gguf_isa(void);
/* ys[i] [m, ns[i]] (x's dtype) = x [m, k] @ dequant(ws[i] of types[i] [ns[i], k])^T for `count`
 * weights sharing x, in one parallel region; x ZL_FLOAT32 or ZL_BFLOAT16, any m >= 1, k a
 * multiple of every type's block size. */
ZL_EXPORT int32_t zl_gguf_linear(int32_t x_dtype, const void* x, int64_t m, int64_t k,
                                 int64_t count, const int32_t* types, const void* const* ws,
                                 const int64_t* ns, void* const* ys, const char* isa,
                                 int32_t num_threads);
/* out [rows, k] (ZL_FLOAT32 exactly, or ZL_BFLOAT16 rounded to nearest even) = the rows of w
 * [n, k] of `type` dequantized: all n (ids NULL), else the count rows ids[0 .. count), each in
 * [0, n). */
ZL_EXPORT int32_t zl_gguf_dequantize(int32_t type, const void* w, int64_t n, int64_t k,
                                     const int64_t* ids, int64_t count, int32_t out_dtype,
                                     void* out, const char* isa, int32_t num_threads);

/* Elementwise steps in bfloat16 (elementwise.cpp), rows of n values, all contiguous; the norm
 * weight w [n] is ZL_BFLOAT16 or ZL_FLOAT32 (w_dtype). */
ZL_EXPORT int32_t zl_rms_norm(const uint16_t* x, const void* w, int32_t w_dtype, uint16_t* y,
                              int64_t rows, int64_t n, double eps, int32_t num_threads);
/* s = h + d (rounded), y = rms_norm(s). */
ZL_EXPORT int32_t zl_add_rms_norm(const uint16_t* h, const uint16_t* d, const void* w,
                                  int32_t w_dtype, uint16_t* s, uint16_t* y, int64_t rows,
                                  int64_t n, double eps, int32_t num_threads);
/* RoPE (rotate-half) of x [t, heads, dim] by cos, sin [t, dim] into y; dim even, <= 1024. */
ZL_EXPORT int32_t zl_rotary(const uint16_t* x, const uint16_t* cos, const uint16_t* sin,
                            uint16_t* y, int64_t t, int64_t heads, int64_t dim,
                            int32_t num_threads);

/* The fused decode step (decode_forward.cpp). create: per layer 9 pointers in `layers` (input
 * norm, q, k, v, o, post-attention norm, gate, up, down: norms bfloat16 [hidden], matrices
 * contiguous), and per layer 7 matrix types in `types` (q, k, v, o, gate, up, down): -1 bfloat16,
 * -2 int8 (zerolayer quantize: group_size > 0, with its float32 scales in `scales`, 7 pointers
 * per layer, NULL where a matrix is not int8), else a GGUF type id (its blocks read in place);
 * `types` NULL: every matrix int8 where `scales` is given, else bfloat16. final_norm bfloat16
 * [hidden]. qk_rows_interleaved: q and k rows in llama.cpp's interleaved rotary layout (a GGUF
 * llama file), mapped to rotate-half after the matmul. The memory stays the caller's and must
 * outlive the handle. Returns NULL on failure. */
ZL_EXPORT void* zl_decode_forward_create(int64_t num_layers, const void* const* layers,
                                         const float* const* scales, const int32_t* types,
                                         const uint16_t* final_norm, int64_t hidden,
                                         int64_t intermediate, int64_t num_heads,
                                         int64_t num_kv_heads, int64_t head_dim,
                                         int64_t group_size, double eps, double scale,
                                         int32_t qk_rows_interleaved);
ZL_EXPORT void zl_decode_forward_destroy(void* handle);
/* One step of m sequences: h [m, hidden] bfloat16; per layer k_caches[l], v_caches[l] bfloat16
 * [num_blocks, block_size, Hkv, D] contiguous (written at the slots); slot_mapping [m],
 * seq_lens [m], block_tables [m, table_width] int64; cos, sin [m, D] bfloat16; out [m, hidden].
 * num_threads: 0 for max_threads, else at most max_threads are used. */
ZL_EXPORT int32_t zl_decode_forward_run(void* handle, const uint16_t* h, int64_t m,
                                        void* const* k_caches, void* const* v_caches,
                                        int64_t num_blocks, int64_t block_size,
                                        const int64_t* slot_mapping, const int64_t* block_tables,
                                        int64_t table_width, const int64_t* seq_lens,
                                        const uint16_t* cos, const uint16_t* sin, uint16_t* out,
                                        int32_t num_threads, int32_t max_threads);

#ifdef __cplusplus
}
#endif
