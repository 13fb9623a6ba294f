// The lean decoder's ops (lean_ops.Ops) as float32 CPU kernels, built by cpu_kernels.py. The linears run over a
// copy of each weight packed at load (pack_linear), each panel streamed once a call. The norms, rotary and SwiGLU
// are fused, each reading its input once and writing its output once: torch's F.rms_norm is eight ops on the CPU
// (pow, sum, div, add, rsqrt, two muls, a copy), each a pass over an activation that a layer's weights have pushed
// out of L2 by then (scripts/cold_reads.py). Rows are independent, so a row's result does not depend on the batch or
// on the threads (a request decoded among others gets the tokens it gets alone). Attention runs each segment's KV
// heads as tasks of small matmuls on the linears' tiles. logit_stats does the maths over a forward's logits that the
// proposals and the verdicts read. tests/common/test_cpu_kernels.py checks each kernel against its torch form.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
// Lane by lane, for ATen's reductions (vec_reduce_all over a vector, reduce_all over an array).
const auto vec_add = [](Vec& a, Vec& b) { return a + b; };
const auto vec_max = [](Vec& a, Vec& b) { return at::vec::maximum(a, b); };
constexpr int64_t kMaxHeadDim = 1024;

// 1 / sqrt(mean(r^2) + eps) over one row of D, as RMSNorm normalises it (the sum in its own order: within float
// rounding of torch's, not bit for bit).
float inv_rms(const float* r, int64_t d, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < d; ++j) sum += r[j] * r[j];
  return 1.f / std::sqrt(sum / d + eps);
}

// f(i) for i in [0, n) on the calling thread's OpenMP team (its torch intra-op threads), inline where n <= grain.
// Not at::parallel_for: an extension holds its own copy of ATen's once-per-thread flag, so its first call on a thread
// resets that thread's team to torch's last global count, undoing the executor's threads on its worker.
template <typename F>
void for_each(int64_t n, int64_t grain, const F& f) {
#pragma omp parallel for schedule(static) if (n > grain)
  for (int64_t i = 0; i < n; ++i) f(i);
}

void check_float(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat, name, " must be a float32 CPU tensor");
}


// The first j in [begin, end) with r[j] == value, else end.
int64_t first_equal(const float* r, int64_t begin, int64_t end, float value) {
  int64_t j = begin;
  for (; j + Vec::size() <= end; j += Vec::size()) {
    int differ = (Vec::loadu(r + j) == Vec(value)).zero_mask();  // a bit per lane that is not equal
    if (~differ & ((1 << Vec::size()) - 1)) return j + __builtin_ctz(~differ);
  }
  while (j < end && r[j] != value) ++j;
  return j;
}

// The sum of e = exp(x - top) and of e (x - top) over r[begin, end): softmax's denominator and entropy's numerator,
// each term where e is 0 left out (a banned -inf logit: 0 * -inf is nan, as torch's nansum leaves it out).
std::pair<float, float> exp_sums(const float* r, int64_t begin, int64_t end, float top) {
  Vec sum(0.f), weighted(0.f), shift(top), zero(0.f);
  int64_t j = begin;
  for (; j + Vec::size() <= end; j += Vec::size()) {
    Vec d = Vec::loadu(r + j) - shift, e = d.exp();
    sum = sum + e;
    weighted = weighted + Vec::blendv(e * d, zero, e == zero);
  }
  float s = at::vec::vec_reduce_all<float>(vec_add, sum), w = at::vec::vec_reduce_all<float>(vec_add, weighted);
  for (; j < end; ++j) {
    float d = r[j] - top, e = std::exp(d);
    s += e;
    if (e != 0.f) w += e * d;
  }
  return {s, w};
}

// n rounded up to a whole number of vectors.
int64_t round_up(int64_t n) { return (n + Vec::size() - 1) / Vec::size() * Vec::size(); }

// A linear's weight in panels (pack_linear): kPanel columns of W^T at a time, each panel [K, kPanel] row-major and
// contiguous, so that a panel streams in once and stays in L2 while every row of x runs over it.
constexpr int kPanelVecs = 4;
constexpr int64_t kPanel = kPanelVecs * Vec::size();
constexpr int kTileRows = 6;  // 6 rows x 4 vectors: 24 accumulators, of the 32 vector registers AVX-512 has

