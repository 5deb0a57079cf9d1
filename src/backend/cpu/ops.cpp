#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "quant/quant.h"
#include "util/error.h"

namespace minfer::cpu {

void embed(const Tensor& table, std::span<const int32_t> tokens, float* out) {
  const int64_t n_embd = table.shape[0];
  const int64_t n_rows = table.rows();
  const size_t row_size = row_bytes(table.type, n_embd);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= n_rows)
      fail("token id ", id, " is outside the vocabulary (", n_rows, " tokens)");
    dequantize_row(table.type, table.data + size_t(id) * row_size, out + int64_t(t) * n_embd,
                   n_embd);
  }
}

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t cols,
              int group, float eps) {
  const int64_t n = group > 0 ? group : cols;
  for (int64_t g = 0; g < rows * (cols / n); ++g) {
    const float* in = x + g * n;
    float* o = out + g * n;
    double sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) sum_sq += double(in[i]) * in[i];
    const float scale = float(1.0 / std::sqrt(sum_sq / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] * scale * weight[i];
  }
}

static bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void check_matmul_weight(const Tensor& w) {
  if (!is_float_type(w.type) && !has_pad40_dot(w.type) && !can_dequantize(w.type))
    fail("tensor ", w.name, " has type ", type_traits(w.type).name,
         ", which the CPU backend cannot multiply");
  if (has_pad40_dot(w.type) && w.shape[0] % QK != 0)
    fail("tensor ", w.name, " has rows of ", w.shape[0], " elements, not a multiple of ", QK);
}

void matmul(ThreadPool& pool, const Tensor& w, const float* bias, const float* x,
            int64_t n_tokens, float* out, std::vector<BlockQ8Pad40>& scratch) {
  const int64_t n_in = w.shape[0];
  const int64_t n_out = w.rows();
  const size_t row_size = row_bytes(w.type, n_in);
  const auto weight_row = [&](int64_t r) { return w.data + size_t(r) * row_size; };
  const auto store = [&](int64_t t, int64_t r, float v) {
    out[t * n_out + r] = v + (bias ? bias[r] : 0.0f);
  };
  // Enough rows per chunk that scheduling costs little against the dot products.
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n_in * n_tokens));

  if (has_pad40_dot(w.type)) {
    const int64_t blocks = n_in / QK;
    scratch.resize(size_t(n_tokens * blocks));
    pool.parallel_for(n_tokens, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) quantize_row_pad40(x + t * n_in, &scratch[size_t(t * blocks)], n_in);
    });
    pool.parallel_for(n_out, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t t = 0; t < n_tokens; ++t)
          store(t, r, vec_dot_pad40(w.type, weight_row(r), &scratch[size_t(t * blocks)], n_in));
    }, min_rows);
  } else if (is_float_type(w.type)) {
    pool.parallel_for(n_out, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t t = 0; t < n_tokens; ++t)
          store(t, r, vec_dot_f32(w.type, weight_row(r), x + t * n_in, n_in));
    }, min_rows);
  } else {
    check_matmul_weight(w);
    pool.parallel_for(n_out, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t r = b; r < e; ++r) {
        dequantize_row(w.type, weight_row(r), row.data(), n_in);
        for (int64_t t = 0; t < n_tokens; ++t)
          store(t, r, vec_dot_f32(GgmlType::F32, row.data(), x + t * n_in, n_in));
      }
    }, min_rows);
  }
}

RopeTable rope_table(std::span<const int32_t> positions, int head_dim, float base, float freq_scale,
                     const float* freq_factors) {
  const int n_tokens = int(positions.size());
  RopeTable tab;
  tab.n_tokens = n_tokens;
  tab.half = head_dim / 2;
  tab.cos.resize(size_t(n_tokens) * tab.half);
  tab.sin.resize(size_t(n_tokens) * tab.half);
  for (int i = 0; i < tab.half; ++i) {
    double inv_freq = std::pow(double(base), -2.0 * i / head_dim) * freq_scale;
    if (freq_factors) inv_freq /= freq_factors[i];
    for (int t = 0; t < n_tokens; ++t) {
      const double angle = double(positions[size_t(t)]) * inv_freq;
      tab.cos[size_t(t) * tab.half + i] = float(std::cos(angle));
      tab.sin[size_t(t) * tab.half + i] = float(std::sin(angle));
    }
  }
  return tab;
}

void rope(float* x, int n_heads, int head_dim, const RopeTable& tab, RopeType type) {
  const int half = head_dim / 2;
  // Normal pairs neighbours (2i, 2i+1); NeoX pairs the two halves of the head (i, i + half).
  const int stride = type == RopeType::NeoX ? 1 : 2;
  const int partner = type == RopeType::NeoX ? half : 1;
  for (int t = 0; t < tab.n_tokens; ++t) {
    const float* c = &tab.cos[size_t(t) * half];
    const float* s = &tab.sin[size_t(t) * half];
    for (int h = 0; h < n_heads; ++h) {
      float* head = x + (int64_t(t) * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        float& a = head[i * stride];
        float& b = head[i * stride + partner];
        const float a0 = a, b0 = b;
        a = a0 * c[i] - b0 * s[i];
        b = a0 * s[i] + b0 * c[i];
      }
    }
  }
}

void attention(ThreadPool& pool, const float* q, const float* k_new, const float* v_new,
               int n_tokens, int pos0, int n_head, int n_head_kv, int head_dim, const KvSeqView& cache,
               float* out) {
  const int64_t kv_width = int64_t(n_head_kv) * head_dim;
  const int64_t q_width = int64_t(n_head) * head_dim;
  for (int t = 0; t < n_tokens; ++t) {
    const int64_t row = cache.row(pos0 + t) * kv_width;
    std::copy(k_new + t * kv_width, k_new + (t + 1) * kv_width, cache.k + row);
    std::copy(v_new + t * kv_width, v_new + (t + 1) * kv_width, cache.v + row);
  }
  const int group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(float(head_dim));

  pool.parallel_for(int64_t(n_tokens) * n_head, [&](int64_t b, int64_t e) {
    std::vector<float> weights(size_t(pos0 + n_tokens));
    for (int64_t job = b; job < e; ++job) {
      const int t = int(job / n_head), h = int(job % n_head);
      const int n_keys = pos0 + t + 1;  // causal: positions 0 .. pos0 + t
      const float* qh = q + t * q_width + int64_t(h) * head_dim;
      const int64_t kv_off = int64_t(h / group) * head_dim;

      float max_score = -INFINITY;
      for (int j = 0; j < n_keys; ++j) {
        const float* kj = cache.k + cache.row(j) * kv_width + kv_off;
        float dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += qh[d] * kj[d];
        weights[size_t(j)] = dot * scale;
        max_score = std::max(max_score, weights[size_t(j)]);
      }
      float sum = 0;
      for (int j = 0; j < n_keys; ++j) sum += weights[size_t(j)] = std::exp(weights[size_t(j)] - max_score);

      float* o = out + t * q_width + int64_t(h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int j = 0; j < n_keys; ++j) {
        const float* vj = cache.v + cache.row(j) * kv_width + kv_off;
        const float w = weights[size_t(j)] / sum;
        for (int d = 0; d < head_dim; ++d) o[d] += w * vj[d];
      }
    }
  });
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace minfer::cpu
