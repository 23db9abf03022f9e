// Decode attention on the CPU reading the paged KV cache in place (bf16 or float32 K/V, or
// int8 K/V with a float32 scale per token, K/V and head).
//
// One query row per sequence; each sequence's context is cut into spans of whole positions,
// enough spans for every thread, and each span computes all heads' scores, softmax partials
// (max, sum) and unnormalised output, merged per sequence at the end (split-K decoding). A
// span reads each position's whole slot (K of every head, then V of every head) through the
// block table, where the torch path first gathers the context into a dense copy.
//
// Cache layout (backend.layers.kv_cache): [slots, 2, kvh, hd] per layer, K then V; an int8
// cache's scales [slots, 2, kvh] (the torch path's layout, kernel_layout=False).
// Built with -mavx512f on CPUs that have AVX-512F, else with -mavx2 -mfma -mf16c on CPUs that
// have those (backend.layers.cpu_paged_decode.ISAS): the same code over 16 floats at a time.
// Plain C ABI (called through ctypes): no torch headers, ~20 s to compile on 2 cores.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// Sixteen floats at a time: one AVX-512 register, or two AVX2 ones (the build for CPUs
// without AVX-512F, -mavx2 -mfma -mf16c). The kernel below is written once against these.
#if defined(__AVX512F__)

using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset(float x) { return _mm512_set1_ps(x); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf vabs(vf a) { return _mm512_abs_ps(a); }
inline vf vround(vf a) {  // to the nearest integer, ties to even
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
inline float vmaxall(vf a) { return _mm512_reduce_max_ps(a); }
// sums[t] = vsum(x[t]), t < 8
inline void vsum8(const vf* x, float* sums) {
  for (int t = 0; t < 8; ++t) sums[t] = _mm512_reduce_add_ps(x[t]);
}
constexpr int kChunk = 8;  // vectors a value pass keeps in registers (of 32)

inline vf load16(const uint16_t* p) {  // 16 bf16 -> fp32 (exact: the top half)
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline vf load16(const float* p) { return _mm512_loadu_ps(p); }
inline vf load16(const int8_t* p) {  // 16 int8 codes -> fp32 (the scale applied apart)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline void store16(uint16_t* p, vf x) {  // fp32 -> bf16, round to nearest even
  __m512i u = _mm512_castps_si512(x);
  __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                  _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  // NaN stays NaN (a quiet one)
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store16(float* p, vf x) { _mm512_storeu_ps(p, x); }
inline void store16(int8_t* p, vf x) {  // x holds integers within int8's range
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(x)));
}

// the first n < 16 floats at p (the rest zero), and their store
inline vf load_tail(const float* p, int n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
inline void store_tail(float* p, vf x, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), x);
}
inline vf keep_first(vf x, int n) {  // lanes n.. zeroed
  return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << n) - 1), x);
}
inline vf times_pow2(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p * 2^n

#else  // AVX2: two halves of 8

struct vf {
  __m256 a, b;
};
inline vf vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vf vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline vf vadd(vf x, vf y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline vf vsub(vf x, vf y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
inline vf vmul(vf x, vf y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline vf vdiv(vf x, vf y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
inline vf vfma(vf x, vf y, vf z) {
  return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)};
}
inline vf vmax(vf x, vf y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
inline vf vmin(vf x, vf y) { return {_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
inline vf vabs(vf x) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(x.a, m), _mm256_and_ps(x.b, m)};
}
inline vf vround(vf x) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.a, kMode), _mm256_round_ps(x.b, kMode)};
}
inline float hsum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vsum(vf x) { return hsum(_mm256_add_ps(x.a, x.b)); }
inline float vmaxall(vf x) {
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_max_ps(x.a, x.b));
  return *std::max_element(t, t + 8);
}
// sums[t] = vsum(x[t]), t < 8: three rounds of pairwise adds for the eight, not eight
// reductions of their own
inline void vsum8(const vf* x, float* sums) {
  __m256 h[4];
  for (int t = 0; t < 4; ++t)
    h[t] = _mm256_hadd_ps(_mm256_add_ps(x[2 * t].a, x[2 * t].b),
                          _mm256_add_ps(x[2 * t + 1].a, x[2 * t + 1].b));
  const __m256 lo = _mm256_hadd_ps(h[0], h[1]), hi = _mm256_hadd_ps(h[2], h[3]);
  // lo: x0..x3's sums of lanes 0-3 then of lanes 4-7; hi: x4..x7's
  _mm256_storeu_ps(sums, _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20),
                                       _mm256_permute2f128_ps(lo, hi, 0x31)));
}
constexpr int kChunk = 4;  // vectors a value pass keeps in registers (8 of 16)

