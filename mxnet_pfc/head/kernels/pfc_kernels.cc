// Fused CPU kernels of the Partial FC head, loaded into MXNet 1.9 with
// mx.library.load (lib_api.h custom operators).
//
// MXNet's stock CPU reductions and broadcasts make one pass per operator, and
// some (norm, max, sum along an axis) are 5-20x slower than the memory traffic
// they need. Each kernel here touches its data once:
//
//   pfc_inv_norm         inv_norm[r] = 1 / |weight[r]|
//   pfc_scale_lse        logits[i, j] *= col_scale[j] (in place); per row the
//                        log-sum-exp over every column except the row's target
//                        (lse_others) and the target's scaled logit s * cos_t
//                        (target_scos), unmargined
//   pfc_softmax_grad     logits -> d loss / d cos * inv_norm (in place), and
//                        b[j] = sum_i grad[i, j] * cos[i, j]
//   pfc_sgd_rows         momentum SGD of the sampled rows of weight and mom in
//                        place, with the radial term of the normalisation
//   pfc_logits           cos * |w| of every row against the sampled centers and
//                        their 1 / |w|, block by block from the bank: the
//                        sampled centers are never copied out as a whole
//   pfc_center_step      the embeddings' gradient, the centers' gradient and
//                        their SGD, block by block: the centers' gradient is
//                        never written out, each center is read once
//   pfc_subcenter_pool   sub-center ArcFace: each class's cosine, the largest
//                        of its K rows' cos * |w| / |w|, and which row gave it
//   pfc_subcenter_route  sub-center ArcFace: each class's gradient to the row
//                        that gave its cosine (in place), and the rows' radial
//                        coefficients
//
// The last two run the products through cblas_sgemm of the OpenBLAS that MXNet
// ships (the one its `dot` uses) on blocks of kBlockRows centers that stay in
// the L2 cache, so the bank's rows cross memory once per pass instead of three
// or four times (gather, product, gradient, SGD).
//
// Inter-class filtering (attribute `threshold`, in scaled units s * T; absent:
// off): a non-target cell whose scaled logit exceeds it counts as logit 0 in
// the log-sum-exp and gets gradient 0. The scaled logit itself is kept in
// place, so both kernels make the same decision from the same float.
//
// Hard-negative modulation (CurricularFace; attribute `hard_t` = t, with one more
// input, hard_threshold (N,) in scaled units: absent, off): a non-target cell whose
// scaled logit L = s * cos exceeds its row's threshold enters the softmax as
// L * (t + L / s) = s * cos * (t + cos), with derivative s * (t + 2 cos) in cos. As
// with the filter, L stays in place and both kernels decide from the same float.
//
// No margin here: the target's margined logit f_t and its derivative are computed on
// the host, in float64, after collective 2 has brought every rank's lse_others and
// target_scos to every rank (partial_fc.global_softmax, margin.py). A per-sample or
// batch-statistic margin needs the whole global batch's target cosines, which only
// the host has, after that collective (docs/DESIGN.md sections 2.3-2.4).
//
// The math is in docs/DESIGN.md section 2 and partial_fc.py (the margin: margin.py);
// these only fuse it.
//
// Every index a kernel takes is checked before any row is read or written: the
// centers' index (sorted, unique, within weight's rows), the targets of the
// rows with mask != 0 (within the S columns) and the sub-center winners (within
// the K rows of their class). A bad one makes the op fail with
// an MXNet error naming the op and the index, and leaves every buffer as it was.
//
// Compiled without -ffast-math (build.py): its startup code would turn on
// flush-to-zero for the whole process. The exp loops still vectorise through
// glibc's vector expf, declared below.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mxnet/lib_api.h"

// glibc's vector expf (libmvec), which <math.h> declares for the vectoriser only
// under -ffast-math; without it the exp loops run one float at a time (4x slower).
#pragma omp declare simd notinbranch
extern "C" float expf(float) noexcept;

// OpenBLAS's CBLAS entry (32-bit integers, as MXNet calls it); linked against
// the libopenblas.so.0 beside libmxnet.so.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

using namespace mxnet::ext;

