// Paged decode attention on the CPU: one query token per sequence, its keys and values read
// where they lie in the paged KV cache (no gathered copy of the context).
//
// Layout (the engine's, per layer): k_cache and v_cache are [num_blocks, block_size, kv_heads,
// head_dim], contiguous; sequence b's token at position p lives in block block_tables[b][p /
// block_size] at offset p % block_size. Query head h reads KV head h / group (grouped-query
// attention). One work item is one sequence, all its heads: each cache row (one token, every
// KV head) is read once, whole, and the sequences are shared out over torch's intra-op threads
// (where it is built with OpenMP: on Linux; elsewhere one thread).
//
// Per sequence, in the cache's dtype (float32 or float64): scores for every context token, a
// softmax over them (max subtracted), then the probability-weighted sum of the value rows. The
// sizes the course's models use are compiled as constants (the loops then unroll and vectorise
// fully); every other shape runs the same code with the sizes read at run time.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif

namespace {

struct Shape {
  int64_t head_dim, kv_heads, group, block_size;
};

// Calls visit(t, row) for each of a sequence's first `length` tokens, in order, a cache block at a
// time; `row` points at token t's row (every KV head) of `cache`.
template <typename T, typename Visit>
inline void for_each_token(const T* cache, const int64_t* table, int64_t length, int64_t block_size,
                           int64_t block, int64_t row, Visit&& visit) {
  for (int64_t j = 0, t = 0; t < length; ++j) {
    const int64_t n = std::min(block_size, length - t);
    const T* rows = cache + table[j] * block;
    if (t + n < length) {  // blocks are scattered: fetch the next one while this one is read
      const char* next = reinterpret_cast<const char*>(cache + table[j + 1] * block);
      for (int64_t byte = 0; byte < block * int64_t(sizeof(T)); byte += 64) PREFETCH(next + byte);
    }
    for (int64_t o = 0; o < n; ++o, ++t) visit(t, rows + o * row);
  }
}

// HEAD_DIM, KV_HEADS, GROUP: compile-time sizes, or 0 to read them from `shape`.
template <typename T, int HEAD_DIM, int KV_HEADS, int GROUP>
void attend_sequence(const T* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t length,
                     const Shape& shape, T scale, T* scores, T* acc, T* out) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : shape.head_dim;
  const int64_t KVH = KV_HEADS ? KV_HEADS : shape.kv_heads;
  const int64_t G = GROUP ? GROUP : shape.group;
  const int64_t H = KVH * G, row = KVH * D, block = shape.block_size * row;

  // Pass 1: scores[h][t] = q_h . k_t * scale.
  for_each_token<T>(k_cache, table, length, shape.block_size, block, row, [&](int64_t t, const T* token) {
    for (int64_t kh = 0; kh < KVH; ++kh) {
      const T* k = token + kh * D;
      for (int64_t g = 0; g < G; ++g) {
        const T* qh = q + (kh * G + g) * D;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * k[d];
        scores[(kh * G + g) * length + t] = dot * scale;
      }
    }
  });
  // Softmax of each head's row of scores.
  for (int64_t h = 0; h < H; ++h) {
    T* s = scores + h * length;
    T top = s[0];  // length >= 1 (checked)
    for (int64_t t = 1; t < length; ++t) top = std::max(top, s[t]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < length; ++t) {
      s[t] = std::exp(s[t] - top);
      sum += s[t];
    }
    const T inverse = T(1) / sum;
    for (int64_t t = 0; t < length; ++t) s[t] *= inverse;
  }
  // Pass 2: out_h = sum_t p[h][t] * v_t.
  std::fill(acc, acc + H * D, T(0));
  for_each_token<T>(v_cache, table, length, shape.block_size, block, row, [&](int64_t t, const T* token) {
    for (int64_t kh = 0; kh < KVH; ++kh) {
      const T* v = token + kh * D;
      for (int64_t g = 0; g < G; ++g) {
        const T p = scores[(kh * G + g) * length + t];
        T* a = acc + (kh * G + g) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
      }
    }
  });
  std::copy(acc, acc + H * D, out);
}

