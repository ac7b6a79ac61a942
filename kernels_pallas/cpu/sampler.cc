// One fused sampling pass per row for the CPU, called from XLA through the FFI.
//
// Contract (pagedjax/sample/sampler.py holds the jnp path with the same rules):
//   x f32[R, V] processed logits (bans, bias, penalties already applied),
//   temperature f32[R] (1 for greedy rows), greedy s32[R], top_k s32[R]
//   (>= V: off), top_p f32[R] (>= 1: off), min_p f32[R] (<= 0: off),
//   u f32[R] one uniform in [0, 1) per row  ->  token s32[R].
// Per row, in vLLM V1's order: greedy rows take the first argmax of x.
// Others: z = x / T, m = max z; min-p drops z < m + log(min_p); e = exp(z - m);
// top-k keeps z >= the k-th largest z; top-p then keeps the smallest set of
// the largest z whose mass reaches p of the top-k mass (ties at the cut are
// kept, as in the jnp path); the token is the first index whose running sum
// of kept e exceeds u * (kept mass), i.e. an inverse-CDF draw.
//
// Why: with a 49,152-token vocabulary XLA:CPU's lax.top_k / argmax run at a
// few ns per logit and a full sort at ~40 ns. Here the thresholds come from
// a histogram of e's float bits (order-preserving for e in [0, 1]: 16 buckets
// per power of two), then the one bucket that holds the cut is sorted -- one
// pass over the row plus a small sort, no full sort, exact. Rows are
// independent (a row's token never depends on the others) and run on XLA's
// intra-op thread pool, claimed from an atomic counter.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "isa.h"
#include "parallel.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using pagedjax_simd::v8f;
using pagedjax_simd::v8i;

constexpr int kShift = 19;                       // float bits >> 19: 16 buckets per binade
constexpr int kBuckets = (0x3F800000 >> kShift) + 1;  // e in [0, 1]: bucket of 1.0 is the last

using pagedjax_simd::load8;
using pagedjax_simd::store8;

// exp(x) for x <= 0, 8 lanes; 0 below -87 (and for -inf). ~2 ulp (Cephes' polynomial).
inline v8f exp8(v8f x) {
  const v8i live = x >= -87.0f;
  x = x < -87.0f ? v8f{} - 87.0f : x;
  const v8f magic = v8f{} + 12582912.0f;  // 1.5 * 2^23: round to nearest
  v8f n = (x * 1.44269504088896341f + magic) - magic;
  v8f r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  v8f out = p * scale;
  v8i o;
  std::memcpy(&o, &out, sizeof(o));
  o &= live;
  std::memcpy(&out, &o, sizeof(out));
  return out;
}

inline float exp1(float x) {
  float buf[8] = {x, 0, 0, 0, 0, 0, 0, 0};
  return exp8(load8(buf))[0];
}

inline int bucket_of(float e) {
  uint32_t b;
  std::memcpy(&b, &e, 4);
  return int(b >> kShift);
}

constexpr int64_t kBlock = 256;  // draw: block sums first, then one block's running sum
constexpr int kHist = 4;         // interleaved histogram copies (see histogram())

struct Row {
  std::vector<float> z, e;       // z after min-p (-inf = dropped); e = exp(z - m)
  std::vector<float> mass;       // histogram of e: mass or count per bucket (kHist copies)
  std::vector<int32_t> count;
  std::vector<float> block;      // kept mass per block of kBlock logits
  std::vector<std::pair<float, float>> cand;  // (z, e) of the bucket holding a cut
  void size(int64_t V) {
    if (int64_t(z.size()) == V) return;
    z.resize(V);
    e.resize(V);
    mass.resize(kHist * kBuckets);
    count.resize(kHist * kBuckets);
    block.resize((V + kBlock - 1) / kBlock);
  }
};

// First index of the largest x[i] / t (t == 1: x itself); writes z = x / t when z != null.
std::pair<int64_t, float> argmax_scaled(const float* x, int64_t V, float t, float* z) {
  v8f vmax = v8f{} - INFINITY;
  v8i vidx = v8i{} - 1, lane = {0, 1, 2, 3, 4, 5, 6, 7};
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    v8f v = load8(x + i);
    if (t != 1.0f) v = v / t;
    if (z) store8(z + i, v);
    const v8i gt = v > vmax;
    vmax = gt ? v : vmax;
    vidx = gt ? lane + int32_t(i) : vidx;
  }
  float best = -INFINITY;
  int64_t arg = V;
  for (int j = 0; j < 8; ++j)
    if (vidx[j] >= 0 && (vmax[j] > best || (vmax[j] == best && vidx[j] < arg))) {
      best = vmax[j];
      arg = vidx[j];
    }
  for (; i < V; ++i) {
    const float v = t != 1.0f ? x[i] / t : x[i];
    if (z) z[i] = v;
    if (v > best) {
      best = v;
      arg = i;
    }
  }
  if (arg == V) arg = 0;  // all -inf or NaN
  return {arg, best};
}