namespace {

const float kEmptyLse = -1e30f;   // log-sum-exp of no column

// NaN or Inf, read from the bits: an integer test, which no floating-point
// flag lets the compiler fold away.
inline bool not_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

float attr_float(const std::unordered_map<std::string, std::string>& attrs, const char* key) {
  auto it = attrs.find(key);
  return it == attrs.end() ? 0.0f : std::stof(it->second);
}

// The inter-class filter: (on, threshold in scaled units).
struct Filter {
  bool on;
  float threshold;
  explicit Filter(const std::unordered_map<std::string, std::string>& attrs)
      : on(attrs.count("threshold") > 0), threshold(attr_float(attrs, "threshold")) {}
};

// Whether a non-target cell is filtered. NaN and Inf never are, so that the loss
// check sees them (+Inf compares greater: hence the test on the bits, not_finite).
inline bool filtered(float logit, float threshold) {
  return logit > threshold && !not_finite(logit);
}

// The hard-negative modulation: (on, t, 1 / s, the rows' thresholds in scaled units).
struct Hard {
  bool on;
  float t, inv_s;
  const float* threshold;
  Hard(const std::unordered_map<std::string, std::string>& attrs, std::vector<MXTensor>& inputs,
       size_t input, float s)
      : on(attrs.count("hard_t") > 0), t(attr_float(attrs, "hard_t")), inv_s(1.0f / s),
        threshold(on ? inputs[input].data<float>() : nullptr) {}
};

// What a non-target cell does to the softmax. A compile-time switch: a run-time
// test inside the loops stops GCC from vectorising exp there.
enum Mode { kPlain, kFilter, kHard };

// The value a non-target scaled logit enters the softmax with; `threshold` is the
// filter's, or the row's hard-negative threshold.
template <int kMode>
inline float kept(float logit, float threshold, float t, float inv_s) {
  if (kMode == kFilter) return filtered(logit, threshold) ? 0.0f : logit;
  if (kMode == kHard) return filtered(logit, threshold) ? logit * (t + logit * inv_s) : logit;
  return logit;
}

// Momentum SGD of one center with the radial term of the normalisation (docs/DESIGN.md
// section 2.6), from its value before the step `old` (which may be `w` itself):
// g = grad - coef * old; m = momentum * m - lr * (g + wd * old); w = old + m.
struct Sgd {
  float lr, momentum, wd;
  explicit Sgd(const std::unordered_map<std::string, std::string>& attrs)
      : lr(attr_float(attrs, "lr")), momentum(attr_float(attrs, "momentum")), wd(attr_float(attrs, "wd")) {}
  void row(const float* old, const float* grad, float coef, float* w, float* m, int64_t D) const {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      const float w_d = old[d];
      const float step = momentum * m[d] - lr * (grad[d] - coef * w_d + wd * w_d);
      m[d] = step;
      w[d] = w_d + step;
    }
  }
};

inline float inverse_norm(const float* row, int64_t D) {
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int64_t d = 0; d < D; ++d) sq += row[d] * row[d];
  return 1.0f / std::sqrt(sq);
}

bool check(bool ok, const char* op, const char* what) {
  if (!ok) MX_ERROR_MSG << op << ": " << what;
  return ok;
}

// Whether index (S) is sorted, unique and within [0, rows): the rows a kernel
// reads and writes (block_rows takes a run of consecutive indices as one block,
// and the row updates run in parallel). One pass over S ints, before any row.
bool check_index(const int32_t* index, int64_t S, int64_t rows, const char* op) {
  for (int64_t k = 0; k < S; ++k) {
    if (index[k] < 0 || index[k] >= rows) {
      MX_ERROR_MSG << op << ": index[" << k << "] = " << index[k] << " is outside [0, " << rows
                   << "), the rows of weight";
      return false;
    }
    if (k > 0 && index[k] <= index[k - 1]) {
      MX_ERROR_MSG << op << ": index[" << k << "] = " << index[k] << " follows index[" << k - 1 << "] = "
                   << index[k - 1] << "; the index must be sorted and unique";
      return false;
    }
  }
  return true;
}

// Whether the target of every row with mask != 0 is one of the S columns.
bool check_targets(const int32_t* target, const float* mask, int64_t N, int64_t S, const char* op) {
  for (int64_t i = 0; i < N; ++i) {
    if (mask[i] != 0.0f && (target[i] < 0 || target[i] >= S)) {
      MX_ERROR_MSG << op << ": target[" << i << "] = " << target[i] << " is outside [0, " << S
                   << "), the columns of logits";
      return false;
    }
  }
  return true;
}


// ---------------------------------------------------------------- row norms
MXReturnValue inv_norm(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  const float* weight = (*inputs)[0].data<float>();
  float* out = (*outputs)[0].data<float>();
  const int64_t R = (*inputs)[0].shape[0], D = (*inputs)[0].shape[1];
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) out[r] = inverse_norm(weight + r * D, D);
  return MX_SUCCESS;
}

// ------------------------------------------------------------ log-sum-exp
// Inputs: logits (N, S) [mutated], col_scale (S), target (N) int32, mask (N),
// hard_threshold (N) with hard_t. Attrs: threshold (optional, see Filter), hard_t and
// s (optional, see Hard).
// Outputs, per row i:
//   lse_others (N):  log-sum-exp over the columns j != target[i] when mask[i] != 0,
//                    over all columns otherwise; kEmptyLse for a row with no column
//                    left. The target column is left out, never subtracted: the
//                    host adds the margined target with log-add-exp (subtracting a
//                    dominant term from a float32 sum loses the rest).
//   target_scos (N): the target's scaled logit s * cos_t as it is in the row
//                    (NaN and Inf passed on), 0 where mask[i] = 0.
// One row: scale in place, then the log-sum-exp over [0, skip) and (skip, S).
template <int kMode>
float row_lse(float* row, const float* col_scale, int64_t skip, int64_t S, float threshold, float t, float inv_s) {
  const int64_t ranges[2][2] = {{0, skip < S ? skip : S}, {skip < S ? skip + 1 : S, S}};
  if (skip < S) row[skip] *= col_scale[skip];
  float row_max = -3.0e38f;
  for (const auto& range : ranges) {
#pragma omp simd reduction(max : row_max)
    for (int64_t j = range[0]; j < range[1]; ++j) {
      row[j] *= col_scale[j];
      const float value = kept<kMode>(row[j], threshold, t, inv_s);
      row_max = value > row_max ? value : row_max;
    }
  }
  float total = 0.0f;
  for (const auto& range : ranges) {
#pragma omp simd reduction(+ : total)
    for (int64_t j = range[0]; j < range[1]; ++j) total += expf(kept<kMode>(row[j], threshold, t, inv_s) - row_max);
  }
  // total is 0 only for a row with no column. A NaN or Inf logit makes it NaN: pass
  // that on (the caller stops the step), instead of letting the comparison hide it.
  return not_finite(total) ? total : (total > 0.0f ? row_max + std::log(total) : kEmptyLse);
}