template <typename T>
using SequenceFn = void (*)(const T*, const T*, const T*, const int64_t*, int64_t, const Shape&, T, T*, T*, T*);

// (head_dim, kv_heads, group) of the shipped models: tiny-llama, its 2-way tensor-parallel shard,
// and tiny-llama-draft. Anything else: the run-time-sized instance.
template <typename T>
SequenceFn<T> pick(const Shape& s) {
  if (s.head_dim == 32 && s.kv_heads == 2 && s.group == 3) return attend_sequence<T, 32, 2, 3>;
  if (s.head_dim == 32 && s.kv_heads == 1 && s.group == 3) return attend_sequence<T, 32, 1, 3>;
  if (s.head_dim == 32 && s.kv_heads == 1 && s.group == 2) return attend_sequence<T, 32, 1, 2>;
  return attend_sequence<T, 0, 0, 0>;
}

template <typename T>
void run(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const int64_t* tables, const int64_t* lens, int64_t batch, int64_t width, const Shape& shape, double scale) {
  const SequenceFn<T> attend = pick<T>(shape);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t stride = q.size(1) * shape.head_dim;
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores, acc(stride);
    for (int64_t b = begin; b < end; ++b) {
      scores.resize(q.size(1) * lens[b]);
      attend(qp + b * stride, kp, vp, tables + b * width, lens[b], shape, static_cast<T>(scale), scores.data(),
             acc.data(), op + b * stride);
    }
  });
}

}  // namespace

// out, q: [B, heads, head_dim] (out may be a view of a larger tensor's rows, but contiguous);
// k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim]; block_tables: [B, width] int64;
// seq_lens: [B] int64, each at least 1 and covered by its row of block_tables.
void paged_decode(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64, "paged_decode: float32 or float64 only, got ", dtype);
  for (const auto* t : {&out, &q, &k_cache, &v_cache}) {
    TORCH_CHECK(t->scalar_type() == dtype && t->device().is_cpu() && t->is_contiguous(),
                "paged_decode: out, q, k_cache and v_cache must be contiguous CPU tensors of one dtype");
  }
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64 &&
                  block_tables.is_contiguous() && seq_lens.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.device().is_cpu() && seq_lens.device().is_cpu(),
              "paged_decode: block_tables [B, width] and seq_lens [B] must be contiguous int64 CPU tensors");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && out.sizes() == q.sizes(),
              "paged_decode: q [B, heads, head_dim], k_cache/v_cache [blocks, block_size, kv_heads, head_dim]");
  const int64_t batch = q.size(0), heads = q.size(1), num_blocks = k_cache.size(0), width = block_tables.size(1);
  TORCH_CHECK(k_cache.size(1) > 0 && k_cache.size(2) > 0 && q.size(2) > 0,
              "paged_decode: block_size, kv_heads and head_dim must be positive");
  const Shape shape{q.size(2), k_cache.size(2), heads / k_cache.size(2), k_cache.size(1)};
  TORCH_CHECK(k_cache.size(3) == shape.head_dim && heads % shape.kv_heads == 0,
              "paged_decode: head_dim must match and heads must be a multiple of kv_heads");
  TORCH_CHECK(block_tables.size(0) == batch && seq_lens.numel() == batch, "paged_decode: one table and length per query");
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {  // a bad table would read outside the cache: refuse it here
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= width * shape.block_size, "paged_decode: seq_lens[", b, "] = ", lens[b],
                " is not covered by its block table");
    for (int64_t j = 0; j < (lens[b] + shape.block_size - 1) / shape.block_size; ++j) {
      TORCH_CHECK(tables[b * width + j] >= 0 && tables[b * width + j] < num_blocks, "paged_decode: block_tables[", b,
                  "][", j, "] = ", tables[b * width + j], " is outside the cache's ", num_blocks, " blocks");
    }
  }
  if (dtype == torch::kFloat32) {
    run<float>(out, q, k_cache, v_cache, tables, lens, batch, width, shape, scale);
  } else {
    run<double>(out, q, k_cache, v_cache, tables, lens, batch, width, shape, scale);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "Paged decode attention over a float32/float64 KV cache (writes into out)");
}