// out[r, :NV vectors] = x[r, :k] . panel (+ bias) for rows r < R: R x NV vector accumulators over k, each a sum in
// k's order. x's rows ldx apart, the panel's rows (NV vectors each) ldp apart, out's rows ldo apart.
template <int R, int NV>
void tile(const float* x, int64_t ldx, int64_t k, const float* panel, int64_t ldp, const float* bias, float* out,
          int64_t ldo) {
  Vec acc[R][NV];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = bias ? Vec::loadu(bias + j * Vec::size()) : Vec(0.f);
  for (int64_t p = 0; p < k; ++p) {
    Vec w[NV];
    for (int j = 0; j < NV; ++j) w[j] = Vec::loadu(panel + p * ldp + j * Vec::size());
    for (int i = 0; i < R; ++i) {
      Vec a(x[i * ldx + p]);
      for (int j = 0; j < NV; ++j) acc[i][j] = at::vec::fmadd(a, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j].store(out + i * ldo + j * Vec::size());
}

// Every row of x [M, k] over one panel of NV vectors' width, in tiles of kTileRows rows.
template <int NV>
void panel_rows(const float* x, int64_t ldx, int64_t m, int64_t k, const float* panel, int64_t ldp, const float* bias,
                float* out, int64_t ldo) {
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows)
    tile<kTileRows, NV>(x + i * ldx, ldx, k, panel, ldp, bias, out + i * ldo, ldo);
  const float* xi = x + i * ldx;
  float* oi = out + i * ldo;
  switch (m - i) {
    case 5: tile<5, NV>(xi, ldx, k, panel, ldp, bias, oi, ldo); break;
    case 4: tile<4, NV>(xi, ldx, k, panel, ldp, bias, oi, ldo); break;
    case 3: tile<3, NV>(xi, ldx, k, panel, ldp, bias, oi, ldo); break;
    case 2: tile<2, NV>(xi, ldx, k, panel, ldp, bias, oi, ldo); break;
    case 1: tile<1, NV>(xi, ldx, k, panel, ldp, bias, oi, ldo); break;
    default: break;
  }
}

// out [M, cols] (rows ldo apart) = x [M, k] (rows ldx apart) . panel [k, cols] (rows ldp apart) + bias [cols] (or
// none), for cols a multiple of the vector width up to kPanel.
void over_panel(const float* x, int64_t ldx, int64_t m, int64_t k, const float* panel, int64_t ldp, int64_t cols,
                const float* bias, float* out, int64_t ldo) {
  switch (cols / Vec::size()) {
    case 4: panel_rows<4>(x, ldx, m, k, panel, ldp, bias, out, ldo); break;
    case 3: panel_rows<3>(x, ldx, m, k, panel, ldp, bias, out, ldo); break;
    case 2: panel_rows<2>(x, ldx, m, k, panel, ldp, bias, out, ldo); break;
    case 1: panel_rows<1>(x, ldx, m, k, panel, ldp, bias, out, ldo); break;
    default: break;
  }
}

// A task's three scratch buffers, kept by its thread from task to task and not zeroed, as each task writes what it
// reads (zero-filled vectors cost a task an allocation and a memset each); buffers past kScratchKept floats (a long
// prompt's) are freed when the task ends. A slot only ever holds what its one use writes: kt's columns past a task's
// keys hold earlier keys.
class Scratch {
 public:
  float* get(int slot, int64_t n) {
    auto& buffer = buffers()[slot];
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
    return buffer.data();
  }
  ~Scratch() {
    for (int slot = 0; slot < 3; ++slot)
      if (buffers()[slot].size() > kScratchKept) std::vector<float>().swap(buffers()[slot]);
  }

 private:
  static constexpr size_t kScratchKept = 1 << 16;
  static std::vector<float>* buffers() {
    thread_local std::vector<float> kept[3];
    return kept;
  }
};

// keys [n, D] (rows D apart) -> kt [D, n'], their transpose (n' = n rounded up to the vector width) in panels as
// pack_linear lays out a weight: panel q holds keys [q kPanel, q kPanel + w_q) as [D, w_q], w_q = kPanel but for the
// last. kt's columns past n are left as they were: the scores they give are never read.
void pack_keys(const float* keys, int64_t n, int64_t d, float* kt) {
  for (int64_t c = 0; c < n; c += kPanel) {
    int64_t cols = std::min(kPanel, round_up(n) - c);
    at::vec::transpose_mxn<float>(keys + c * d, d, kt + c * d, cols, std::min(cols, n - c), d);
  }
}

// A row's scores p[:n] -> its attention weights, in place: the softmax of p * scale + m (m none: + 0) over the keys
// it sees, p[:seen], as SDPA scales and masks the scores, and zero past them; all zero where every key is masked. p
// has room for seen rounded up to the vector width.
void attention_weights(float* p, int64_t n, int64_t seen, const float* m, float scale) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  Vec tops(kNone), sums(0.f);
  int64_t end = round_up(seen);
  for (int64_t j = 0; j < end; j += Vec::size()) {
    int64_t lanes = std::min<int64_t>(Vec::size(), seen - j);  // the last vector's lanes past seen: masked
    Vec s = Vec::loadu(p + j, lanes) * Vec(scale);
    if (m) s = s + Vec::loadu(m + j, lanes);
    s = Vec::set(Vec(kNone), s, lanes);
    s.store(p + j);
    tops = at::vec::maximum(tops, s);
  }
  float top = at::vec::vec_reduce_all<float>(vec_max, tops);
  if (top == kNone) end = 0;  // nothing to attend to
  for (int64_t j = 0; j < end; j += Vec::size()) {
    Vec e = (Vec::loadu(p + j) - Vec(top)).exp();  // 0 for a masked key
    e.store(p + j);
    sums = sums + e;
  }
  Vec sum(at::vec::vec_reduce_all<float>(vec_add, sums));
  for (int64_t j = 0; j < end; j += Vec::size()) (Vec::loadu(p + j) / sum).store(p + j);
  std::fill(p + end, p + std::max(end, n), 0.f);
}
}  // namespace

