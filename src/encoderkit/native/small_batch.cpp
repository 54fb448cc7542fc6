// encoderkit's native kernel for the layers of a post-norm encoder (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA)
// on few tokens: one short text, a few (the serving case). See encoderkit/native/__init__.py for why it exists,
// when it runs, and how it is built (g++ at first use, for the CPU it runs on).
//
// No torch headers and no BLAS: the whole layer stack runs in one call, so no Python, no dispatcher and no
// allocation sits between two ops. With few rows a matrix product is bound by reading its weights, so each
// weight is packed once into panels of VW output columns, k-major, read front to back once per call; the rows
// are held in registers (R rows x VW columns of accumulators), and the bias, the activation or the residual
// add are applied to the accumulators before they are stored. Panels are split between the threads.
//
// Numbers: fp32 throughout, products summed in k order with fused multiply-adds. exp is Cephes' polynomial
// (about 2 ulp), erf comes from erfc's Chebyshev fit (Numerical Recipes' erfcc, relative error under 1.2e-7).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>
#include <omp.h>

#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf splat(float a) { return vf{} + a; }
static inline vf loadu(const float* p) { return *(const vfu*)p; }
static inline void storeu(float* p, vf v) { *(vfu*)p = v; }

// ---------------------------------------------------------------------------------------------------------------
// Elementwise functions on vectors
// ---------------------------------------------------------------------------------------------------------------
static inline vf vexp(vf x) {
  x = x > splat(88.3762626647949f) ? splat(88.3762626647949f) : x;
  x = x < splat(-87.3365447505531f) ? splat(-87.3365447505531f) : x;
  vf fx = x * 1.44269504088896341f + 0.5f;
  vf n = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);  // truncation
  n = n > fx ? n - 1.0f : n;                                            // floor
  x = x - n * 0.693359375f + n * 2.12194440e-4f;
  vf z = x * x;
  vf y = ((((1.9875691500E-4f * x + 1.3981999507E-3f) * x + 8.3334519073E-3f) * x + 4.1665795894E-2f) * x +
          1.6666665459E-1f) * x + 5.0000001201E-1f;
  y = y * z + x + 1.0f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  return y * scale;
}

static inline vf verf(vf x) {
  vf z = x < 0.0f ? -x : x;
  vf t = 1.0f / (1.0f + 0.5f * z);
  vf p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f +
         t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  vf erfc = t * vexp(-z * z + p);
  return x < 0.0f ? erfc - 1.0f : 1.0f - erfc;
}

static inline vf vtanh(vf x) {  // 1 - 2 / (exp(2x) + 1), exact enough away from 0; near 0 the odd series
  vf big = 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f);
  vf x2 = x * x;
  vf small = x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
  vf a = x < 0.0f ? -x : x;
  return a < 0.0625f ? small : big;
}

enum Activation { GELU = 0, RELU = 1, GELU_TANH = 2 };

