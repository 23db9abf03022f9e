// int4 weight codes times int8 activations on AVX-512 VNNI, for matmuls of a few rows (the
// CPU's decode steps): the op firsttoken::int4_w4a8_mm; and firsttoken::int4_w4a8_dequant_t,
// the same codes dequantised for the dense copies and the calls of many rows.
//
// Each call quantises its rows to int8 per block of 32 inputs (a scale d = amax / 127 and
// the block's exact float sum s), then for each tile of 16 output rows and each block adds
//   scale[n] * d * sum(code * q) + min[n] * s
// where sum(code * q) is an integer dot product (vpdpbusd: 4 unsigned codes by 4 signed
// activations per lane and instruction). torch's int4 kernel widens every code to float
// and does a float FMA per weight; here a 64-byte load feeds 128 codes to two instructions.
//
// Weight layout (packed once at load by backend.layers.cpu_w4a8.pack):
//   codes      [N/16, K/8, 64] uint8: tile t, block b, octet o (bytes (4b+o)*64 ...) holds
//              for output row 16t+r the bytes r*4+j: low nibble code[16t+r][32b+8o+j], high
//              nibble code[16t+r][32b+8o+4+j]  (j = 0..3)
//   scale_min  [N/16, K/32, 2, 16] fp16: the scale, then the min, of the 16 rows' block b
// Two builds of this file, by the CPU (backend.layers.cpu_w4a8.ISAS): with AVX-512 VNNI the
// dot products are vpdpbusd; with AVX2 alone (no __AVX512VNNI__) the same sums come from
// vpmaddubsw (pairs of code x activation products into int16: at most 2 * 15 * 127, so no
// saturation, and four octets' sums, 30,480 at most, still fit) then vpmaddwd by ones into
// int32, the 16 rows of a tile in two halves of 8 lanes; the quantising of the rows and the
// dequantising are scalar there, with the same roundings (the same bits as AVX-512's).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

constexpr int kBlock = 32;  // inputs per activation scale
constexpr int kTile = 16;   // output rows per tile (one vector of int32 lanes)

#if defined(__AVX512VNNI__)

inline __m512 load16(const at::BFloat16* p) {  // exact: bf16 is fp32's top half
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline void store16(at::BFloat16* p, __m512 x) {  // round to nearest even; NaN stays NaN
  __m512i u = _mm512_castps_si512(x);
  __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                  _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store16(at::Half* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }

// One row of x, block by block: int8 codes q with d = amax / 127, and the float sum (the
// min term's exact factor). With PARTS = 2 the remainder x - d q is quantised the same way
// into q2 (d2 = its amax / 127, at most d / 254): x = d q + d2 q2 to about 2^-15 of the
// block's largest value, where one part keeps 2^-8. A block of zeros gets d = 0, codes 0.
template <int PARTS, typename T>
void quantise_row(const T* x, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t KB = K / kBlock;
  for (int64_t b = 0; b < KB; ++b) {
    __m512 v[2] = {load16(x + b * kBlock), load16(x + b * kBlock + 16)};
    s[b] = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
    for (int part = 0; part < PARTS; ++part) {
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
      float db = amax / 127.f;
      d[part * KB + b] = db;
      __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      int8_t* qb = q + part * K + b * kBlock;
      for (int h = 0; h < 2; ++h) {
        // cvtps rounds to nearest even (the default MXCSR); |v| * inv <= 127: no saturation
        __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + h * 16), _mm512_cvtsepi32_epi8(c));
        v[h] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(db), v[h]);  // remainder
      }
    }
  }
}