// Largest z value such that (number / mass of elements with z >= it) first
// reaches `target`, walking buckets from the top. `by_count`: count elements
// (top-k), else sum e (top-p). Only elements with z >= floor take part.
float cut(Row& w, int64_t V, double target, bool by_count, float floor) {
  double cum = 0.0;
  int b = kBuckets - 1;
  for (; b >= 0; --b) {
    double add = by_count ? double(w.count[b]) : double(w.mass[b]);
    if (cum + add >= target) break;
    cum += add;
  }
  if (b < 0) return floor;  // never reached (rounding): keep everything above floor
  w.cand.clear();
  const float* z = w.z.data();
  const float* e = w.e.data();
  // e in bucket b <=> lo_bits <= bits(e) < hi_bits: compare 8 lanes, look closer on a hit
  const int32_t lo_bits = int32_t(b) << kShift, hi_bits = int32_t(b + 1) << kShift;
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    v8i bits;
    std::memcpy(&bits, e + i, 32);
    const v8i hit = (bits >= lo_bits) & (bits < hi_bits);
    bool any = false;
    for (int j = 0; j < 8; ++j) any |= hit[j] != 0;
    if (!any) continue;
    for (int j = 0; j < 8; ++j)
      if (hit[j] && z[i + j] >= floor) w.cand.emplace_back(z[i + j], e[i + j]);
  }
  for (; i < V; ++i)
    if (bucket_of(e[i]) == b && z[i] >= floor) w.cand.emplace_back(z[i], e[i]);
  std::sort(w.cand.begin(), w.cand.end(),
            [](const auto& a, const auto& c) { return a.first > c.first; });
  for (const auto& [zv, ev] : w.cand) {
    cum += by_count ? 1.0 : double(ev);
    if (cum >= target) return zv;
  }
  return floor;
}

// Histogram of e over elements with z >= floor: counts (top-k) or mass (top-p).
// kHist interleaved copies, merged into copy 0 at the end: a language model's
// tail puts long runs of logits into one bucket, and one copy would chain every
// update of that bucket through a store and a reload.
void histogram(Row& w, int64_t V, float floor, bool by_count) {
  const float* z = w.z.data();
  const float* e = w.e.data();
  int64_t i = 0;
  if (by_count) {  // top-k: floor is -inf
    int32_t* c = w.count.data();
    std::fill(w.count.begin(), w.count.end(), 0);
    for (; i + kHist <= V; i += kHist)
      for (int h = 0; h < kHist; ++h) c[h * kBuckets + bucket_of(e[i + h])] += 1;
    for (; i < V; ++i) c[bucket_of(e[i])] += 1;
    for (int h = 1; h < kHist; ++h)
      for (int b = 0; b < kBuckets; ++b) c[b] += c[h * kBuckets + b];
    return;
  }
  float* m = w.mass.data();
  std::fill(w.mass.begin(), w.mass.end(), 0.0f);
  for (; i + kHist <= V; i += kHist)
    for (int h = 0; h < kHist; ++h)
      m[h * kBuckets + bucket_of(e[i + h])] += z[i + h] >= floor ? e[i + h] : 0.0f;
  for (; i < V; ++i) m[bucket_of(e[i])] += z[i] >= floor ? e[i] : 0.0f;
  for (int h = 1; h < kHist; ++h)
    for (int b = 0; b < kBuckets; ++b) m[b] += m[h * kBuckets + b];
}

// Kept mass (z >= thr) per block of kBlock, 8 lanes at a time; returns the total.
float block_sums(Row& w, int64_t V, float thr) {
  const float* z = w.z.data();
  const float* e = w.e.data();
  float total = 0.0f;
  for (int64_t b0 = 0, k = 0; b0 < V; b0 += kBlock, ++k) {
    const int64_t b1 = std::min(V, b0 + kBlock);
    v8f acc = v8f{};
    int64_t i = b0;
    for (; i + 8 <= b1; i += 8) {
      const v8f ev = load8(e + i);
      acc += load8(z + i) >= thr ? ev : v8f{};
    }
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < b1; ++i) s += z[i] >= thr ? e[i] : 0.0f;
    w.block[k] = s;
    total += s;
  }
  return total;
}

// Inverse CDF over the kept elements: block sums first, then one block in order.
int64_t draw(Row& w, int64_t V, float thr, float total, float u, int64_t best) {
  if (!(total > 0.0f)) return best;
  const float target = std::min(u * total, total * (1.0f - 0x1p-20f));
  const int64_t nb = int64_t(w.block.size());
  float before = 0.0f;
  int64_t k = 0;
  for (; k < nb - 1; ++k) {
    if (before + w.block[k] > target) break;
    before += w.block[k];
  }
  while (k > 0 && !(w.block[k] > 0.0f)) --k;  // rounding: never land on an empty block
  const float* z = w.z.data();
  const float* e = w.e.data();
  const float t2 = target - before;
  float c = 0.0f;
  int64_t last = -1;
  for (int64_t i = k * kBlock; i < std::min(V, (k + 1) * kBlock); ++i) {
    if (z[i] >= thr && e[i] > 0.0f) {
      c += e[i];
      last = i;
      if (c > t2) return i;
    }
  }
  return last >= 0 ? last : best;
}