inline __m256 bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vf load16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline vf load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vf load16(const int8_t* p) { return {i8x8(p), i8x8(p + 8)}; }

inline __m256i bf16_bits(__m256 x) {  // round to nearest even in the low 16 bits; NaN stays
  const __m256i u = _mm256_castps_si256(x);
  const __m256i bias = _mm256_add_epi32(
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
}
inline void store16(uint16_t* p, vf x) {
  // packus works within 128-bit lanes: [a0-3 b0-3 a4-7 b4-7], then the quarters reordered
  const __m256i r = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(bf16_bits(x.a), bf16_bits(x.b)), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), r);
}
inline void store16(float* p, vf x) {
  _mm256_storeu_ps(p, x.a);
  _mm256_storeu_ps(p + 8, x.b);
}
inline void store16(int8_t* p, vf x) {  // x holds integers within int8's range
  alignas(32) int32_t t[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_cvtps_epi32(x.a));
  _mm256_store_si256(reinterpret_cast<__m256i*>(t + 8), _mm256_cvtps_epi32(x.b));
  for (int i = 0; i < 16; ++i) p[i] = static_cast<int8_t>(t[i]);
}

inline vf load_tail(const float* p, int n) {
  alignas(32) float t[16] = {};
  std::memcpy(t, p, sizeof(float) * n);
  return load16(t);
}
inline void store_tail(float* p, vf x, int n) {
  alignas(32) float t[16];
  store16(t, x);
  std::memcpy(p, t, sizeof(float) * n);
}
inline vf keep_first(vf x, int n) {
  alignas(32) float t[16];
  store16(t, x);
  for (int i = n; i < 16; ++i) t[i] = 0.f;
  return load16(t);
}
inline __m256 pow2x8(__m256 n) {  // 2^n for integral n in [-126, 127]
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline vf times_pow2(vf p, vf n) {
  return {_mm256_mul_ps(p.a, pow2x8(n.a)), _mm256_mul_ps(p.b, pow2x8(n.b))};
}

#endif

// exp(x) for x <= 0 (scores less their maximum): 2^n * p(r), relative error ~2e-7
inline vf exp16(vf x) {
  x = vmax(x, vset(-87.f));
  const vf n = vround(vmul(x, vset(1.44269504f)));
  vf r = vfma(n, vset(-0.693145752f), x);
  r = vfma(n, vset(-1.42860677e-6f), r);
  vf p = vset(1.f / 720);
  p = vfma(p, r, vset(1.f / 120));
  p = vfma(p, r, vset(1.f / 24));
  p = vfma(p, r, vset(1.f / 6));
  p = vfma(p, r, vset(0.5f));
  p = vfma(p, r, vset(1.f));
  p = vfma(p, r, vset(1.f));
  return times_pow2(p, n);
}

constexpr int kMaxGroup = 8;
// Positions a span's value pass covers at a time: their V rows of one head (64 × hd
// elements) stay in L1 while each query head of the group, and each part of hd, reads them.
constexpr int kSub = 64;
// Positions ahead whose slots the score pass asks memory for: the hardware's prefetchers
// alone left the pass waiting on DRAM (a layer's cache is cold: the step's weights passed
// through the caches since)
constexpr int kAhead = 8;

// Positions [p0, p1) of one sequence, every head: out [H, HD] unnormalised, ml [2, H] the
// rows' max score and sum of exp(score - max). scores: [H, p1 - p0] scratch; slots: [p1 - p0]
// scratch. sc: an int8 cache's scales ([slots, 2, kvh]), else null.
template <typename Tq, typename Tc, int HD>
void span(const Tq* q, const Tc* cache, const float* sc, int kvh, int g, const int32_t* table,
          int bs, int p0, int p1, float scale, float* scores, int64_t* slots, float* out,
          float* ml) {
  constexpr int V = HD / 16;
  constexpr int CH = V < kChunk ? V : kChunk;  // vectors of hd a value pass accumulates
  const int H = kvh * g, n = p1 - p0;
  const int64_t stride = 2LL * kvh * HD;  // one slot: K and V of every head
  // each position's slot, block by block (no division per position and pass)
  for (int p = p0; p < p1;) {
    const int b = p / bs, end = std::min(p1, (b + 1) * bs);
    const int64_t base = static_cast<int64_t>(table[b]) * bs - static_cast<int64_t>(b) * bs;
    for (; p < end; ++p) slots[p - p0] = base + p;
  }
  // scores: each query head's dot products, their horizontal sums eight at a time
  vf dots[8];
  float dot_scale[8], sums[8];
  constexpr int64_t kLine = 64;
  const int64_t slot_bytes = stride * static_cast<int64_t>(sizeof(Tc));
  for (int i = 0; i < std::min(n, kAhead); ++i) {
    const char* first = reinterpret_cast<const char*>(cache + slots[i] * stride);
    for (int64_t b = 0; b < slot_bytes; b += kLine) _mm_prefetch(first + b, _MM_HINT_T0);
  }
  for (int i = 0; i < n; ++i) {
    const int64_t slot = slots[i];
    const Tc* k = cache + slot * stride;
    if (i + kAhead < n) {  // a later position's whole slot, K and V, on its way from memory
      const char* next = reinterpret_cast<const char*>(cache + slots[i + kAhead] * stride);
      for (int64_t b = 0; b < slot_bytes; b += kLine) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    int filled = 0, r0 = 0;
    for (int h = 0; h < kvh; ++h) {
      vf kv[V];
      for (int c = 0; c < V; ++c) kv[c] = load16(k + h * HD + c * 16);
      const float ks = sc ? scale * sc[slot * 2 * kvh + h] : scale;
      for (int j = 0; j < g; ++j) {
        const Tq* qj = q + (h * g + j) * HD;
        vf s = vmul(load16(qj), kv[0]);
        for (int c = 1; c < V; ++c) s = vfma(load16(qj + c * 16), kv[c], s);
        dots[filled] = s;
        dot_scale[filled++] = ks;
        if (filled == 8) {
          vsum8(dots, sums);
          for (int t = 0; t < 8; ++t) scores[(r0 + t) * n + i] = sums[t] * dot_scale[t];
          r0 += 8;
          filled = 0;
        }
      }
    }
    if (filled) {
      for (int t = filled; t < 8; ++t) dots[t] = vzero();
      vsum8(dots, sums);
      for (int t = 0; t < filled; ++t) scores[(r0 + t) * n + i] = sums[t] * dot_scale[t];
    }
  }
  for (int r = 0; r < H; ++r) {
    float* sr = scores + r * n;
    vf mv = vset(-INFINITY);
    int p = 0;
    for (; p + 16 <= n; p += 16) mv = vmax(mv, load16(sr + p));
    float m = vmaxall(mv);
    for (; p < n; ++p) m = std::max(m, sr[p]);
    const vf mb = vset(m);
    vf sum = vzero();
    for (p = 0; p + 16 <= n; p += 16) {
      vf e = exp16(vsub(load16(sr + p), mb));
      store16(sr + p, e);
      sum = vadd(sum, e);
    }
    if (p < n) {
      const vf e = keep_first(exp16(vsub(load_tail(sr + p, n - p), mb)), n - p);
      store_tail(sr + p, e, n - p);
      sum = vadd(sum, e);
    }
    ml[r] = m;
    ml[H + r] = vsum(sum);
  }
  // values: each query head's weighted sum, CH vectors of hd in registers at a time, over
  // kSub positions at a time (out holds the sums between)
  for (int r = 0; r < H * V; ++r) store16(out + r * 16, vzero());
  for (int s0 = 0; s0 < n; s0 += kSub) {
    const int s1 = std::min(n, s0 + kSub);
    for (int h = 0; h < kvh; ++h) {
      for (int j = 0; j < g; ++j) {
        const float* w = scores + (h * g + j) * n;
        float* o = out + (h * g + j) * HD;
        for (int c0 = 0; c0 < V; c0 += CH) {
          vf acc[CH];
          for (int c = 0; c < CH; ++c) acc[c] = load16(o + (c0 + c) * 16);
          for (int i = s0; i < s1; ++i) {
            const Tc* v = cache + slots[i] * stride + (kvh + h) * HD + c0 * 16;
            const vf wv = vset(sc ? w[i] * sc[slots[i] * 2 * kvh + kvh + h] : w[i]);
            for (int c = 0; c < CH; ++c) acc[c] = vfma(wv, load16(v + c * 16), acc[c]);
          }
          for (int c = 0; c < CH; ++c) store16(o + (c0 + c) * 16, acc[c]);
        }
      }
    }
  }
}

template <typename Tq, typename Tc, int HD>
void run(const Tq* q, int64_t q_row, Tq* out, const Tc* cache, const float* sc,
         const int32_t* tables, int W, const int32_t* lens, int D, int H, int kvh, int bs,
         float scale, int min_span, int threads) {
  const int g = H / kvh;
  // (sequence, first, end) spans: each context in pieces of >= min_span positions, about
  // two pieces per thread over the whole batch
  std::vector<int> seq, lo, hi;
  int longest = 0;
  for (int d = 0; d < D; ++d) {
    const int C = lens[d];
    longest = std::max(longest, C);
    const int want = std::max(1, (2 * threads + D - 1) / D);
    const int pieces = std::max(1, std::min(want, C / std::max(1, min_span)));
    for (int i = 0; i < pieces; ++i) {
      seq.push_back(d);
      lo.push_back(static_cast<int>(static_cast<int64_t>(C) * i / pieces));
      hi.push_back(static_cast<int>(static_cast<int64_t>(C) * (i + 1) / pieces));
    }
  }
  const int S = static_cast<int>(seq.size());
  std::vector<float> part(static_cast<size_t>(S) * H * HD), ml(static_cast<size_t>(S) * 2 * H);
  // one span (a short context, batch 1) runs here: no team of threads to wake for it
#pragma omp parallel num_threads(threads) if (S > 1)
  {
    std::vector<float> scores(static_cast<size_t>(H) * longest + 16);
    std::vector<int64_t> slots(static_cast<size_t>(longest));
#pragma omp for schedule(static, 1)
    for (int i = 0; i < S; ++i) {
      const int d = seq[i];
      span<Tq, Tc, HD>(q + d * q_row, cache, sc, kvh, g, tables + static_cast<int64_t>(d) * W,
                       bs, lo[i], hi[i], scale, scores.data(), slots.data(),
                       part.data() + static_cast<size_t>(i) * H * HD,
                       ml.data() + static_cast<size_t>(i) * 2 * H);
    }
  }
  // merge each sequence's spans: weights exp(max_s - max), normalised by the merged sum
  for (int i = 0; i < S;) {
    int e = i;
    while (e < S && seq[e] == seq[i]) ++e;
    for (int r = 0; r < H; ++r) {
      float m = -INFINITY;
      for (int s = i; s < e; ++s) m = std::max(m, ml[static_cast<size_t>(s) * 2 * H + r]);
      vf acc[HD / 16];
      for (int c = 0; c < HD / 16; ++c) acc[c] = vzero();
      float l = 0.f;
      for (int s = i; s < e; ++s) {
        const float w = std::exp(ml[static_cast<size_t>(s) * 2 * H + r] - m);
        l += w * ml[static_cast<size_t>(s) * 2 * H + H + r];
        const float* ps = part.data() + (static_cast<size_t>(s) * H + r) * HD;
        for (int c = 0; c < HD / 16; ++c)
          acc[c] = vfma(vset(w), load16(ps + c * 16), acc[c]);
      }
      Tq* o = out + (static_cast<int64_t>(seq[i]) * H + r) * HD;
      const vf inv = vset(1.f / l);
      for (int c = 0; c < HD / 16; ++c) store16(o + c * 16, vmul(acc[c], inv));
    }
    i = e;
  }
}

struct Args {
  int64_t q_row;  // elements from one decode row's q to the next
  const float* scales;
  const int32_t* tables;
  int W;
  const int32_t* lens;
  int D, H, kvh, bs;
  float scale;
  int min_span, threads;
};

template <typename Tq, int HD>
void with_cache(int cache_kind, const void* q, void* out, const void* cache, const Args& a) {
  auto go = [&](auto* c) {
    run<Tq, std::remove_const_t<std::remove_pointer_t<decltype(c)>>, HD>(
        static_cast<const Tq*>(q), a.q_row, static_cast<Tq*>(out), c, a.scales, a.tables, a.W,
        a.lens, a.D, a.H, a.kvh, a.bs, a.scale, a.min_span, a.threads);
  };
  if (cache_kind == 2) go(static_cast<const int8_t*>(cache));
  else if (cache_kind == 1) go(static_cast<const uint16_t*>(cache));
  else go(static_cast<const float*>(cache));
}

template <int HD>
int dispatch(int bf16, int cache_kind, const void* q, void* out, const void* cache,
             const Args& a) {
  if (bf16) with_cache<uint16_t, HD>(cache_kind, q, out, cache, a);
  else with_cache<float, HD>(cache_kind, q, out, cache, a);
  return 0;
}

// Whether every position D rows of (tables, lens) read lies in a cache of `slots` slots: a
// context within its table, the table's blocks within the cache (a bad table is refused, never
// read out of bounds). 0 or -2.
int check_tables(const int32_t* tables, int W, const int32_t* lens, int D, int bs,
                 int64_t slots) {
  const int64_t blocks = slots / bs;
  for (int d = 0; d < D; ++d) {
    if (lens[d] < 1 || lens[d] > static_cast<int64_t>(W) * bs) return -2;
    for (int b = 0, n = (lens[d] + bs - 1) / bs; b < n; ++b) {
      const int32_t id = tables[static_cast<int64_t>(d) * W + b];
      if (id < 0 || id >= blocks) return -2;
    }
  }
  return 0;
}

int decode(int bf16, int cache_kind, const void* q, void* out, const void* cache,
           const Args& a, int hd) {
  switch (hd) {
    case 16: return dispatch<16>(bf16, cache_kind, q, out, cache, a);
    case 32: return dispatch<32>(bf16, cache_kind, q, out, cache, a);
    case 64: return dispatch<64>(bf16, cache_kind, q, out, cache, a);
    case 128: return dispatch<128>(bf16, cache_kind, q, out, cache, a);
    case 256: return dispatch<256>(bf16, cache_kind, q, out, cache, a);
    default: return -1;
  }
}

// Quantises a step's K and V into an int8 cache in the torch path's layout, the same bits as
// kv_cache.quantise: scale = max(amax / 127, 1e-12) per (token, K/V, head), codes =
// round-half-even(x / scale) clamped to [-127, 127]. k, v: [T, kvh, hd] with rows
// k_row / v_row elements apart (heads contiguous within a row), bf16 (1) or float32 (0);
// slots: [T], checked by the caller; data: one layer's [num_slots, 2, kvh, hd] int8;
// scales: [num_slots, 2, kvh].
void store_int8(int bf16, const void* k, const void* v, int64_t k_row, int64_t v_row,
                const int64_t* slots, int T, int kvh, int hd, int8_t* data, float* scales) {
  const int V = hd / 16;
  for (int t = 0; t < T; ++t) {
    const int64_t slot = slots[t];
    for (int c = 0; c < 2; ++c) {
      for (int h = 0; h < kvh; ++h) {
        vf x[16];
        vf amax = vzero();
        for (int i = 0; i < V; ++i) {
          if (bf16) {
            const uint16_t* src = static_cast<const uint16_t*>(c ? v : k) + t * (c ? v_row : k_row);
            x[i] = load16(src + h * hd + i * 16);
          } else {
            const float* src = static_cast<const float*>(c ? v : k) + t * (c ? v_row : k_row);
            x[i] = load16(src + h * hd + i * 16);
          }
          amax = vmax(amax, vabs(x[i]));
        }
        const float scale = std::max(vmaxall(amax) / 127.f, 1e-12f);
        const vf sv = vset(scale);
        int8_t* out = data + (slot * 2 + c) * kvh * hd + h * hd;
        for (int i = 0; i < V; ++i) {
          vf y = vround(vdiv(x[i], sv));
          y = vmin(vmax(y, vset(-127.f)), vset(127.f));
          store16(out + i * 16, y);
        }
        scales[(slot * 2 + c) * kvh + h] = scale;
      }
    }
  }
}

// A step's K and V rows copied as they are into a cache of their dtype (elem bytes each)
void store_rows(int elem, const void* k, const void* v, int64_t k_row, int64_t v_row,
                const int64_t* slots, int T, int kvh, int hd, char* data) {
  const int64_t row = static_cast<int64_t>(kvh) * hd * elem;
  for (int t = 0; t < T; ++t) {
    char* dst = data + slots[t] * 2 * row;
    std::memcpy(dst, static_cast<const char*>(k) + t * k_row * elem, row);
    std::memcpy(dst + row, static_cast<const char*>(v) + t * v_row * elem, row);
  }
}

// Whether this build serves H query heads over kvh KV heads, blocks of bs and a cache of
// cache_kind (an int8 one, and only it, with scales)
bool serves(int H, int kvh, int bs, int cache_kind, const float* scales) {
  return kvh > 0 && H % kvh == 0 && H / kvh <= kMaxGroup && bs >= 1 && cache_kind >= 0 &&
         cache_kind <= 2 && (cache_kind == 2) == (scales != nullptr);
}

int bad_slot(const int64_t* slots, int T, int64_t num_slots) {
  for (int t = 0; t < T; ++t)
    if (slots[t] < 0 || slots[t] >= num_slots) return 1;
  return 0;
}

}  // namespace

extern "C" {

// q, out: [D, H, hd] (bf16: 1 for bfloat16, 0 for float32); cache: one layer, [slots, 2,
// kvh, hd] of kind cache_kind (0 float32, 1 bfloat16, 2 int8 with scales [slots, 2, kvh]
// float32, else scales null); tables: [D, W] block ids; lens: [D] context lengths (this
// step's token included, all >= 1); slots: the cache's slot count. Returns 0, -1 for what
// this build does not serve, -2 for a context or block table that reaches outside the
// cache (nothing written either way).
int ft_paged_decode(int bf16, int cache_kind, const void* q, void* out, const void* cache,
                    int64_t slots, const float* scales, const int32_t* tables, int W,
                    const int32_t* lens, int D, int H, int kvh, int hd, int bs, float scale,
                    int min_span, int threads) {
  if (!serves(H, kvh, bs, cache_kind, scales)) return -1;
  if (check_tables(tables, W, lens, D, bs, slots)) return -2;
  const Args a{static_cast<int64_t>(H) * hd, scales, tables, W, lens, D, H, kvh, bs, scale,
               min_span, threads};
  return decode(bf16, cache_kind, q, out, cache, a, hd);
}

// One step's attention over the cache of every layer, fixed for the step: checked once
// (ft_step_check), then each layer is one call (ft_step_layer). The cache holds
// [layers, num_slots, 2, kvh, hd] of kind cache_kind (as ft_paged_decode's), scales
// [layers, num_slots, 2, kvh] for int8; the step's T tokens go to slots [T]; its first D
// rows are decodes with (tables, lens) as ft_paged_decode's.
struct FtStep {
  int bf16, cache_kind;
  char* cache;
  float* scales;
  int64_t num_slots;
  const int64_t* slots;
  int T;
  const int32_t* tables;
  int W;
  const int32_t* lens;
  int D, H, kvh, hd, bs;
  float scale;
  int min_span, threads;
};

// 0; -1 for shapes this build does not serve; -2 for a slot, a context or a block that
// reaches outside the cache.
int ft_step_check(const FtStep* s) {
  if (!serves(s->H, s->kvh, s->bs, s->cache_kind, s->scales)) return -1;
  if (s->hd % 16 != 0 || s->hd > 256) return -1;
  if (s->bf16 != (s->cache_kind == 1) && s->cache_kind != 2) return -1;  // K/V as the cache's
  if (bad_slot(s->slots, s->T, s->num_slots)) return -2;
  return check_tables(s->tables, s->W, s->lens, s->D, s->bs, s->num_slots);
}

// Layer `layer` of a checked step: stores its K and V ([T, kvh, hd], rows kv_row elements
// apart, heads contiguous, in the model dtype), then attends its D decode rows (q [D, H, hd]
// rows q_row apart) into out [D, H, hd] contiguous. Returns what ft_paged_decode returns.
int ft_step_layer(const FtStep* s, int layer, const void* q, int64_t q_row, const void* k,
                  const void* v, int64_t kv_row, void* out) {
  const int elem = s->cache_kind == 2 ? 1 : (s->cache_kind == 1 ? 2 : 4);
  const int64_t per_slot = 2LL * s->kvh * s->hd;
  char* cache = s->cache + layer * s->num_slots * per_slot * elem;
  float* scales = s->scales ? s->scales + layer * s->num_slots * 2 * s->kvh : nullptr;
  if (s->cache_kind == 2)
    store_int8(s->bf16, k, v, kv_row, kv_row, s->slots, s->T, s->kvh, s->hd,
               reinterpret_cast<int8_t*>(cache), scales);
  else
    store_rows(elem, k, v, kv_row, kv_row, s->slots, s->T, s->kvh, s->hd, cache);
  if (s->D == 0) return 0;
  const Args a{q_row, scales, s->tables, s->W, s->lens, s->D, s->H, s->kvh, s->bs, s->scale,
               s->min_span, s->threads};
  return decode(s->bf16, s->cache_kind, q, out, cache, a, s->hd);
}

}  // extern "C"