// MR rows of x against one tile of 16 output rows; out + r * ldo receives row r's 16
// outputs. Row r's PARTS code rows start at q + (r * PARTS + part) * K, their scales at
// d + (r * PARTS + part) * KB, its sums at s + r * KB.
template <int MR, int PARTS, typename T>
void tile(const uint8_t* codes, const at::Half* sm, int64_t KB, const int8_t* q, const float* d,
          const float* s, int64_t K, T* out, int64_t ldo) {
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < KB; ++b) {
    __m512i dot[MR][PARTS];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < PARTS; ++p) dot[r][p] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) {
      __m512i v = _mm512_loadu_si512(codes + (b * 4 + o) * 64);
      __m512i lo = _mm512_and_si512(v, nibble);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      for (int r = 0; r < MR; ++r)
        for (int p = 0; p < PARTS; ++p) {
          const int8_t* xr = q + (r * PARTS + p) * K + b * kBlock + o * 8;
          int32_t x0, x1;
          __builtin_memcpy(&x0, xr, 4);
          __builtin_memcpy(&x1, xr + 4, 4);
          dot[r][p] = _mm512_dpbusd_epi32(dot[r][p], lo, _mm512_set1_epi32(x0));
          dot[r][p] = _mm512_dpbusd_epi32(dot[r][p], hi, _mm512_set1_epi32(x1));
        }
    }
    __m512 scale = load16(sm + b * 32), mn = load16(sm + b * 32 + 16);
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < PARTS; ++p)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][p]),
                                 _mm512_mul_ps(scale, _mm512_set1_ps(d[(r * PARTS + p) * KB + b])),
                                 acc[r]);
      acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(s[r * KB + b]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) store16(out + r * ldo, acc[r]);
}

// x rounded to T's precision and widened back (T's own rounding: store16's)
template <typename T>
inline __m512 rounded(__m512 x) {
  T tmp[kTile];
  store16(tmp, x);
  return load16(tmp);
}

// W.T [K, 16 (t1 - t0)] of tiles t0..t1 into out (row stride ldo) in torch's int4 convention,
// the values a layer's dense copy and its many-row calls multiply by: W = (code - 8) * scale
// + zero, with scale the fp16 scale rounded to T and zero = min + 8 * scale (the fp16 pair
// in float32) rounded to T; (code - 8) * scale is exact in float32, so the one rounding to T
// after the add is torch's addcmul's. Row k = 32 b + 8 o + 4 h + j of block b reads nibble h
// of byte 4 r + j of the block's octet o, for the 16 rows r of each tile.
template <typename T>
void dequant_t(const uint8_t* codes, const at::Half* sm, int64_t KB, int64_t t0, int64_t t1,
               T* out, int64_t ldo) {
  const __m512i nibble = _mm512_set1_epi32(0x0F), eight = _mm512_set1_epi32(8);
  // blocks of K a task: each thread writes whole rows of out
  at::parallel_for(0, KB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = t0; t < t1; ++t) {
        const at::Half* st = sm + (t * KB + b) * 32;
        const __m512 raw = load16(st);
        const __m512 scale = rounded<T>(raw);
        const __m512 zero = rounded<T>(_mm512_fmadd_ps(raw, _mm512_set1_ps(8.f), load16(st + 16)));
        const uint8_t* cb = codes + (t * KB + b) * 4 * 64;
        T* ob = out + b * kBlock * ldo + (t - t0) * kTile;
        for (int o = 0; o < 4; ++o) {
          const __m512i v = _mm512_loadu_si512(cb + o * 64);  // lane r: bytes 4 r .. 4 r + 3
          for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 4; ++j) {
              __m512i c = _mm512_and_si512(_mm512_srli_epi32(v, 8 * j + 4 * h), nibble);
              __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c, eight)), scale,
                                         zero);
              store16(ob + (8 * o + 4 * h + j) * ldo, w);
            }
        }
      }
    }
  });
}

#else  // AVX2: the same arithmetic, 8 lanes a vector

inline float widen(at::BFloat16 v) { return static_cast<float>(v); }
inline float widen(at::Half v) { return static_cast<float>(v); }
inline float widen(float v) { return v; }