MXReturnValue scale_lse(const std::unordered_map<std::string, std::string>& attrs,
                        std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                        const OpResource& res) {
  float* logits = (*inputs)[0].data<float>();
  const float* col_scale = (*inputs)[1].data<float>();
  const int32_t* target = (*inputs)[2].data<int32_t>();
  const float* mask = (*inputs)[3].data<float>();
  float* lse_others = (*outputs)[0].data<float>();
  float* target_scos = (*outputs)[1].data<float>();
  const int64_t N = (*inputs)[0].shape[0], S = (*inputs)[0].shape[1];
  if (!check_targets(target, mask, N, S, "pfc_scale_lse")) return MX_FAIL;
  const Filter filter(attrs);
  const Hard hard(attrs, *inputs, 4, attr_float(attrs, "s"));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t skip = mask[i] != 0.0f ? target[i] : S;   // S: skip nothing
    float* row = logits + i * S;
    lse_others[i] = hard.on ? row_lse<kHard>(row, col_scale, skip, S, hard.threshold[i], hard.t, hard.inv_s)
                    : filter.on ? row_lse<kFilter>(row, col_scale, skip, S, filter.threshold, 0.0f, 0.0f)
                                : row_lse<kPlain>(row, col_scale, skip, S, 0.0f, 0.0f, 0.0f);
    target_scos[i] = skip < S ? row[skip] : 0.0f;   // row_lse has scaled it
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------- softmax grad
// Inputs: logits = s * cos (N, S) [mutated into the gradient], lse (N) global,
// inv_norm (S), target (N) int32, mask (N), target_grad (N), hard_threshold (N) with hard_t.
// Attrs: s, inv_n (1 / global batch), threshold (optional, see Filter), hard_t (optional, see Hard).
// Output: b (S) = sum_i grad_ij * cos_ij.
// grad_ij = exp(logit_ij - lse_i) * s * inv_n * inv_norm_j off target (a hard negative:
// exp(its modulated value - lse_i) * (t + 2 cos_ij) * s * inv_n * inv_norm_j),
// target_grad_i at the target of rows with mask_i != 0.
MXReturnValue softmax_grad(const std::unordered_map<std::string, std::string>& attrs,
                           std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                           const OpResource& res) {
  float* logits = (*inputs)[0].data<float>();
  const float* lse = (*inputs)[1].data<float>();
  const float* inv_norm = (*inputs)[2].data<float>();
  const int32_t* target = (*inputs)[3].data<int32_t>();
  const float* mask = (*inputs)[4].data<float>();
  const float* target_grad = (*inputs)[5].data<float>();
  float* b = (*outputs)[0].data<float>();
  const int64_t N = (*inputs)[0].shape[0], S = (*inputs)[0].shape[1];
  if (!check_targets(target, mask, N, S, "pfc_softmax_grad")) return MX_FAIL;
  const float s = attr_float(attrs, "s"), inv_s = 1.0f / s;
  const float factor = s * attr_float(attrs, "inv_n");
  const Filter filter(attrs);
  const Hard hard(attrs, *inputs, 6, s);
  constexpr int64_t kBlock = 512;   // columns per task, so that b's partial sums stay in L1
  const int64_t num_blocks = (S + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < S ? j0 + kBlock : S;
    float acc[kBlock];
    float scale[kBlock];
    for (int64_t j = j0; j < j1; ++j) {
      acc[j - j0] = 0.0f;
      scale[j - j0] = factor * inv_norm[j];
    }
    for (int64_t i = 0; i < N; ++i) {
      float* row = logits + i * S;
      const float shift = lse[i];
      const int64_t t = target[i];
      const bool has_target = mask[i] != 0.0f && t >= j0 && t < j1;
      const float logit_t = has_target ? row[t] : 0.0f;
      // The target cell sits out of the loop (exp gives 0): adding its softmax
      // term and taking it back out would lose the other terms of acc[t].
      if (has_target) row[t] = -1.0e30f;
      if (hard.on) {
        const float th = hard.threshold[i], ht = hard.t, inv_s_h = hard.inv_s;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) {
          const float logit = row[j];
          const bool is_hard = filtered(logit, th);
          const float value = is_hard ? logit * (ht + logit * inv_s_h) : logit;
          const float slope = is_hard ? ht + 2.0f * logit * inv_s_h : 1.0f;
          const float grad = expf(value - shift) * scale[j - j0] * slope;
          acc[j - j0] += grad * logit;
          row[j] = grad;
        }
      } else {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) {
          const float logit = row[j];
          // a filtered cell entered the softmax as a constant 0: no gradient
          const float grad = filter.on && filtered(logit, filter.threshold) ? 0.0f
                                                                             : expf(logit - shift) * scale[j - j0];
          acc[j - j0] += grad * logit;
          row[j] = grad;
        }
      }
      if (has_target) {   // the target cell: its own gradient, through the margin
        acc[t - j0] += target_grad[i] * logit_t;
        row[t] = target_grad[i];
      }
    }
    for (int64_t j = j0; j < j1; ++j) b[j] = acc[j - j0] * inv_s;
  }
  return MX_SUCCESS;
}