// x [N, D], weight [D] -> x * rsqrt(mean(x^2) + eps) * weight, [N, D].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_float(x, "x");
  check_float(weight, "weight");
  auto in = x.contiguous();
  int64_t d = in.size(-1), rows = in.numel() / d;
  TORCH_CHECK(weight.numel() == d && weight.is_contiguous(), "weight must be [", d, "]");
  auto out = torch::empty_like(in);
  const float *xp = in.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_each(rows, 64, [&](int64_t i) {
    const float* r = xp + i * d;
    float* o = op + i * d;
    float inv = inv_rms(r, d, eps);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) o[j] = r[j] * inv * wp[j];
  });
  return out;
}

// qk [T, H, D], each head's D contiguous (a view of the qkv projection); weight [H, D] or none (no q/k norm);
// cos, sin [T, D] at the tokens' positions (sin's first half negated: lean_ops.rotary_tables) -> [T, H, D], each head
// normed, then rotated: out = n cos + roll(n, D/2) sin.
torch::Tensor qk_norm_rotary(const torch::Tensor& qk, const std::optional<torch::Tensor>& weight,
                             const torch::Tensor& cos, const torch::Tensor& sin, double eps) {
  check_float(qk, "qk");
  TORCH_CHECK(qk.dim() == 3 && qk.stride(2) == 1 && qk.size(2) <= kMaxHeadDim,
              "qk must be [T, H, D] with D contiguous and at most ", kMaxHeadDim);
  int64_t tokens = qk.size(0), heads = qk.size(1), d = qk.size(2), half = d / 2;
  auto c = cos.reshape({tokens, d}).contiguous(), s = sin.reshape({tokens, d}).contiguous();
  check_float(c, "cos");
  check_float(s, "sin");
  const float* wp = nullptr;
  if (weight.has_value()) {
    check_float(*weight, "weight");
    TORCH_CHECK(weight->numel() == heads * d && weight->is_contiguous(), "weight must be [", heads, ", ", d, "]");
    wp = weight->data_ptr<float>();
  }
  auto out = torch::empty({tokens, heads, d}, qk.options());
  const float *xp = qk.data_ptr<float>(), *cp = c.data_ptr<float>(), *sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  int64_t token_stride = qk.stride(0), head_stride = qk.stride(1);
  for_each(tokens * heads, 512, [&](int64_t k) {
    int64_t t = k / heads, h = k % heads;
    const float *r = xp + t * token_stride + h * head_stride, *ct = cp + t * d, *st = sp + t * d;
    float* o = op + k * d;
    float n[kMaxHeadDim];
    if (wp != nullptr) {
      const float* w = wp + h * d;
      float inv = inv_rms(r, d, eps);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) n[j] = r[j] * inv * w[j];
    } else {
      std::copy(r, r + d, n);
    }
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) o[j] = n[j] * ct[j] + n[j + half] * st[j];
#pragma omp simd
    for (int64_t j = half; j < d; ++j) o[j] = n[j] * ct[j] + n[j - half] * st[j];
  });
  return out;
}