// One row of x, block by block, as the AVX-512 build's quantise_row: the same roundings
// (nearest even, the default rounding mode), the same remainder by one fused multiply-add.
// Only the order of the block sum's additions differs.
template <int PARTS, typename T>
void quantise_row(const T* x, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t KB = K / kBlock;
  for (int64_t b = 0; b < KB; ++b) {
    float v[kBlock];
    float sum = 0.f;
    for (int i = 0; i < kBlock; ++i) {
      v[i] = widen(x[b * kBlock + i]);
      sum += v[i];
    }
    s[b] = sum;
    for (int part = 0; part < PARTS; ++part) {
      float amax = 0.f;
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float db = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      d[part * KB + b] = db;
      int8_t* qb = q + part * K + b * kBlock;
      for (int i = 0; i < kBlock; ++i) {
        const float c = std::nearbyint(v[i] * inv);  // |v| * inv <= 127: no saturation
        qb[i] = static_cast<int8_t>(c);
        v[i] = std::fma(-c, db, v[i]);  // the remainder
      }
    }
  }
}

inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <typename T>
inline void store8(T* p, __m256 x) {  // T's own rounding from float (nearest even)
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, x);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<T>(tmp[i]);
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }

inline __m256i broadcast4(const int8_t* p) {  // 4 activation codes into every 32-bit lane
  int32_t x;
  __builtin_memcpy(&x, p, 4);
  return _mm256_set1_epi32(x);
}

// Block b's dot products for MR rows of x (PARTS parts each) against 8 output rows, summed in
// int16 lanes: cb points at the block's first octet, already offset to the half's 32 bytes.
template <int MR, int PARTS>
inline void block_dots(const uint8_t* cb, const int8_t* q, int64_t K, int64_t b,
                       __m256i (&sum16)[MR][PARTS]) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (auto& row : sum16)
    for (auto& part : row) part = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int o = 0; o < 4; ++o) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + o * 64));
    const __m256i low = _mm256_and_si256(v, nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < PARTS; ++p) {
        const int8_t* xr = q + (r * PARTS + p) * K + b * kBlock + o * 8;
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, broadcast4(xr)),
                                               _mm256_maddubs_epi16(high, broadcast4(xr + 4)));
        sum16[r][p] = _mm256_add_epi16(sum16[r][p], pairs);
      }
  }
}

// MR rows of x against one half (8 output rows, lanes h*8..h*8+7) of a tile; the arguments as
// the AVX-512 build's tile.
template <int MR, int PARTS, typename T>
void half_tile(const uint8_t* codes, const at::Half* sm, int64_t KB, const int8_t* q,
               const float* d, const float* s, int64_t K, T* out, int64_t ldo, int h) {
  __m256 acc[MR];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum16[MR][PARTS];
  for (int64_t b = 0; b < KB; ++b) {
    block_dots<MR, PARTS>(codes + b * 4 * 64 + h * 32, q, K, b, sum16);
    const __m256 scale = load8(sm + b * 32 + h * 8), mn = load8(sm + b * 32 + 16 + h * 8);
    for (int r = 0; r < MR; ++r) {
      for (int p = 0; p < PARTS; ++p)
        acc[r] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[r][p], ones)),
            _mm256_mul_ps(scale, _mm256_set1_ps(d[(r * PARTS + p) * KB + b])), acc[r]);
      acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(s[r * KB + b]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) store8(out + r * ldo + h * 8, acc[r]);
}

template <int MR, int PARTS, typename T>
void tile(const uint8_t* codes, const at::Half* sm, int64_t KB, const int8_t* q, const float* d,
          const float* s, int64_t K, T* out, int64_t ldo) {
  // the halves one after the other: with both at once the accumulators outnumber AVX2's 16
  // vector registers
  half_tile<MR, PARTS>(codes, sm, KB, q, d, s, K, out, ldo, 0);
  half_tile<MR, PARTS>(codes, sm, KB, q, d, s, K, out, ldo, 1);
}

// x rounded to T's precision and widened back
template <typename T>
inline float rounded(float x) {
  return widen(static_cast<T>(x));
}