// --------------------------------------------------------------- SGD rows
// Inputs: weight (R, D) [mutated], mom (R, D) [mutated], grad (S, D) =
// sum_i g_ij xh_i, coef (S), index (S) int32 sorted. Attrs: lr, momentum, wd.
// For row r = index[k]: g = grad[k] - coef[k] * weight[r];
// mom[r] = momentum * mom[r] - lr * (g + wd * weight[r]); weight[r] += mom[r].
MXReturnValue sgd_rows(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  float* weight = (*inputs)[0].data<float>();
  float* mom = (*inputs)[1].data<float>();
  const float* grad = (*inputs)[2].data<float>();
  const float* coef = (*inputs)[3].data<float>();
  const int32_t* index = (*inputs)[4].data<int32_t>();
  const int64_t S = (*inputs)[2].shape[0], D = (*inputs)[2].shape[1];
  if (!check_index(index, S, (*inputs)[0].shape[0], "pfc_sgd_rows")) return MX_FAIL;
  const Sgd sgd(attrs);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < S; ++k) {
    float* w = weight + static_cast<int64_t>(index[k]) * D;
    sgd.row(w, grad + k * D, coef[k], w, mom + static_cast<int64_t>(index[k]) * D, D);
  }
  (*outputs)[0].data<float>()[0] = 0.0f;
  return MX_SUCCESS;
}


// ------------------------------------------------- blocked logits and center step
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
constexpr int64_t kBlockRows = 256;   // centers per block: 256 x D floats (D = 512: 512 KB) stay near the core

// The rows index[k0..k1) of weight as one (k1 - k0, D) matrix: the bank's own rows
// when the indices are consecutive (every center, or a run of them), else gathered
// into buffer. index is sorted and unique (check_index).
const float* block_rows(const float* weight, const int32_t* index, int64_t k0, int64_t k1, int64_t D,
                        float* buffer) {
  if (index[k1 - 1] - index[k0] == k1 - 1 - k0) return weight + static_cast<int64_t>(index[k0]) * D;
  for (int64_t k = k0; k < k1; ++k)
    std::memcpy(buffer + (k - k0) * D, weight + static_cast<int64_t>(index[k]) * D, D * sizeof(float));
  return buffer;
}

// Inputs: xh (N, D) normalised embeddings, weight (R, D) centers, index (S) int32 sorted.
// Outputs: logits (N, S) = xh . weight[index]^T (cos * |w|), inv_norm (S) = 1 / |weight[index[k]]|.
MXReturnValue logits(const std::unordered_map<std::string, std::string>& attrs,
                     std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                     const OpResource& res) {
  const float* xh = (*inputs)[0].data<float>();
  const float* weight = (*inputs)[1].data<float>();
  const int32_t* index = (*inputs)[2].data<int32_t>();
  float* out = (*outputs)[0].data<float>();
  float* inv_norm = (*outputs)[1].data<float>();
  const int64_t N = (*inputs)[0].shape[0], D = (*inputs)[0].shape[1], S = (*inputs)[2].shape[0];
  if (!check_index(index, S, (*inputs)[1].shape[0], "pfc_logits")) return MX_FAIL;
  std::vector<float> buffer(kBlockRows * D);
  for (int64_t k0 = 0; k0 < S; k0 += kBlockRows) {
    const int64_t k1 = k0 + kBlockRows < S ? k0 + kBlockRows : S;
    const float* rows = block_rows(weight, index, k0, k1, D, buffer.data());
    for (int64_t k = k0; k < k1; ++k) inv_norm[k] = inverse_norm(rows + (k - k0) * D, D);
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, N, k1 - k0, D, 1.0f, xh, D, rows, D, 0.0f, out + k0, S);
  }
  return MX_SUCCESS;
}