// gate_up [T, 2I], the gate and up projections side by side -> silu(gate) * up, [T, I]; silu as torch computes it,
// bit for bit: x / (1 + exp(-x)), with ATen's vectorised exp over whole blocks of two vectors and std::exp past them.
torch::Tensor swiglu(const torch::Tensor& gate_up) {
  check_float(gate_up, "gate_up");
  auto in = gate_up.contiguous();
  int64_t tokens = in.size(0), width = in.size(1) / 2;
  auto out = torch::empty({tokens, width}, in.options());
  const float* xp = in.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_each(tokens, 16, [&](int64_t t) {
    const float *g = xp + t * 2 * width, *u = g + width;
    float* o = op + t * width;
    int64_t j = 0;
    for (; j < width - width % (2 * Vec::size()); j += Vec::size()) {
      Vec x = Vec::loadu(g + j);
      (x / (Vec(1.f) + x.neg().exp()) * Vec::loadu(u + j)).store(o + j);
    }
    for (; j < width; ++j) o[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
  });
  return out;
}

namespace {
using Attended = std::tuple<torch::Tensor, std::vector<torch::Tensor>, std::vector<torch::Tensor>>;

// attend() through ATen's SDPA, segment by segment (grouped-query heads, no copy of the KV heads): for the head
// dimensions the kernel does not take.
Attended attend_sdpa(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const std::vector<int64_t>& starts,
    const std::vector<int64_t>& stops, const std::vector<std::optional<torch::Tensor>>& past_keys,
    const std::vector<std::optional<torch::Tensor>>& past_values,
    const std::vector<std::optional<torch::Tensor>>& masks, const std::vector<bool>& causal, double scale) {
  auto heads_first = [](const torch::Tensor& t) { return t.transpose(0, 1).unsqueeze(0); };  // [1, heads, Q, D]
  auto qh = heads_first(q), kh = heads_first(k), vh = heads_first(v);
  auto out = torch::empty_like(q);
  std::vector<torch::Tensor> keys, values;
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t start = starts[i], stop = stops[i];
    auto key = kh.slice(2, start, stop), value = vh.slice(2, start, stop);
    if (past_keys[i].has_value()) {
      key = torch::cat({*past_keys[i], key}, 2);
      value = torch::cat({*past_values[i], value}, 2);
    }
    auto o = at::scaled_dot_product_attention(qh.slice(2, start, stop), key, value, masks[i], 0.0, causal[i], scale,
                                              /*enable_gqa=*/true);  // [1, H, q_i, D]
    out.slice(0, start, stop).copy_(o[0].transpose(0, 1));
    keys.push_back(key);
    values.push_back(value);
  }
  return {out.flatten(1), keys, values};
}
}  // namespace