// As the AVX-512 build's dequant_t, element by element: the same fused multiply-adds and
// roundings, so the same bits.
template <typename T>
void dequant_t(const uint8_t* codes, const at::Half* sm, int64_t KB, int64_t t0, int64_t t1,
               T* out, int64_t ldo) {
  at::parallel_for(0, KB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = t0; t < t1; ++t) {
        const at::Half* st = sm + (t * KB + b) * 32;
        float scale[kTile], zero[kTile];
        for (int r = 0; r < kTile; ++r) {
          const float raw = widen(st[r]);
          scale[r] = rounded<T>(raw);
          zero[r] = rounded<T>(std::fma(raw, 8.f, widen(st[16 + r])));
        }
        const uint8_t* cb = codes + (t * KB + b) * 4 * 64;
        T* ob = out + b * kBlock * ldo + (t - t0) * kTile;
        for (int o = 0; o < 4; ++o)
          for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 4; ++j) {
              T* row = ob + (8 * o + 4 * h + j) * ldo;
              for (int r = 0; r < kTile; ++r) {
                const int c = (cb[o * 64 + 4 * r + j] >> (4 * h)) & 0x0F;
                row[r] = static_cast<T>(std::fma(static_cast<float>(c - 8), scale[r], zero[r]));
              }
            }
      }
    }
  });
}

#endif

template <int PARTS, typename T>
void run(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale_min,
         at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), NT = codes.size(0), N = NT * kTile;
  const int64_t KB = K / kBlock;
  std::vector<int8_t> q(M * PARTS * K);
  std::vector<float> d(M * PARTS * KB), s(M * KB);
  const T* xp = x.data_ptr<T>();
  for (int64_t m = 0; m < M; ++m)
    quantise_row<PARTS>(xp + m * K, K, q.data() + m * PARTS * K, d.data() + m * PARTS * KB,
                        s.data() + m * KB);
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const at::Half* sp = scale_min.data_ptr<at::Half>();
  T* op = out.data_ptr<T>();
  // a few tiles a task: each tile's codes are read once however many rows x has
  at::parallel_for(0, NT, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* ct = cp + t * KB * 4 * 64;
      const at::Half* st = sp + t * KB * 32;
      // rows in fours, the rest in one tile of 1-3: each tile's codes are unpacked once per
      // group of rows, not once per row
      for (int64_t r = 0; r < M;) {
        const int64_t left = M - r;
        const int8_t* qr = q.data() + r * PARTS * K;
        const float* dr = d.data() + r * PARTS * KB;
        const float* sr = s.data() + r * KB;
        T* o = op + r * N + t * kTile;
        if (left >= 4) {
          tile<4, PARTS>(ct, st, KB, qr, dr, sr, K, o, N);
          r += 4;
        } else if (left == 3) {
          tile<3, PARTS>(ct, st, KB, qr, dr, sr, K, o, N);
          r += 3;
        } else if (left == 2) {
          tile<2, PARTS>(ct, st, KB, qr, dr, sr, K, o, N);
          r += 2;
        } else {
          tile<1, PARTS>(ct, st, KB, qr, dr, sr, K, o, N);
          r += 1;
        }
      }
    }
  });
}

template <int PARTS>
void run_parts(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale_min,
               at::Tensor& out) {
  switch (x.scalar_type()) {
    case at::kBFloat16: run<PARTS, at::BFloat16>(x, codes, scale_min, out); break;
    case at::kFloat: run<PARTS, float>(x, codes, scale_min, out); break;
    case at::kHalf: run<PARTS, at::Half>(x, codes, scale_min, out); break;
    default: TORCH_CHECK(false, "int4_w4a8_mm: x must be bfloat16, float32 or float16");
  }
}

// A number for a refusal's message, written by std::to_string: TORCH_CHECK's own formatting
// of integers (through std::ostream) crashed with SIGSEGV where this library was built by
// g++ 13.3 against torch 2.11's headers (an H100 host; string-only messages raised fine).
inline std::string number(int64_t v) { return std::to_string(v); }