// Inputs: grad (N, S) = d loss / d cos * inv_norm (pfc_softmax_grad), xh (N, D),
// coef (S) the radial coefficients, index (S) int32 sorted, weight and mom (R, D)
// [mutated]. Attrs: lr, momentum, wd. Output: grad_xh (N, D) = grad . weight[index]
// with the centers before the update. Per block of centers: its share of grad_xh,
// its gradient g = grad[:, block]^T . xh - coef * w, and the SGD of pfc_sgd_rows.
MXReturnValue center_step(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                          const OpResource& res) {
  const float* grad = (*inputs)[0].data<float>();
  const float* xh = (*inputs)[1].data<float>();
  const float* coef = (*inputs)[2].data<float>();
  const int32_t* index = (*inputs)[3].data<int32_t>();
  float* weight = (*inputs)[4].data<float>();
  float* mom = (*inputs)[5].data<float>();
  float* grad_xh = (*outputs)[0].data<float>();
  const int64_t N = (*inputs)[1].shape[0], D = (*inputs)[1].shape[1], S = (*inputs)[3].shape[0];
  if (!check_index(index, S, (*inputs)[4].shape[0], "pfc_center_step")) return MX_FAIL;
  const Sgd sgd(attrs);
  std::vector<float> buffer(kBlockRows * D), center_grad(kBlockRows * D);
  std::memset(grad_xh, 0, N * D * sizeof(float));
  for (int64_t k0 = 0; k0 < S; k0 += kBlockRows) {
    const int64_t k1 = k0 + kBlockRows < S ? k0 + kBlockRows : S, rows_in_block = k1 - k0;
    const float* rows = block_rows(weight, index, k0, k1, D, buffer.data());
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, N, D, rows_in_block, 1.0f, grad + k0, S, rows, D, 1.0f,
                grad_xh, D);
    cblas_sgemm(kRowMajor, kTrans, kNoTrans, rows_in_block, D, N, 1.0f, grad + k0, S, xh, D, 0.0f,
                center_grad.data(), D);
    for (int64_t k = k0; k < k1; ++k)     // rows may be the bank's own: each is read before it is written
      sgd.row(rows + (k - k0) * D, center_grad.data() + (k - k0) * D, coef[k],
              weight + static_cast<int64_t>(index[k]) * D, mom + static_cast<int64_t>(index[k]) * D, D);
  }
  return MX_SUCCESS;
}

// ------------------------------------------------------------ sub-centers
// Sub-center ArcFace (docs/DESIGN.md 2.12): K rows per class, class-major (class c:
// columns c*K .. c*K + K - 1 of the rows' logits). Attribute K.

int attr_k(const std::unordered_map<std::string, std::string>& attrs) {
  auto it = attrs.find("K");
  return it == attrs.end() ? 0 : std::stoi(it->second);
}

// The per-row loops below are branch-free (a select per cell, which GCC vectorises) and take K as
// a template argument for the usual K (the k loop unrolled, the stride known); kAnyK: K at run time.
constexpr int kAnyK = 0;

// One row of pfc_subcenter_pool: cos[c], winner[c] from row[c*K .. c*K + K) * inv_norm; sub-center
// k = 0 first, then each later one against the best so far (one simple loop over the classes each).
template <int kK>
void pool_row(const float* row, const float* inv_norm, int64_t S, int64_t runtime_k, float* cos, int32_t* winner) {
  const int64_t K = kK == kAnyK ? runtime_k : kK;
  for (int64_t c = 0; c < S; ++c) {
    cos[c] = row[c * K] * inv_norm[c * K];
    winner[c] = 0;
  }
  for (int32_t k = 1; k < K; ++k) {
    for (int64_t c = 0; c < S; ++c) {
      const float value = row[c * K + k] * inv_norm[c * K + k], best = cos[c];
      // larger, or a NaN over a number; a tie keeps the earlier row (bitwise: no branch)
      const bool takes = (value > best) | ((value != value) & (best == best));
      cos[c] = takes ? value : best;
      winner[c] = takes ? k : winner[c];
    }
  }
}

// Inputs: logits (N, S*K) = cos * |w| of the rows (pfc_logits), inv_norm (S*K) their 1 / |w|.
// Outputs: cos (N, S), cos[i, c] = max_k logits[i, c*K + k] * inv_norm[c*K + k]; winner (N, S)
// int32, the k that gave it. A tie goes to the first of the tied rows (torch.max's index); a
// NaN row wins over every number (the first NaN), so that the loss check sees it (2.9).
MXReturnValue subcenter_pool(const std::unordered_map<std::string, std::string>& attrs,
                             std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                             const OpResource& res) {
  const float* logits = (*inputs)[0].data<float>();
  const float* inv_norm = (*inputs)[1].data<float>();
  float* cos = (*outputs)[0].data<float>();
  int32_t* winner = (*outputs)[1].data<int32_t>();
  const int64_t K = attr_k(attrs), N = (*inputs)[0].shape[0], S = (*inputs)[0].shape[1] / K;
  auto* pool = K == 2 ? pool_row<2> : K == 3 ? pool_row<3> : K == 4 ? pool_row<4> : pool_row<kAnyK>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) pool(logits + i * S * K, inv_norm, S, K, cos + i * S, winner + i * S);
  return MX_SUCCESS;
}

// One row of pfc_subcenter_route over classes [c0, c1): row[c*K + k] becomes grad[c] * inv_norm[c*K + k]
// where k = winner[c], else 0, and acc[c*K + k - c0*K] adds that times the row's cosine.
template <int kK>
void route_row(float* row, const float* inv_norm, const int32_t* winner, const float* grad, int64_t c0,
               int64_t c1, int64_t runtime_k, float* acc) {
  const int64_t K = kK == kAnyK ? runtime_k : kK;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = c * K + k;
      const float g = winner[c] == k ? grad[c] * inv_norm[r] : 0.0f;
      acc[r - c0 * K] += g * (row[r] * inv_norm[r]);
      row[r] = g;
    }
  }
}

