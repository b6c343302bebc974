// Causal flash attention for the CPU, forward and backward, in fp32: titanpod.kernels.cpu_attention.
//
// Legend: B batch, H query heads, K key/value heads (H is a multiple of K), S sequence,
// D head dim (a template parameter: the rows of one head stay in registers).
//
// Each query row sees the keys [lo, i]: lo is its document's first position (packed
// documents) raised to i - window (local attention). A row's scores fit in a buffer of
// S floats, so the softmax is exact over the row (no running rescale); the backward
// recomputes the scores from the saved log-sum-exp. Work is split over (b, h) rows in the
// forward and over (b, kv head) in the backward (so one thread owns a kv head's dK, dV).
// Vectors are GCC/Clang vector extensions of 8 floats; the compiler maps them onto AVX2,
// AVX-512 halves or NEON pairs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int W = 8;   // floats per vector
constexpr int KB = 4;  // key vectors per step: independent accumulator chains
constexpr int R = 2;   // query rows per pass: they share each load of a key's row
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8 splat(float x) { return v8{} + x; }
inline v8 load(const float* p) {
  v8 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void store(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }
inline float hsum(v8 x) {
  float s = 0.f;
  for (int t = 0; t < W; ++t) s += x[t];
  return s;
}
inline float hmax(v8 x) {
  float s = x[0];
  for (int t = 1; t < W; ++t) s = std::max(s, x[t]);
  return s;
}
inline v8 lane_index() { return v8{0, 1, 2, 3, 4, 5, 6, 7}; }

// exp(x) for x <= 0: Cody-Waite reduction to r in [-ln2/2, ln2/2], a degree-6 polynomial,
// then 2^n from the exponent bits. Relative error about 2e-7; x below -87 gives ~0.
inline v8 vexp(v8 x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const v8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  v8 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v8 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 two_n;
  std::memcpy(&two_n, &e, sizeof two_n);
  return p * two_n;
}

struct Problem {
  int64_t B, H, K, S;
  int64_t q[3], k[3], v[3], go[3];  // strides (elements) of b, h, s; d is contiguous
  float scale;
  int64_t window;         // < 0: none
  const int64_t* starts;  // [B, S] first position of each query's document, or null
};

// Row length of the per-thread buffers: S rounded up to whole steps, plus one step, since a row's
// first step starts at its first key rounded down to a vector and may reach past S.
inline int64_t padded(int64_t S) { return (S + KB * W - 1) / (KB * W) * (KB * W) + KB * W; }

inline int64_t first_key(const Problem& p, int64_t b, int64_t i) {
  int64_t lo = p.starts ? p.starts[b * p.S + i] : 0;
  if (p.window >= 0) lo = std::max(lo, i - p.window);
  return lo;
}

// Rows [S, D] with row stride `stride` into a [D, Sp] buffer (keys along vectors), zero-padded.
template <int D>
void transpose(const float* x, int64_t stride, int64_t S, int64_t Sp, float* out) {
  for (int64_t j = 0; j < S; ++j)
    for (int d = 0; d < D; ++d) out[d * Sp + j] = x[j * stride + d];
  for (int d = 0; d < D; ++d) std::fill(out + d * Sp + S, out + (d + 1) * Sp, 0.f);
}

template <int D>
void forward_row_block(const Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
                       int64_t b, int64_t h, float* kt, float* s) {
  const int64_t S = p.S, Sp = padded(S), kh = h / (p.H / p.K);
  const float* qb = q + b * p.q[0] + h * p.q[1];
  const float* vb = v + b * p.v[0] + kh * p.v[1];
  float* ob = o + (b * p.H + h) * S * D;
  float* lb = lse + (b * p.H + h) * S;
  transpose<D>(k + b * p.k[0] + kh * p.k[1], p.k[2], S, Sp, kt);
  for (int64_t i0 = 0; i0 < S; i0 += R) {
    // Rows i0 and i0 + 1 share each load of K and V; past the end, the second row repeats the first.
    int64_t lo[R], hi[R];
    float qs[R][D];
    for (int r = 0; r < R; ++r) {
      const int64_t i = std::min(i0 + r, S - 1);
      lo[r] = first_key(p, b, i);
      hi[r] = i;
      for (int d = 0; d < D; ++d) qs[r][d] = qb[i * p.q[2] + d] * p.scale;
    }
    const int64_t first = std::min(lo[0], lo[1]), last = std::max(hi[0], hi[1]);
    const int64_t j0 = first / W * W, j1 = j0 + (last + 1 - j0 + KB * W - 1) / (KB * W) * (KB * W);
    v8 running_max[R] = {splat(-3.0e38f), splat(-3.0e38f)};
    for (int64_t jb = j0; jb < j1; jb += KB * W) {
      v8 acc[R][KB] = {};
      for (int d = 0; d < D; ++d)
        for (int u = 0; u < KB; ++u) {
          const v8 kr = load(kt + d * Sp + jb + u * W);
          acc[0][u] += qs[0][d] * kr;
          acc[1][u] += qs[1][d] * kr;
        }
      for (int r = 0; r < R; ++r)
        for (int u = 0; u < KB; ++u) {
          const v8 j = lane_index() + float(jb + u * W);
          const v8 x = (j >= splat(float(lo[r])) && j <= splat(float(hi[r]))) ? acc[r][u] : splat(-3.0e38f);
          store(s + r * Sp + jb + u * W, x);
          running_max[r] = running_max[r] > x ? running_max[r] : x;
        }
    }
    float m[R], l[R];
    for (int r = 0; r < R; ++r) {
      m[r] = hmax(running_max[r]);
      v8 total{};
      for (int64_t jb = j0; jb < j1; jb += W) {
        const v8 x = load(s + r * Sp + jb);
        const v8 e = x > -1.0e38f ? vexp(x - m[r]) : v8{};  // masked keys weigh exactly 0
        store(s + r * Sp + jb, e);
        total += e;
      }
      l[r] = hsum(total);
    }
    constexpr int U = 2;  // keys per step in P @ V: independent accumulators
    v8 acc[R][U][D / W] = {};
    int64_t j = first;
    for (; j + U <= last + 1; j += U)
      for (int u = 0; u < U; ++u) {
        const float* vj = vb + (j + u) * p.v[2];
        const float p0 = s[j + u], p1 = s[Sp + j + u];
        for (int c = 0; c < D / W; ++c) {
          const v8 vjc = load(vj + c * W);
          acc[0][u][c] += p0 * vjc;
          acc[1][u][c] += p1 * vjc;
        }
      }
    for (; j <= last; ++j)
      for (int c = 0; c < D / W; ++c) {
        const v8 vjc = load(vb + j * p.v[2] + c * W);
        acc[0][0][c] += s[j] * vjc;
        acc[1][0][c] += s[Sp + j] * vjc;
      }
    for (int r = 0; r < R && i0 + r < S; ++r) {
      const float inv = 1.f / l[r];
      for (int c = 0; c < D / W; ++c) store(ob + (i0 + r) * D + c * W, (acc[r][0][c] + acc[r][1][c]) * inv);
      lb[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

template <int D>
void backward_kv_head(const Problem& p, const float* q, const float* k, const float* v, const float* o,
                      const float* lse, const float* go, float* gq, float* gk, float* gv, int64_t b, int64_t kh,
                      float* kt, float* vt, float* prob, float* ds, float* dk, float* dv) {
  const int64_t S = p.S, Sp = padded(S), G = p.H / p.K;
  const float* kb = k + b * p.k[0] + kh * p.k[1];
  transpose<D>(kb, p.k[2], S, Sp, kt);
  transpose<D>(v + b * p.v[0] + kh * p.v[1], p.v[2], S, Sp, vt);
  std::fill(dk, dk + S * D, 0.f);
  std::fill(dv, dv + S * D, 0.f);
  for (int64_t h = kh * G; h < (kh + 1) * G; ++h) {
    const float* qb = q + b * p.q[0] + h * p.q[1];
    const float* gob = go + b * p.go[0] + h * p.go[1];
    const float* ob = o + (b * p.H + h) * S * D;
    float* gqb = gq + (b * p.H + h) * S * D;
    const float* lb = lse + (b * p.H + h) * S;
    for (int64_t i0 = 0; i0 < S; i0 += R) {
      // Rows i0 and i0 + 1; past the end, the second row repeats the first with no keys.
      int64_t lo[R], hi[R];
      float qs[R][D], g[R][D], delta[R], row_lse[R];
      for (int r = 0; r < R; ++r) {
        const int64_t i = std::min(i0 + r, S - 1);
        lo[r] = first_key(p, b, i);
        hi[r] = i0 + r < S ? i : lo[r] - 1;
        delta[r] = 0.f;
        for (int d = 0; d < D; ++d) {
          qs[r][d] = qb[i * p.q[2] + d] * p.scale;
          g[r][d] = gob[i * p.go[2] + d];
          delta[r] += g[r][d] * ob[i * D + d];
        }
        row_lse[r] = lb[i];
      }
      const int64_t first = std::min(lo[0], lo[1]), last = std::max(hi[0], hi[1]);
      const int64_t j0 = first / W * W, j1 = j0 + (last + 1 - j0 + KB * W - 1) / (KB * W) * (KB * W);
      for (int r = 0; r < R; ++r) {
        const v8 row_first = splat(float(lo[r])), row_last = splat(float(hi[r]));
        float* row_prob = prob + r * Sp;
        float* row_ds = ds + r * Sp;
        for (int64_t jb = j0; jb < j1; jb += KB * W) {
          v8 score[KB] = {}, dp[KB] = {};
          for (int d = 0; d < D; ++d)
            for (int u = 0; u < KB; ++u) {
              score[u] += qs[r][d] * load(kt + d * Sp + jb + u * W);
              dp[u] += g[r][d] * load(vt + d * Sp + jb + u * W);
            }
          for (int u = 0; u < KB; ++u) {
            const v8 j = lane_index() + float(jb + u * W);
            v8 pj = vexp(score[u] - row_lse[r]);
            pj = (j >= row_first && j <= row_last) ? pj : v8{};
            store(row_prob + jb + u * W, pj);
            store(row_ds + jb + u * W, pj * (dp[u] - delta[r]));
          }
        }
      }
      // dV += P^T dO, dK += dS^T Q (one read-modify-write of each key's rows for both query rows), dQ = dS K.
      v8 dq0[D / W] = {}, dq1[D / W] = {}, g0[D / W], g1[D / W], q0[D / W], q1[D / W];
      for (int c = 0; c < D / W; ++c) {
        g0[c] = load(g[0] + c * W);
        g1[c] = load(g[1] + c * W);
        q0[c] = load(qs[0] + c * W);
        q1[c] = load(qs[1] + c * W);
      }
      for (int64_t j = first; j <= last; ++j) {
        const float p0 = prob[j], p1 = prob[Sp + j], ds0 = ds[j], ds1 = ds[Sp + j];
        const float* kj = kb + j * p.k[2];
        float* dvj = dv + j * D;
        float* dkj = dk + j * D;
        for (int c = 0; c < D / W; ++c) {
          const v8 kjc = load(kj + c * W);
          store(dvj + c * W, load(dvj + c * W) + p0 * g0[c] + p1 * g1[c]);
          dq0[c] += ds0 * kjc;
          dq1[c] += ds1 * kjc;
          store(dkj + c * W, load(dkj + c * W) + ds0 * q0[c] + ds1 * q1[c]);
        }
      }
      for (int c = 0; c < D / W; ++c) {
        store(gqb + i0 * D + c * W, dq0[c] * p.scale);
        if (i0 + 1 < S) store(gqb + (i0 + 1) * D + c * W, dq1[c] * p.scale);
      }
    }
  }
  std::memcpy(gk + (b * p.K + kh) * S * D, dk, sizeof(float) * S * D);
  std::memcpy(gv + (b * p.K + kh) * S * D, dv, sizeof(float) * S * D);
}

// Runs f(first, end) over [0, n) split evenly across `threads` threads. Built with OpenMP, these are the
// process's OpenMP threads (torch's own pool, so none spins against another); else std::threads.
template <typename F>
void parallel(int64_t n, int threads, F f) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    f(t * n / T, (t + 1) * n / T);
  }
#else
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back([&, t] { f(t * n / threads, (t + 1) * n / threads); });
  f(0, n / threads);
  for (auto& th : pool) th.join();
#endif
}

template <int D>
void forward(const Problem& p, const float* q, const float* k, const float* v, float* o, float* lse, int threads) {
  parallel(p.B * p.H, threads, [&](int64_t first, int64_t end) {
    std::vector<float> kt(D * padded(p.S)), s(R * padded(p.S));
    for (int64_t n = first; n < end; ++n) forward_row_block<D>(p, q, k, v, o, lse, n / p.H, n % p.H, kt.data(), s.data());
  });
}

template <int D>
void backward(const Problem& p, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* go, float* gq, float* gk, float* gv, int threads) {
  parallel(p.B * p.K, threads, [&](int64_t first, int64_t end) {
    const int64_t Sp = padded(p.S);
    std::vector<float> kt(D * Sp), vt(D * Sp), prob(R * Sp), ds(R * Sp), dk(p.S * D), dv(p.S * D);
    for (int64_t n = first; n < end; ++n)
      backward_kv_head<D>(p, q, k, v, o, lse, go, gq, gk, gv, n / p.K, n % p.K, kt.data(), vt.data(), prob.data(),
                          ds.data(), dk.data(), dv.data());
  });
}

Problem make_problem(const int64_t* dims, const int64_t* strides, float scale, int64_t window, const int64_t* starts) {
  Problem p{dims[0], dims[1], dims[2], dims[3], {}, {}, {}, {}, scale, window, starts};
  for (int a = 0; a < 3; ++a) {
    p.q[a] = strides[a];
    p.k[a] = strides[3 + a];
    p.v[a] = strides[6 + a];
    p.go[a] = strides[9 + a];
  }
  return p;
}

}  // namespace

extern "C" {

// dims: B, H, K, S, D. strides: (b, h, s) of q, k, v, grad_out (the last unused here).
// o [B, H, S, D] and lse [B, H, S] are written contiguous. Returns 1 for an unsupported D.
int titanpod_attention_forward(const int64_t* dims, const int64_t* strides, float scale, int64_t window,
                               const int64_t* starts, const float* q, const float* k, const float* v, float* o,
                               float* lse, int threads) {
  const Problem p = make_problem(dims, strides, scale, window, starts);
  switch (dims[4]) {
    case 16: forward<16>(p, q, k, v, o, lse, threads); return 0;
    case 32: forward<32>(p, q, k, v, o, lse, threads); return 0;
    case 64: forward<64>(p, q, k, v, o, lse, threads); return 0;
    case 128: forward<128>(p, q, k, v, o, lse, threads); return 0;
    default: return 1;
  }
}

// o and lse as the forward wrote them; gq [B, H, S, D], gk and gv [B, K, S, D] are written contiguous.
int titanpod_attention_backward(const int64_t* dims, const int64_t* strides, float scale, int64_t window,
                                const int64_t* starts, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, const float* go, float* gq, float* gk, float* gv, int threads) {
  const Problem p = make_problem(dims, strides, scale, window, starts);
  switch (dims[4]) {
    case 16: backward<16>(p, q, k, v, o, lse, go, gq, gk, gv, threads); return 0;
    case 32: backward<32>(p, q, k, v, o, lse, go, gq, gk, gv, threads); return 0;
    case 64: backward<64>(p, q, k, v, o, lse, go, gq, gk, gv, threads); return 0;
    case 128: backward<128>(p, q, k, v, o, lse, go, gq, gk, gv, threads); return 0;
    default: return 1;
  }
}
}