at::Tensor int4_w4a8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale_min,
                        int64_t parts) {
  TORCH_CHECK(parts == 1 || parts == 2, "int4_w4a8_mm: parts must be 1 or 2");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "int4_w4a8_mm: x must be a contiguous [M, K]");
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == 64 && codes.scalar_type() == at::kByte &&
                  codes.is_contiguous(),
              "int4_w4a8_mm: codes must be a contiguous uint8 [N/16, K/8, 64]");
  const int64_t K = x.size(1), NT = codes.size(0);
  TORCH_CHECK(K % kBlock == 0 && codes.size(1) * 8 == K,
              "int4_w4a8_mm: x's width " + number(K) + " does not match the codes' " +
                  number(codes.size(1) * 8));
  TORCH_CHECK(scale_min.scalar_type() == at::kHalf && scale_min.is_contiguous() &&
                  scale_min.dim() == 4 && scale_min.size(0) == NT &&
                  scale_min.size(1) == K / kBlock && scale_min.size(2) == 2 &&
                  scale_min.size(3) == kTile,
              "int4_w4a8_mm: scale_min must be a contiguous fp16 [N/16, K/32, 2, 16]");
  at::Tensor out = at::empty({x.size(0), NT * kTile}, x.options());
  if (x.size(0) == 0) return out;
  if (parts == 1)
    run_parts<1>(x, codes, scale_min, out);
  else
    run_parts<2>(x, codes, scale_min, out);
  return out;
}

void int4_w4a8_dequant_t(const at::Tensor& codes, const at::Tensor& scale_min, int64_t t0,
                         int64_t t1, at::Tensor& out) {
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == 64 && codes.scalar_type() == at::kByte &&
                  codes.is_contiguous(),
              "int4_w4a8_dequant_t: codes must be a contiguous uint8 [N/16, K/8, 64]");
  const int64_t NT = codes.size(0), K = codes.size(1) * 8, KB = K / kBlock;
  TORCH_CHECK(scale_min.scalar_type() == at::kHalf && scale_min.is_contiguous() &&
                  scale_min.dim() == 4 && scale_min.size(0) == NT && scale_min.size(1) == KB,
              "int4_w4a8_dequant_t: scale_min must be a contiguous fp16 [N/16, K/32, 2, 16]");
  TORCH_CHECK(0 <= t0 && t0 <= t1 && t1 <= NT, "int4_w4a8_dequant_t: tiles " + number(t0) +
                  ".." + number(t1) + " out of 0.." + number(NT));
  TORCH_CHECK(out.dim() == 2 && out.size(0) == K && out.size(1) == (t1 - t0) * kTile &&
                  out.stride(1) == 1,
              "int4_w4a8_dequant_t: out must be [K, 16 (t1 - t0)] with unit column stride");
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const at::Half* sp = scale_min.data_ptr<at::Half>();
  switch (out.scalar_type()) {
    case at::kBFloat16:
      dequant_t(cp, sp, KB, t0, t1, out.data_ptr<at::BFloat16>(), out.stride(0));
      break;
    case at::kFloat: dequant_t(cp, sp, KB, t0, t1, out.data_ptr<float>(), out.stride(0)); break;
    case at::kHalf: dequant_t(cp, sp, KB, t0, t1, out.data_ptr<at::Half>(), out.stride(0)); break;
    default: TORCH_CHECK(false, "int4_w4a8_dequant_t: out must be bfloat16, float32 or float16");
  }
}

}  // namespace

TORCH_LIBRARY(firsttoken, m) {
  m.def("int4_w4a8_mm(Tensor x, Tensor codes, Tensor scale_min, int parts) -> Tensor");
  m.def("int4_w4a8_dequant_t(Tensor codes, Tensor scale_min, int t0, int t1, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(firsttoken, CPU, m) {
  m.impl("int4_w4a8_mm", &int4_w4a8_mm);
  m.impl("int4_w4a8_dequant_t", &int4_w4a8_dequant_t);
}
