// int8 weights with one scale per output row times float32 rows, for CPUs with AVX2 (the
// int8 LM head's calls where torch's int8 kernel, _weight_int8pack_mm, runs unvectorised):
//   y[m, n] = scale[n] * sum_k q[n, k] * x[m, k]
// the arithmetic of torch's kernel (the codes widened to float, float products and sums) in
// another order of the additions. The codes are read in place, 8 a load widened in
// registers (vpmovsxbd + vcvtdq2ps), so a call streams the int8 bytes once per group of up
// to 4 rows of x, where an fp16 copy of the weight (fbgemm) streams twice as many.
//
// Each thread takes a range of output rows; 8 accumulators of 8 lanes at a time (8 output
// rows by 1 row of x, 4 by 2 or 2 by 4): enough independent FMA chains to hide their
// latency, and the rows of x stay in L1. The 8 accumulators' horizontal sums come out of
// one tree of pairwise adds. Plain C ABI (called through ctypes): no torch headers.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace {

// sums[t] = the sum of x[t]'s 8 lanes, t < 8
inline __m256 sum8(const __m256* x) {
  __m256 h[4];
  for (int t = 0; t < 4; ++t) h[t] = _mm256_hadd_ps(x[2 * t], x[2 * t + 1]);
  const __m256 lo = _mm256_hadd_ps(h[0], h[1]), hi = _mm256_hadd_ps(h[2], h[3]);
  // lo: x0..x3's sums of lanes 0-3 then of lanes 4-7; hi: x4..x7's
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

// the sum of x's 8 lanes, added in sum8's order
inline float sum1(__m256 x) {
  const __m256 pairs = _mm256_hadd_ps(x, x);
  const __m256 quads = _mm256_hadd_ps(pairs, pairs);
  return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
}

inline __m256 codes8(const int8_t* p) {  // 8 int8 codes -> 8 floats (exact)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Rows of q just ahead of these: on their way from memory while these are summed
constexpr int kAheadRows = 32;

// Output rows n0 .. n0 + NB - 1 for MR rows of x (NB * MR = 8): out[r * N + n].
template <int MR, int NB>
void block(const float* x, int64_t K, const int8_t* q, const float* scale, int64_t n0, int64_t N,
           float* out) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const int8_t* w = q + n0 * K;
  for (int64_t k = 0; k < K; k += 8) {
    if ((k & 63) == 0 && n0 + NB + kAheadRows <= N)
      for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + (j + kAheadRows) * K + k), _MM_HINT_T0);
    __m256 xs[MR];
    for (int r = 0; r < MR; ++r) xs[r] = _mm256_loadu_ps(x + r * K + k);
    for (int j = 0; j < NB; ++j) {
      const __m256 c = codes8(w + j * K + k);
      for (int r = 0; r < MR; ++r) acc[r * NB + j] = _mm256_fmadd_ps(c, xs[r], acc[r * NB + j]);
    }
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, sum8(acc));
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r * N + n0 + j] = sums[r * NB + j] * scale[n0 + j];
}

// One output row for MR rows of x (the rows past the last whole block of NB)
template <int MR>
void single(const float* x, int64_t K, const int8_t* q, const float* scale, int64_t n, int64_t N,
            float* out) {
  for (int r = 0; r < MR; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8)
      acc = _mm256_fmadd_ps(codes8(q + n * K + k), _mm256_loadu_ps(x + r * K + k), acc);
    out[r * N + n] = sum1(acc) * scale[n];
  }
}

template <int MR, int NB>
void rows(const float* x, int64_t K, const int8_t* q, const float* scale, int64_t n0, int64_t n1,
          int64_t N, float* out) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) block<MR, NB>(x, K, q, scale, n, N, out);
  for (; n < n1; ++n) single<MR>(x, K, q, scale, n, N, out);
}

}  // namespace

extern "C" {

// x: [M, K] float32 rows; q: [N, K] int8 codes; scale: [N] float32; out: [M, N] float32.
// K a multiple of 8. Returns 0, or -1 for shapes this build does not serve.
int ft_int8_rows(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale,
                 int64_t N, float* out, int threads) {
  if (K % 8 != 0 || M < 1 || N < 1) return -1;
  // output rows per task: whole blocks of 8, several tasks a thread for balance
  const int64_t chunk = std::max<int64_t>(8, (N / (4 * std::max(threads, 1)) + 7) / 8 * 8);
  const int64_t tasks = (N + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n0 = t * chunk, n1 = std::min(N, n0 + chunk);
    // the rows of x in fours (each group streams the codes once), the rest in a 1-3 group
    for (int64_t m = 0; m < M;) {
      const float* xm = x + m * K;
      float* om = out + m * N;
      const int64_t left = M - m;
      if (left >= 4) {
        rows<4, 2>(xm, K, q, scale, n0, n1, N, om);
        m += 4;
      } else if (left >= 2) {
        rows<2, 4>(xm, K, q, scale, n0, n1, N, om);
        m += 2;
      } else {
        rows<1, 8>(xm, K, q, scale, n0, n1, N, om);
        m += 1;
      }
    }
  }
  return 0;
}

}  // extern "C"