// A packed row's attention (packed_attention.attend): each segment's queries over its cached keys and values followed
// by its new ones. q [Q, H, D], k, v [Q, Hkv, D], each head's D contiguous; per segment i: its rows [start_i, stop_i),
// past keys and values [1, Hkv, L_i, D] (none before its first entry), its mask [q_i, L_i + q_i] added to the scores
// (none: as causal_i says) -> (out [Q, H D], per segment its keys and values [1, Hkv, L_i + q_i, D], the past's then
// the new tokens'); causal_i only without a past. Each (segment, KV head) is one task: it writes its keys and values,
// then for the query heads of its group computes scores = Q K^T over its keys transposed into panels, their softmax,
// and out = P V, both products on the linears' register tiles (SDPA costs a dispatch, a concatenation and a kernel's
// set-up per segment and layer, 2-3x this at a c=1 round's shapes: scripts/kernel_ab.py --kernel attention). Each
// query row's result is its own sums in key order, whatever rows stand beside it; within float rounding of SDPA.
Attended attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
                const std::vector<std::optional<torch::Tensor>>& past_keys,
                const std::vector<std::optional<torch::Tensor>>& past_values,
                const std::vector<std::optional<torch::Tensor>>& masks, const std::vector<bool>& causal,
                double scale) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_float(*t, name);
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, name, " must be [Q, heads, D] with D contiguous");
  }
  int64_t heads = q.size(1), kv_heads = k.size(1), d = q.size(2);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, heads, " query heads cannot share ", kv_heads, " KV heads");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == d, "k and v must be [", q.size(0),
              ", Hkv, ", d, "], as q's tokens and head dim");
  size_t segments = starts.size();
  TORCH_CHECK(stops.size() == segments && past_keys.size() == segments && past_values.size() == segments &&
                  masks.size() == segments && causal.size() == segments,
              "one start, stop, past, mask and causal flag a segment");
  int64_t groups = heads / kv_heads;
  std::vector<torch::Tensor> mask_rows;
  std::vector<int64_t> pasts;
  for (size_t i = 0; i < segments; ++i) {
    TORCH_CHECK(0 <= starts[i] && starts[i] <= stops[i] && stops[i] <= q.size(0), "segment ", i, "'s rows [",
                starts[i], ", ", stops[i], ") are not within the ", q.size(0), " tokens");
    int64_t past = past_keys[i].has_value() ? past_keys[i]->size(2) : 0, total = past + stops[i] - starts[i];
    TORCH_CHECK(past_keys[i].has_value() == past_values[i].has_value(), "segment ", i, " has a past of one of keys "
                "and values only");
    TORCH_CHECK(!causal[i] || past == 0, "segment ", i, " is causal over a past: give its mask instead");
    for (const auto& kv : {past_keys[i], past_values[i]})
      if (kv.has_value()) {
        check_float(*kv, "a past");
        TORCH_CHECK(kv->dim() == 4 && kv->size(0) == 1 && kv->size(1) == kv_heads && kv->size(2) == past &&
                        kv->size(3) == d && kv->stride(3) == 1, "a past must be [1, ", kv_heads, ", L, ", d, "]");
      }
    pasts.push_back(past);
    mask_rows.push_back(masks[i].has_value() ? masks[i]->contiguous() : torch::Tensor());
    if (masks[i].has_value()) {
      check_float(mask_rows[i], "a mask");
      TORCH_CHECK(mask_rows[i].dim() == 2 && mask_rows[i].size(0) == stops[i] - starts[i] &&
                      mask_rows[i].size(1) == total, "segment ", i, "'s mask must be [", stops[i] - starts[i], ", ",
                  total, "]");
    }
  }
  if (d % Vec::size()) return attend_sdpa(q, k, v, starts, stops, past_keys, past_values, masks, causal, scale);
  auto out = torch::empty({q.size(0), heads, d}, q.options());
  std::vector<torch::Tensor> keys, values;
  for (size_t i = 0; i < segments; ++i) {
    keys.push_back(torch::empty({1, kv_heads, pasts[i] + stops[i] - starts[i], d}, q.options()));
    values.push_back(torch::empty_like(keys.back()));
  }
  for_each(segments * kv_heads, 1, [&](int64_t task) {
    int64_t i = task / kv_heads, g = task % kv_heads, start = starts[i], rows = stops[i] - start, past = pasts[i];
    int64_t total = past + rows, width = round_up(total), group_rows = groups * rows;
    float *kd = keys[i].data_ptr<float>() + g * total * d, *vd = values[i].data_ptr<float>() + g * total * d;
    for (auto [from, new_rows, to] : {std::tuple{&past_keys[i], &k, kd}, {&past_values[i], &v, vd}}) {
      if (from->has_value())
        for (int64_t j = 0; j < past; ++j) {
          const float* row = (*from)->data_ptr<float>() + g * (*from)->stride(1) + j * (*from)->stride(2);
          std::copy(row, row + d, to + j * d);
        }
      for (int64_t t = 0; t < rows; ++t) {
        const float* row = new_rows->data_ptr<float>() + (start + t) * new_rows->stride(0) + g * new_rows->stride(1);
        std::copy(row, row + d, to + (past + t) * d);
      }
    }
    // the group's query rows [G q_i, D], head by head; its keys in panels; the rows' scores, then weights [G q_i, n']
    Scratch scratch;
    float *queries = scratch.get(0, group_rows * d), *kt = scratch.get(1, d * width);
    float* weights = scratch.get(2, group_rows * width);
    for (int64_t r = 0; r < groups; ++r)
      for (int64_t t = 0; t < rows; ++t) {
        const float* row = q.data_ptr<float>() + (start + t) * q.stride(0) + (g * groups + r) * q.stride(1);
        std::copy(row, row + d, queries + (r * rows + t) * d);
      }
    pack_keys(kd, total, d, kt);
    for (int64_t c = 0; c < width; c += kPanel) {
      int64_t cols = std::min(kPanel, width - c);
      over_panel(queries, d, group_rows, d, kt + c * d, cols, cols, nullptr, weights + c, width);
    }
    const float* mask = mask_rows[i].defined() ? mask_rows[i].data_ptr<float>() : nullptr;
    for (int64_t r = 0; r < groups; ++r)
      for (int64_t t = 0; t < rows; ++t)  // the keys row t sees: [0, seen)
        attention_weights(weights + (r * rows + t) * width, total, causal[i] ? past + t + 1 : total,
                          mask ? mask + t * total : nullptr, scale);
    for (int64_t r = 0; r < groups; ++r) {  // head g G + r's rows of out, heads * D apart, over v's columns in panels
      float* o = out.data_ptr<float>() + (start * heads + g * groups + r) * d;
      for (int64_t c = 0; c < d; c += kPanel)
        over_panel(weights + r * rows * width, width, rows, total, vd + c, d, std::min(kPanel, d - c), nullptr,
                   o + c, heads * d);
    }
  });
  return {out.flatten(1), keys, values};
}

