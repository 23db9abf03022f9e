#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>

static inline __m512 h16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

template <int MR>
static void tile(const uint8_t* c, const uint16_t* sc, const uint16_t* mn, int KB,
                 const int8_t* qx, const float* dx, const float* sx, int K, int ldo, float* out) {
  __m512 accf[MR];
  for (int r = 0; r < MR; ++r) accf[r] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (int b = 0; b < KB; ++b) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) {
      __m512i v = _mm512_loadu_si512((const void*)(c + (b * 4 + o) * 64));
      __m512i lo = _mm512_and_si512(v, mask);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = qx + r * K + b * 32 + o * 8;
        acc[r] = _mm512_dpbusd_epi32(acc[r], lo, _mm512_set1_epi32(*(const int32_t*)xr));
        acc[r] = _mm512_dpbusd_epi32(acc[r], hi, _mm512_set1_epi32(*(const int32_t*)(xr + 4)));
      }
    }
    __m512 d = h16(sc + b * 16), m = h16(mn + b * 16);
    for (int r = 0; r < MR; ++r) {
      accf[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]),
                                _mm512_mul_ps(d, _mm512_set1_ps(dx[r * KB + b])), accf[r]);
      accf[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[r * KB + b]), accf[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(out + r * ldo, accf[r]);
}

// x [M, K] bf16; codes [N/16, K/8, 64] u8; scale/min [N/16, K/32, 16] fp16 -> [M, N] bf16
torch::Tensor gemv(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor minv) {
  const int M = x.size(0), K = x.size(1), NT = codes.size(0), N = NT * 16, KB = K / 32;
  auto xf = x.to(torch::kFloat32).contiguous();
  auto qx = torch::empty({M, K}, torch::kInt8);
  auto dx = torch::empty({M, KB}, torch::kFloat32);
  auto sx = torch::empty({M, KB}, torch::kFloat32);
  const float* xp = xf.data_ptr<float>();
  int8_t* q = qx.data_ptr<int8_t>();
  float* dp = dx.data_ptr<float>(); float* sp = sx.data_ptr<float>();
  for (int i = 0; i < M * KB; ++i) {
    const float* v = xp + i * 32;
    float amax = 0.f, s = 0.f;
    for (int j = 0; j < 32; ++j) { amax = std::max(amax, std::fabs(v[j])); s += v[j]; }
    float d = amax / 127.f, inv = d > 0 ? 1.f / d : 0.f;
    for (int j = 0; j < 32; ++j) q[i * 32 + j] = (int8_t)std::nearbyint(v[j] * inv);
    dp[i] = d; sp[i] = s;
  }
  auto out = torch::empty({M, N}, torch::kFloat32);
  float* o = out.data_ptr<float>();
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const uint16_t* sc = (const uint16_t*)scale.data_ptr<at::Half>();
  const uint16_t* mn = (const uint16_t*)minv.data_ptr<at::Half>();
  at::parallel_for(0, NT, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* ct = c + t * (K / 8) * 64;
      const uint16_t* st = sc + t * KB * 16; const uint16_t* mt = mn + t * KB * 16;
      int r = 0;
      for (; r + 4 <= M; r += 4) tile<4>(ct, st, mt, KB, q + r * K, dp + r * KB, sp + r * KB, K, N, o + r * N + t * 16);
      for (; r < M; ++r) tile<1>(ct, st, mt, KB, q + r * K, dp + r * KB, sp + r * KB, K, N, o + r * N + t * 16);
    }
  });
  return out.to(x.scalar_type());
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv); }