// Inputs: logits (N, S*K) = cos * |w| of the rows [mutated into the rows' gradient], inv_norm
// (S*K), winner (N, S) int32 (pfc_subcenter_pool), grad (N, S) = d loss / d cos of the classes.
// Output: radial (S*K), radial[r] = inv_norm[r] * sum_i grad_rows[i, r] * cos_rows[i, r] (the b
// of 2.5 per row, times 1 / |w|), where cos_rows = logits * inv_norm and
// grad_rows[i, c*K + k] = grad[i, c] * inv_norm[c*K + k] if k = winner[i, c], else 0.
MXReturnValue subcenter_route(const std::unordered_map<std::string, std::string>& attrs,
                              std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                              const OpResource& res) {
  float* logits = (*inputs)[0].data<float>();
  const float* inv_norm = (*inputs)[1].data<float>();
  const int32_t* winner = (*inputs)[2].data<int32_t>();
  const float* grad = (*inputs)[3].data<float>();
  float* radial = (*outputs)[0].data<float>();
  const int64_t K = attr_k(attrs), N = (*inputs)[2].shape[0], S = (*inputs)[2].shape[1];
  for (int64_t cell = 0; cell < N * S; ++cell) {
    if (winner[cell] < 0 || winner[cell] >= K) {
      MX_ERROR_MSG << "pfc_subcenter_route: winner[" << cell / S << ", " << cell % S << "] = " << winner[cell]
                   << " is outside [0, " << K << "), the sub-centers of a class";
      return MX_FAIL;
    }
  }
  auto* route = K == 2 ? route_row<2> : K == 3 ? route_row<3> : K == 4 ? route_row<4> : route_row<kAnyK>;
  constexpr int64_t kBlock = 256;   // classes per task: their K * kBlock partial sums stay in L1
  const int64_t num_blocks = (S + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = c0 + kBlock < S ? c0 + kBlock : S;
    std::vector<float> acc((c1 - c0) * K, 0.0f);
    for (int64_t i = 0; i < N; ++i)
      route(logits + i * S * K, inv_norm, winner + i * S, grad + i * S, c0, c1, K, acc.data());
    for (int64_t r = c0 * K; r < c1 * K; ++r) radial[r] = acc[r - c0 * K] * inv_norm[r];
  }
  return MX_SUCCESS;
}

// ------------------------------------------------------------ registration
// parseAttrs/inferType/inferShape per op; inputs are validated here so that a
// misuse fails with a message instead of reading out of bounds.

MXReturnValue norm_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 1; *n_out = 1; return MX_SUCCESS;
}
MXReturnValue norm_types(const std::unordered_map<std::string, std::string>&,
                         std::vector<int>* in, std::vector<int>* out) {
  if (!check((*in)[0] == kFloat32, "pfc_inv_norm", "needs float32 weight")) return MX_FAIL;
  (*out)[0] = kFloat32; return MX_SUCCESS;
}
MXReturnValue norm_shapes(const std::unordered_map<std::string, std::string>&,
                          std::vector<std::vector<unsigned int>>* in,
                          std::vector<std::vector<unsigned int>>* out) {
  if (!check((*in)[0].size() == 2, "pfc_inv_norm", "needs weight (R, D)")) return MX_FAIL;
  (*out)[0] = {(*in)[0][0]}; return MX_SUCCESS;
}

// The hard-negative modulation's extra input (hard_threshold), when attribute hard_t is given.
int hard_inputs(const std::unordered_map<std::string, std::string>& attrs) { return attrs.count("hard_t") ? 1 : 0; }

MXReturnValue lse_attrs(const std::unordered_map<std::string, std::string>& attrs, int* n_in, int* n_out) {
  *n_in = 4 + hard_inputs(attrs); *n_out = 2; return MX_SUCCESS;
}
MXReturnValue lse_types(const std::unordered_map<std::string, std::string>& attrs,
                        std::vector<int>* in, std::vector<int>* out) {
  if (!check((*in)[0] == kFloat32 && (*in)[1] == kFloat32 && (*in)[2] == kInt32 && (*in)[3] == kFloat32 &&
             (!hard_inputs(attrs) || (*in)[4] == kFloat32),
             "pfc_scale_lse", "needs float32 logits, col_scale, mask (, hard_threshold) and int32 target"))
    return MX_FAIL;
  (*out)[0] = (*out)[1] = kFloat32; return MX_SUCCESS;
}
MXReturnValue lse_shapes(const std::unordered_map<std::string, std::string>& attrs,
                         std::vector<std::vector<unsigned int>>* in,
                         std::vector<std::vector<unsigned int>>* out) {
  const auto& l = (*in)[0];
  if (!check(l.size() == 2 && (*in)[1] == std::vector<unsigned int>{l[1]} &&
             (*in)[2] == std::vector<unsigned int>{l[0]} && (*in)[3] == std::vector<unsigned int>{l[0]} &&
             (!hard_inputs(attrs) || (*in)[4] == std::vector<unsigned int>{l[0]}),
             "pfc_scale_lse", "needs logits (N, S), col_scale (S,), target (N,), mask (N,) "
             "(, hard_threshold (N,))")) return MX_FAIL;
  (*out)[0] = (*out)[1] = {l[0]}; return MX_SUCCESS;
}
MXReturnValue mutate_first(const std::unordered_map<std::string, std::string>&, std::vector<int>* idx) {
  idx->push_back(0); return MX_SUCCESS;
}