// logits [N, V], each row contiguous, the mask token's column (mask_id; none where < 0) left out as never_mask bans
// it; picks [N], a token a row (or none) -> each row's first maximum [N] (int64), its probability [N], the pick's
// probability [N] (0 for the mask token; empty without picks) and the entropy -sum p log p of the row's softmax p [N]:
// what a proposal and a verdict read of the distribution, in two passes over the row where torch's softmax, gathers
// and entropy make about ten (within float rounding of them, not bit for bit).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> logit_stats(
    const torch::Tensor& logits, int64_t mask_id, const std::optional<torch::Tensor>& picks) {
  check_float(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0,
              "logits must be [N, V] with V > 0 and each row contiguous");
  int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  TORCH_CHECK(mask_id < vocab && !(mask_id == 0 && vocab == 1), "mask_id ", mask_id, " leaves no token of ", vocab);
  torch::Tensor pick;
  if (picks.has_value()) {
    pick = picks->contiguous();
    TORCH_CHECK(pick.device().is_cpu() && pick.scalar_type() == torch::kLong && pick.numel() == rows,
                "picks must be [", rows, "] int64 on the CPU");
    const int64_t* ids = pick.data_ptr<int64_t>();
    TORCH_CHECK(std::all_of(ids, ids + rows, [&](int64_t id) { return 0 <= id && id < vocab; }),
                "picks must be token ids below ", vocab);
  }
  auto options = logits.options();
  auto first = torch::empty({rows}, options.dtype(torch::kLong));
  auto first_prob = torch::empty({rows}, options), entropy = torch::empty({rows}, options);
  auto pick_prob = torch::empty({pick.defined() ? rows : 0}, options);
  const float* xp = logits.data_ptr<float>();
  const int64_t* kp = pick.defined() ? pick.data_ptr<int64_t>() : nullptr;
  int64_t* fp = first.data_ptr<int64_t>();
  float *fpp = first_prob.data_ptr<float>(), *ppp = pick_prob.data_ptr<float>(), *ep = entropy.data_ptr<float>();
  // the row in at most two ranges around the banned column
  int64_t cut = mask_id < 0 ? vocab : mask_id, resume = mask_id < 0 ? vocab : mask_id + 1;
  for_each(rows, 4, [&](int64_t i) {
    const float* r = xp + i * stride;
    float top = -std::numeric_limits<float>::infinity();
    if (cut > 0) top = at::vec::reduce_all<float>(vec_max, r, cut);
    if (resume < vocab) top = std::max(top, at::vec::reduce_all<float>(vec_max, r + resume, vocab - resume));
    int64_t at = first_equal(r, 0, cut, top);
    if (at == cut) at = first_equal(r, resume, vocab, top);  // vocab: a row of NaN
    auto [s1, w1] = exp_sums(r, 0, cut, top);
    auto [s2, w2] = exp_sums(r, resume, vocab, top);
    float sum = s1 + s2;
    fp[i] = at;
    fpp[i] = 1.f / sum;  // exp(top - top) / sum, as softmax computes it
    if (kp != nullptr) ppp[i] = kp[i] == mask_id ? 0.f : std::exp(r[kp[i]] - top) / sum;
    ep[i] = std::log(sum) - (w1 + w2) / sum;  // -sum p (d - log sum), p = e / sum, d = x - top
  });
  return {first, first_prob, pick_prob, entropy};
}