static inline vf activate(vf v, int activation) {
  switch (activation) {
    case GELU: return 0.5f * v * (1.0f + verf(v * 0.70710678118654752f));
    case RELU: return v < 0.0f ? splat(0.0f) : v;
    default: return 0.5f * v * (1.0f + vtanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  }
}

namespace {
// [begin, end) of part ``part`` of ``parts`` equal shares of n.
inline void split(int n, int part, int parts, int* begin, int* end) {
  *begin = (int)((int64_t)n * part / parts);
  *end = (int)((int64_t)n * (part + 1) / parts);
}

// ---------------------------------------------------------------------------------------------------------------
// Matrix products
// ---------------------------------------------------------------------------------------------------------------
enum Epilogue { BIAS = 0, BIAS_ACTIVATION = 1, BIAS_RESIDUAL = 2 };

struct Product {
  const float* x;         // (M, K) rows
  const float* packed;    // panels of (K, VW)
  const float* bias;      // (panels * VW,), zero past N
  const float* residual;  // (M, N) or null
  float* y;               // (M, N)
  int M, N, K, epilogue, activation;
};

// R rows times P panels (adjacent), all in registers. Two panels at once keep two weight streams in flight: on
// the Cascade Lake Xeon, all-MiniLM-L6-v2's 24 products at 14 rows took 3.21 ms with two, 4.16 ms with one panel
// at a time, 3.54 and 3.39 ms with three and four panels of 7 rows (ONNX Runtime's MatMul+Add: 3.82 ms), 2 threads.
// Built for AVX2 on that CPU: two panels of 8 rows 4.40 ms, of 7 rows 4.55, of 6 rows 5.00, one panel of 12 rows
// 5.42 (the same run).
template <int R, int P>
inline void block(const Product& g, int m0, int panel) {
  const float* w = g.packed + (size_t)panel * g.K * VW;
  const float* x = g.x + (size_t)m0 * g.K;
  const int K = g.K;
  vf acc[P][R];
  for (int q = 0; q < P; q++) {
    vf b = loadu(g.bias + (size_t)(panel + q) * VW);
    for (int r = 0; r < R; r++) acc[q][r] = b;
  }
  for (int k = 0; k < K; k++) {
    vf wk[P];
    for (int q = 0; q < P; q++) wk[q] = loadu(w + ((size_t)q * K + k) * VW);
#pragma GCC unroll 32
    for (int r = 0; r < R; r++) {
      const float xr = x[(size_t)r * K + k];
      for (int q = 0; q < P; q++) acc[q][r] += xr * wk[q];
    }
  }
  for (int q = 0; q < P; q++) {
    const int col = (panel + q) * VW, width = std::min(VW, g.N - col);
    for (int r = 0; r < R; r++) {
      float* out = g.y + (size_t)(m0 + r) * g.N + col;
      vf v = acc[q][r];
      if (g.epilogue == BIAS_ACTIVATION) v = activate(v, g.activation);
      if (width == VW) {
        if (g.epilogue == BIAS_RESIDUAL) v += loadu(g.residual + (size_t)(m0 + r) * g.N + col);
        storeu(out, v);
      } else {
        float lanes[VW];
        std::memcpy(lanes, &v, sizeof lanes);
        for (int j = 0; j < width; j++)
          out[j] = lanes[j] + (g.epilogue == BIAS_RESIDUAL ? g.residual[(size_t)(m0 + r) * g.N + col + j] : 0.0f);
      }
    }
  }
}

typedef void (*BlockFn)(const Product&, int, int);
template <int P, int... I>
constexpr std::array<BlockFn, sizeof...(I)> blocks_of(std::integer_sequence<int, I...>) {
  return {block<I + 1, P>...};
}
// Rows per block: what the registers hold (32 vector registers with AVX-512, 16 with AVX2), a few kept for the
// weights and the broadcast row value.
#ifdef __AVX512F__
constexpr int ROWS1 = 24, ROWS2 = 14;
#else
constexpr int ROWS1 = 12, ROWS2 = 8;
#endif
const std::array<BlockFn, ROWS1> ONE_PANEL = blocks_of<1>(std::make_integer_sequence<int, ROWS1>{});
const std::array<BlockFn, ROWS2> TWO_PANELS = blocks_of<2>(std::make_integer_sequence<int, ROWS2>{});

void product_part(const Product& g, int part, int parts) {
  int panels = (g.N + VW - 1) / VW, pairs = panels / 2, begin, end;
  split(pairs, part, parts, &begin, &end);  // pairs of panels; the odd one last goes to the last part
  for (int p = 2 * begin; p < 2 * end; p += 2)
    for (int m0 = 0; m0 < g.M; m0 += ROWS2) TWO_PANELS[std::min(ROWS2, g.M - m0) - 1](g, m0, p);
  if (panels % 2 && part == parts - 1)
    for (int m0 = 0; m0 < g.M; m0 += ROWS1) ONE_PANEL[std::min(ROWS1, g.M - m0) - 1](g, m0, panels - 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Attention: each (sequence, head) on its own, softmax(q k^T * scale) v
// ---------------------------------------------------------------------------------------------------------------
struct Attention {
  const float* qkv;  // (T, 3H): q | k | v, heads side by side in each
  float* out;        // (T, H)
  const int64_t* starts;  // (sequences + 1,)
  int sequences, heads, dim, hidden, longest;
  float scale;
};

// Scores of one query against all keys a vector of keys at a time, from the keys transposed (dim, keys); the
// probabilities times the values a vector of dimensions at a time.
void attention_part(const Attention& a, int part, int parts) {
  int begin, end;
  split(a.sequences * a.heads, part, parts, &begin, &end);
  const int width = (a.longest + VW - 1) / VW * VW;
  thread_local std::vector<float> keys, scores;
  if ((int)keys.size() < a.dim * width) keys.resize((size_t)a.dim * width);
  if ((int)scores.size() < width) scores.resize(width);
  const int stride = 3 * a.hidden;
  for (int task = begin; task < end; task++) {
    int s = task / a.heads, h = task % a.heads;
    const int64_t first = a.starts[s];
    const int n = (int)(a.starts[s + 1] - first), columns = (n + VW - 1) / VW * VW;
    const float* q = a.qkv + first * stride + h * a.dim;
    const float* k = q + a.hidden;
    const float* v = q + 2 * a.hidden;
    for (int d = 0; d < a.dim; d++) {
      float* row = keys.data() + (size_t)d * columns;
      for (int j = 0; j < n; j++) row[j] = k[(size_t)j * stride + d];
      for (int j = n; j < columns; j++) row[j] = 0.0f;
    }
    for (int i = 0; i < n; i++) {
      const float* qi = q + (size_t)i * stride;
      for (int j = 0; j < columns; j += VW) {
        vf acc = splat(0.0f);
        for (int d = 0; d < a.dim; d++) acc += qi[d] * loadu(keys.data() + (size_t)d * columns + j);
        storeu(scores.data() + j, acc * a.scale);
      }
      float top = scores[0];
      for (int j = 1; j < n; j++) top = std::max(top, scores[j]);
      for (int j = 0; j < columns; j += VW) storeu(scores.data() + j, vexp(loadu(scores.data() + j) - top));
      float total = 0.0f;
      for (int j = 0; j < n; j++) total += scores[j];
      const float inverse = 1.0f / total;
      float* o = a.out + (first + i) * a.hidden + h * a.dim;
      for (int d = 0; d < a.dim; d++) o[d] = 0.0f;
      for (int j = 0; j < n; j++) {
        const float p = scores[j] * inverse;
        const float* vj = v + (size_t)j * stride;
        for (int d = 0; d < a.dim; d++) o[d] += p * vj[d];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// LayerNorm of rows, in place
// ---------------------------------------------------------------------------------------------------------------
void layer_norm(float* x, int rows, int n, const float* weight, const float* bias, float eps) {
  for (int r = 0; r < rows; r++) {
    float* row = x + (size_t)r * n;
    int i = 0;
    vf sum = splat(0.0f);
    for (; i + VW <= n; i += VW) sum += loadu(row + i);
    float total = 0.0f;
    for (int j = 0; j < VW; j++) total += sum[j];
    for (; i < n; i++) total += row[i];
    const float mean = total / n;
    vf squares = splat(0.0f);
    for (i = 0; i + VW <= n; i += VW) {
      vf d = loadu(row + i) - mean;
      squares += d * d;
    }
    float variance = 0.0f;
    for (int j = 0; j < VW; j++) variance += squares[j];
    for (; i < n; i++) variance += (row[i] - mean) * (row[i] - mean);
    const float inverse = 1.0f / std::sqrt(variance / n + eps);
    for (i = 0; i < n; i++) row[i] = (row[i] - mean) * inverse * weight[i] + bias[i];
  }
}
// The embeddings: word + absolute position + segment rows, summed and normalised (none of them projected).
struct Embedding {
  const int64_t *ids, *positions, *types;  // (T,) each; positions or types may be null (then row 0 of types)
  const float *word, *position, *segment, *norm_weight, *norm_bias;  // tables (rows, H); position/segment or null
  int64_t words, places, segments;  // the tables' row counts
  float eps;
};

// -1 where an id, position or segment is outside its table (the caller then runs the PyTorch path, whose error
// says which), else 0.
int check_embedding(const Embedding& e, int T) {
  for (int t = 0; t < T; t++) {
    if (e.ids[t] < 0 || e.ids[t] >= e.words) return -1;
    if (e.position && (e.positions[t] < 0 || e.positions[t] >= e.places)) return -1;
    if (e.segment && e.types && (e.types[t] < 0 || e.types[t] >= e.segments)) return -1;
  }
  return 0;
}

void embed_rows(const Embedding& e, float* x, int H, int first, int last) {
  for (int t = first; t < last; t++) {
    float* row = x + (size_t)t * H;
    const float* w = e.word + (size_t)e.ids[t] * H;
    for (int i = 0; i < H; i++) row[i] = w[i];
    if (e.position) {
      const float* p = e.position + (size_t)e.positions[t] * H;
      for (int i = 0; i < H; i++) row[i] += p[i];
    }
    if (e.segment) {
      const float* s = e.segment + (size_t)(e.types ? e.types[t] : 0) * H;
      for (int i = 0; i < H; i++) row[i] += s[i];
    }
  }
  layer_norm(x + (size_t)first * H, last - first, H, e.norm_weight, e.norm_bias, e.eps);
}

// Scratch reused by the calls of one thread (grown, never shrunk): no allocation, no fresh pages per call.
std::vector<float>& scratch(int which, size_t size) {
  thread_local std::vector<float> buffers[4];
  if (buffers[which].size() < size) buffers[which].resize(size);
  return buffers[which];
}
}  // namespace

extern "C" {

int ek_vector_width() { return VW; }

// (N, K) row-major weight -> panels of VW columns, k-major, the last one zero-filled past N.
void ek_pack(const float* weight, float* packed, int N, int K) {
  int panels = (N + VW - 1) / VW;
  for (int p = 0; p < panels; p++)
    for (int k = 0; k < K; k++)
      for (int j = 0; j < VW; j++) {
        int n = p * VW + j;
        packed[((size_t)p * K + k) * VW + j] = n < N ? weight[(size_t)n * K + k] : 0.0f;
      }
}

// One call: the embeddings (where ``embedding`` is given) and every layer. x: (T, H) out (and in, the embeddings'
// output, where ``embedding`` is null). weights: 12 pointers per layer: qkv panels, qkv bias, output panels,
// output bias, attention norm weight, bias, ffn_in panels, ffn_in bias, ffn_out panels, ffn_out bias, ffn norm
// weight, bias (biases padded to the panels' width). starts: (sequences + 1,) first row of each sequence.
// Returns 0, or -1 (nothing computed) where an id is outside its embedding table.
int ek_encode(float* x, const void* embedding, int T, int H, int heads, int inter, int layers,
              const float* const* weights, const int64_t* starts, int sequences, int activation, float eps,
              float scale, int threads) {
  const Embedding* e = (const Embedding*)embedding;
  if (e != nullptr && check_embedding(*e, T) != 0) return -1;
  const int dim = H / heads;
  float* qkv = scratch(0, (size_t)T * 3 * H).data();
  float* context = scratch(1, (size_t)T * H).data();
  float* hidden = scratch(2, (size_t)T * H).data();
  float* inner = scratch(3, (size_t)T * inter).data();
  int longest = 0;
  for (int s = 0; s < sequences; s++) longest = std::max(longest, (int)(starts[s + 1] - starts[s]));
  threads = std::max(1, std::min(threads, (H + VW - 1) / VW / 2));  // at least a pair of panels each
  const Attention attention{qkv, context, starts, sequences, heads, dim, H, longest, scale};
  // OpenMP, in the libgomp torch has loaded (the same SONAME): the caller's thread drives the same team as its torch
  // ops, so no second set of threads competes with torch's for the cores.
#pragma omp parallel num_threads(threads)
  {
    const int part = omp_get_thread_num(), parts = omp_get_num_threads();
    int first, last;
    split(T, part, parts, &first, &last);  // this thread's rows, for the embeddings and the norms
    auto multiply = [&](const Product& g) {  // this thread's panels of a product, then wait for the others'
      product_part(g, part, parts);
#pragma omp barrier
    };
    auto normalize = [&](float* rows, const float* weight, const float* bias) {  // this thread's rows, then wait
      layer_norm(rows + (size_t)first * H, last - first, H, weight, bias, eps);
#pragma omp barrier
    };
    if (e != nullptr) {
      embed_rows(*e, x, H, first, last);
#pragma omp barrier
    }
    for (int l = 0; l < layers; l++) {
      const float* const* w = weights + 12 * l;
      multiply({x, w[0], w[1], nullptr, qkv, T, 3 * H, H, BIAS, 0});
      attention_part(attention, part, parts);
#pragma omp barrier
      multiply({context, w[2], w[3], x, hidden, T, H, H, BIAS_RESIDUAL, 0});
      normalize(hidden, w[4], w[5]);
      multiply({hidden, w[6], w[7], nullptr, inner, T, inter, H, BIAS_ACTIVATION, activation});
      multiply({inner, w[8], w[9], hidden, x, T, H, inter, BIAS_RESIDUAL, 0});
      normalize(x, w[10], w[11]);
    }
  }
  return 0;
}
}