MXReturnValue grad_attrs(const std::unordered_map<std::string, std::string>& attrs, int* n_in, int* n_out) {
  *n_in = 6 + hard_inputs(attrs); *n_out = 1; return MX_SUCCESS;
}
MXReturnValue grad_types(const std::unordered_map<std::string, std::string>& attrs,
                         std::vector<int>* in, std::vector<int>* out) {
  for (int k = 0; k < 6 + hard_inputs(attrs); ++k)
    if (!check((*in)[k] == (k == 3 ? kInt32 : kFloat32), "pfc_softmax_grad",
               "needs float32 inputs and an int32 target")) return MX_FAIL;
  (*out)[0] = kFloat32; return MX_SUCCESS;
}
MXReturnValue grad_shapes(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in,
                          std::vector<std::vector<unsigned int>>* out) {
  const auto& l = (*in)[0];
  bool ok = l.size() == 2 && (*in)[2] == std::vector<unsigned int>{l[1]};
  for (int k : {1, 3, 4, 5}) ok = ok && (*in)[k] == std::vector<unsigned int>{l[0]};
  ok = ok && (!hard_inputs(attrs) || (*in)[6] == std::vector<unsigned int>{l[0]});
  if (!check(ok, "pfc_softmax_grad", "needs logits (N, S), lse (N,), inv_norm (S,), "
             "target (N,), mask (N,), target_grad (N,) (, hard_threshold (N,))")) return MX_FAIL;
  (*out)[0] = {l[1]}; return MX_SUCCESS;
}

MXReturnValue sgd_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 5; *n_out = 1; return MX_SUCCESS;
}
MXReturnValue sgd_types(const std::unordered_map<std::string, std::string>&,
                        std::vector<int>* in, std::vector<int>* out) {
  for (int k = 0; k < 5; ++k)
    if (!check((*in)[k] == (k == 4 ? kInt32 : kFloat32), "pfc_sgd_rows",
               "needs float32 weight, mom, grad, coef and an int32 index")) return MX_FAIL;
  (*out)[0] = kFloat32; return MX_SUCCESS;
}
MXReturnValue sgd_shapes(const std::unordered_map<std::string, std::string>&,
                         std::vector<std::vector<unsigned int>>* in,
                         std::vector<std::vector<unsigned int>>* out) {
  const auto& w = (*in)[0];
  const auto& g = (*in)[2];
  bool ok = w.size() == 2 && (*in)[1] == w && g.size() == 2 && g[1] == w[1] &&
            (*in)[3] == std::vector<unsigned int>{g[0]} && (*in)[4] == std::vector<unsigned int>{g[0]};
  if (!check(ok, "pfc_sgd_rows", "needs weight and mom (R, D), grad (S, D), coef (S,), index (S,)"))
    return MX_FAIL;
  (*out)[0] = {1}; return MX_SUCCESS;
}
MXReturnValue mutate_weight_mom(const std::unordered_map<std::string, std::string>&,
                                std::vector<int>* idx) {
  idx->push_back(0); idx->push_back(1); return MX_SUCCESS;
}


MXReturnValue logits_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 3; *n_out = 2; return MX_SUCCESS;
}
MXReturnValue logits_types(const std::unordered_map<std::string, std::string>&,
                           std::vector<int>* in, std::vector<int>* out) {
  if (!check((*in)[0] == kFloat32 && (*in)[1] == kFloat32 && (*in)[2] == kInt32, "pfc_logits",
             "needs float32 embeddings and weight and an int32 index")) return MX_FAIL;
  (*out)[0] = (*out)[1] = kFloat32; return MX_SUCCESS;
}
MXReturnValue logits_shapes(const std::unordered_map<std::string, std::string>&,
                            std::vector<std::vector<unsigned int>>* in,
                            std::vector<std::vector<unsigned int>>* out) {
  const auto& x = (*in)[0];
  const auto& w = (*in)[1];
  if (!check(x.size() == 2 && w.size() == 2 && x[1] == w[1] && (*in)[2].size() == 1 && (*in)[2][0] >= 1,
             "pfc_logits", "needs embeddings (N, D), weight (R, D) and a non-empty index (S,)")) return MX_FAIL;
  (*out)[0] = {x[0], (*in)[2][0]}; (*out)[1] = {(*in)[2][0]}; return MX_SUCCESS;
}

MXReturnValue step_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 6; *n_out = 1; return MX_SUCCESS;
}
MXReturnValue step_types(const std::unordered_map<std::string, std::string>&,
                         std::vector<int>* in, std::vector<int>* out) {
  for (int k = 0; k < 6; ++k)
    if (!check((*in)[k] == (k == 3 ? kInt32 : kFloat32), "pfc_center_step",
               "needs float32 grad, embeddings, coef, weight, mom and an int32 index")) return MX_FAIL;
  (*out)[0] = kFloat32; return MX_SUCCESS;
}
MXReturnValue step_shapes(const std::unordered_map<std::string, std::string>&,
                          std::vector<std::vector<unsigned int>>* in,
                          std::vector<std::vector<unsigned int>>* out) {
  const auto& g = (*in)[0];
  const auto& x = (*in)[1];
  const auto& w = (*in)[4];
  bool ok = g.size() == 2 && x.size() == 2 && w.size() == 2 && g[0] == x[0] && x[1] == w[1] && (*in)[5] == w &&
            (*in)[2] == std::vector<unsigned int>{g[1]} && (*in)[3] == std::vector<unsigned int>{g[1]};
  if (!check(ok, "pfc_center_step", "needs grad (N, S), embeddings (N, D), coef (S,), index (S,), "
             "weight and mom (R, D)")) return MX_FAIL;
  (*out)[0] = {x[0], x[1]}; return MX_SUCCESS;
}
MXReturnValue mutate_step(const std::unordered_map<std::string, std::string>&, std::vector<int>* idx) {
  idx->push_back(4); idx->push_back(5); return MX_SUCCESS;
}