// w [N, K], N a multiple of the vector width -> its panels, [N * K]: panel q holds columns [q kPanel, q kPanel + w_q)
// of W^T as [K, w_q] (w_q = kPanel, or what is left for the last), one after another.
torch::Tensor pack_linear(const torch::Tensor& weight) {
  check_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % Vec::size() == 0,
              "weight must be [N, K] with N a multiple of ", Vec::size());
  int64_t n = weight.size(0), k = weight.size(1);
  auto wt = weight.t().contiguous();  // [K, N]
  auto out = torch::empty({n * k}, weight.options());
  const float* src = wt.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t c = 0; c < n; c += kPanel) {
    int64_t cols = std::min(kPanel, n - c);
    for (int64_t p = 0; p < k; ++p) std::copy(src + p * n + c, src + p * n + c + cols, dst + c * k + p * cols);
  }
  return out;
}

// x [M, K], a linear's panels (pack_linear of its [N, K] weight), bias [N] or none -> x W^T + bias, [M, N]: the panels
// split over the calling thread's OpenMP team, every row over each. Each output is one sum in k's order, whatever M
// (a row's result does not depend on the rows beside it), within float rounding of torch's linear.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t n,
                     const std::optional<torch::Tensor>& bias) {
  check_float(x, "x");
  check_float(panels, "panels");
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  auto in = x.contiguous();
  int64_t m = in.size(0), k = in.size(1);
  TORCH_CHECK(panels.is_contiguous() && panels.numel() == n * k && n % Vec::size() == 0,
              "panels must be pack_linear's of a [", n, ", ", k, "] weight");
  const float* bp = nullptr;
  if (bias.has_value()) {
    check_float(*bias, "bias");
    TORCH_CHECK(bias->numel() == n && bias->is_contiguous(), "bias must be [", n, "]");
    bp = bias->data_ptr<float>();
  }
  auto out = torch::empty({m, n}, in.options());
  const float *xp = in.data_ptr<float>(), *wp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_each((n + kPanel - 1) / kPanel, 1, [&](int64_t q) {
    int64_t c = q * kPanel;
    const float *panel = wp + c * k, *b = bp ? bp + c : nullptr;
    int64_t cols = std::min(kPanel, n - c);
    over_panel(xp, k, m, k, panel, cols, cols, b, op + c, n);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim with a [D] weight");
  m.def("qk_norm_rotary", &qk_norm_rotary, "per-head RMSNorm (optional), then rotary");
  m.def("swiglu", &swiglu, "silu(gate) * up");
  m.def("attend", &attend, "a packed row's attention, segment by segment");
  m.def("pack_linear", &pack_linear, "a linear's weight [N, K] in panels of W^T");
  m.def("linear", &linear, "x W^T + bias over pack_linear's panels");
  m.attr("lanes") = Vec::size();
  m.def("logit_stats", &logit_stats, "each row's first maximum, its and a pick's probability, and entropy");
}