int32_t sample_row(Row& w, const float* x, int64_t V, float t, int32_t k, float p, float min_p,
                   float u) {
  float* z = w.z.data();
  float* e = w.e.data();
  auto [best, m] = argmax_scaled(x, V, t, z);
  if (!std::isfinite(m)) m = 0.0f;
  const float lo = min_p > 0.0f ? m + std::log(min_p) : -INFINITY;
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    v8f zv = load8(z + i);
    if (min_p > 0.0f) {
      zv = zv >= lo ? zv : v8f{} - INFINITY;
      store8(z + i, zv);
    }
    store8(e + i, exp8(zv - m));
  }
  for (; i < V; ++i) {
    if (!(z[i] >= lo)) z[i] = -INFINITY;
    e[i] = exp1(z[i] - m);
  }
  float thr = -INFINITY;
  if (k < V) {
    histogram(w, V, -INFINITY, true);
    thr = cut(w, V, double(std::max(k, 1)), true, -INFINITY);
  }
  if (p < 1.0f) {
    histogram(w, V, thr, false);
    double zk = 0.0;
    for (int b = 0; b < kBuckets; ++b) zk += w.mass[b];
    thr = cut(w, V, double(p) * zk, false, thr);
  }
  return int32_t(draw(w, V, thr, block_sums(w, V, thr), u, best));
}

struct Work : pagedjax_parallel::Tasks {  // one task per row
  const float *x, *temp, *top_p, *min_p, *u;
  const int32_t *greedy, *top_k;
  int32_t* out;
  int64_t R, V;

  void run() {
    Row w;
    for (int64_t r; (r = claim()) >= 0; finish()) {
      const float* xr = x + r * V;
      if (greedy[r]) {
        out[r] = int32_t(argmax_scaled(xr, V, 1.0f, nullptr).first);
      } else {
        w.size(V);
        out[r] = sample_row(w, xr, V, temp[r], top_k[r], top_p[r], min_p[r], u[r]);
      }
    }
  }
};

ffi::Error SampleImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> temp,
                      ffi::Buffer<ffi::S32> greedy, ffi::Buffer<ffi::S32> top_k,
                      ffi::Buffer<ffi::F32> top_p, ffi::Buffer<ffi::F32> min_p,
                      ffi::Buffer<ffi::F32> u, ffi::Result<ffi::Buffer<ffi::S32>> out) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("cpu sampler: logits must be 2-d");
  const int64_t R = xd[0], V = xd[1];
  for (auto d : {temp.dimensions(), greedy.dimensions(), top_k.dimensions(), top_p.dimensions(),
                 min_p.dimensions(), u.dimensions(), out->dimensions()})
    if (d.size() != 1 || d[0] != R)
      return ffi::Error::InvalidArgument("cpu sampler: per-row arrays must be [rows]");
  if (V == 0 && R > 0) return ffi::Error::InvalidArgument("cpu sampler: empty vocabulary");
  auto work = std::make_shared<Work>();
  work->x = x.typed_data();
  work->temp = temp.typed_data();
  work->greedy = greedy.typed_data();
  work->top_k = top_k.typed_data();
  work->top_p = top_p.typed_data();
  work->min_p = min_p.typed_data();
  work->u = u.typed_data();
  work->out = out->typed_data();
  work->R = R;
  work->V = V;
  work->n_tasks = R;
  pagedjax_parallel::run_on_pool(work, pool, R * V >= (1 << 16));
  return ffi::Error::Success();
}

}  // namespace

// Run once in a child process right after a build (kernels_pallas/cpu/build.py): 0 = fine.
extern "C" int PagedjaxSelfTest() {
  const int64_t V = 1000;
  std::vector<float> x(V);
  for (int64_t i = 0; i < V; ++i) x[i] = float((i * 37) % 1009) * 0.005f;  // distinct
  Row w;
  w.size(V);
  int bad = 0;
  int64_t first = 0;
  for (int64_t i = 1; i < V; ++i)
    if (x[i] > x[first]) first = i;
  const int64_t best = argmax_scaled(x.data(), V, 1.0f, nullptr).first;
  bad |= best != first;
  bad |= sample_row(w, x.data(), V, 1.0f, 1, 1.0f, 0.0f, 0.7f) != best;    // top-k 1
  const int32_t t = sample_row(w, x.data(), V, 0.7f, 50, 0.9f, 0.01f, 0.3f);
  bad |= t < 0 || t >= V || x[t] < 0.9f * x[first];
  bad |= pagedjax_isa::avx512_self_test();
  return bad;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxSample, SampleImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