MXReturnValue pool_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 2; *n_out = 2; return MX_SUCCESS;
}
MXReturnValue pool_types(const std::unordered_map<std::string, std::string>&,
                         std::vector<int>* in, std::vector<int>* out) {
  if (!check((*in)[0] == kFloat32 && (*in)[1] == kFloat32, "pfc_subcenter_pool",
             "needs float32 logits and inv_norm")) return MX_FAIL;
  (*out)[0] = kFloat32; (*out)[1] = kInt32; return MX_SUCCESS;
}
MXReturnValue pool_shapes(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in,
                          std::vector<std::vector<unsigned int>>* out) {
  const auto& l = (*in)[0];
  const int64_t K = attr_k(attrs);
  if (!check(K >= 1 && l.size() == 2 && l[1] % K == 0 && (*in)[1] == std::vector<unsigned int>{l[1]},
             "pfc_subcenter_pool", "needs K >= 1, logits (N, S * K) and inv_norm (S * K,)")) return MX_FAIL;
  (*out)[0] = (*out)[1] = {l[0], static_cast<unsigned int>(l[1] / K)}; return MX_SUCCESS;
}

MXReturnValue route_attrs(const std::unordered_map<std::string, std::string>&, int* n_in, int* n_out) {
  *n_in = 4; *n_out = 1; return MX_SUCCESS;
}
MXReturnValue route_types(const std::unordered_map<std::string, std::string>&,
                          std::vector<int>* in, std::vector<int>* out) {
  if (!check((*in)[0] == kFloat32 && (*in)[1] == kFloat32 && (*in)[2] == kInt32 && (*in)[3] == kFloat32,
             "pfc_subcenter_route", "needs float32 logits, inv_norm and grad and an int32 winner")) return MX_FAIL;
  (*out)[0] = kFloat32; return MX_SUCCESS;
}
MXReturnValue route_shapes(const std::unordered_map<std::string, std::string>& attrs,
                           std::vector<std::vector<unsigned int>>* in,
                           std::vector<std::vector<unsigned int>>* out) {
  const auto& l = (*in)[0];
  const auto& w = (*in)[2];
  const int64_t K = attr_k(attrs);
  bool ok = K >= 1 && l.size() == 2 && w.size() == 2 && w[0] == l[0] && int64_t{w[1]} * K == l[1] &&
            (*in)[1] == std::vector<unsigned int>{l[1]} && (*in)[3] == w;
  if (!check(ok, "pfc_subcenter_route", "needs K >= 1, logits (N, S * K), inv_norm (S * K,), winner (N, S) "
             "and grad (N, S)")) return MX_FAIL;
  (*out)[0] = {l[1]}; return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(pfc_subcenter_pool)
.setForward(subcenter_pool, "cpu").setParseAttrs(pool_attrs)
.setInferType(pool_types).setInferShape(pool_shapes);

REGISTER_OP(pfc_subcenter_route)
.setForward(subcenter_route, "cpu").setParseAttrs(route_attrs)
.setInferType(route_types).setInferShape(route_shapes).setMutateInputs(mutate_first);

REGISTER_OP(pfc_inv_norm)
.setForward(inv_norm, "cpu").setParseAttrs(norm_attrs)
.setInferType(norm_types).setInferShape(norm_shapes);

REGISTER_OP(pfc_scale_lse)
.setForward(scale_lse, "cpu").setParseAttrs(lse_attrs)
.setInferType(lse_types).setInferShape(lse_shapes).setMutateInputs(mutate_first);

REGISTER_OP(pfc_softmax_grad)
.setForward(softmax_grad, "cpu").setParseAttrs(grad_attrs)
.setInferType(grad_types).setInferShape(grad_shapes).setMutateInputs(mutate_first);

REGISTER_OP(pfc_sgd_rows)
.setForward(sgd_rows, "cpu").setParseAttrs(sgd_attrs)
.setInferType(sgd_types).setInferShape(sgd_shapes).setMutateInputs(mutate_weight_mom);

REGISTER_OP(pfc_logits)
.setForward(logits, "cpu").setParseAttrs(logits_attrs)
.setInferType(logits_types).setInferShape(logits_shapes);

REGISTER_OP(pfc_center_step)
.setForward(center_step, "cpu").setParseAttrs(step_attrs)
.setInferType(step_types).setInferShape(step_shapes).setMutateInputs(mutate_step);

MXReturnValue initialize(int version) {
  if (version >= 10900) return MX_SUCCESS;
  MX_ERROR_MSG << "mxnet-pfc kernels need MXNet 1.9 or newer, found version " << version;
  return MX_FAIL;
}
