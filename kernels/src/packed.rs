//! Matrix products on weights kept in llama.cpp's quantized blocks, for decoding few rows.
//!
//! Decoding one stream reads every weight of the model once per token and does two FLOPs
//! with it: on a CPU the time is the memory traffic. SmolLM2-135M as f32 is 538 MB per token
//! (≈ 48 tokens/s at one core's ≈ 26 GB/s, reports/perf/NOTES.md §9j); its GGUF holds the
//! same weights as `Q4_1` blocks (0.625 bytes each) and the tied embedding as `Q8_0`
//! (1.06 bytes each), ≈ 96 MB. [`PackedMatrix`] keeps those blocks and
//! [`packed_matmul_host`] multiplies by them directly, expanding each block's integers to
//! f32 in registers — the weights it computes with are exactly the f32 values the dense
//! model was loaded with (`q·d + m` of the same `d`, `m`, `q`), only summed in another order.
//!
//! # Blocks (32 weights of one output row, ggml's definitions)
//! - `Q4_1`: scale `d`, minimum `m`, 16 bytes of nibbles; weight `j` is the low nibble of
//!   byte `j` and weight `j + 16` its high nibble; `w = q·d + m`.
//! - `Q8_0`: scale `d`, 32 signed bytes; `w = q·d`.
//!
//! The scales are stored here as f32 (ggml's f16, converted once, exactly).
//!
//! # The arithmetic, fixed for every CPU
//! For output `n` and input row `x`: `y = Σ_k x_k·w_k`, where `w_k` is the weight exactly as
//! the dense model holds it (`q·d + m` or `q·d`, each product and sum rounded as
//! [`PackedMatrix::dequantize`] rounds them). The sum runs in two accumulators of 16 lanes:
//! block after block, lane `l` of the first takes `x_l·w_l` and of the second `x_{l+16}·w_{l+16}`
//! (of the block's 32 weights), each by one fused multiply-add; at the end the two are added
//! lane by lane and the 16 lanes in a fixed tree. So the AVX-512, AVX2 and scalar instances
//! (chosen at run time by [`pulp`]'s CPU detection; other CPUs than x86-64 take the scalar
//! one, whose `mul_add` is the same single rounding) give the same bits, and so does any
//! thread count (each output is one task's). The AVX-512 instance reads a `Q4_1` block's
//! weights from a 16-entry table (`i·d + m` for `i` in `0..16`, computed once per block) by
//! a lane permutation, the others convert each integer — the same values either way.
//! The dense product is the reference twin ([`PackedMatrix::dequantize`] gives its weights);
//! there is no backward: frozen weights only, and `Autodiff<B>` takes the dense path.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use crate::attention::AttentionOps;
use crate::ops::{float, into_prim};

/// Weights per block.
pub const BLOCK: usize = 32;
/// Lanes of the in-block sums (one AVX-512 register of f32).
const LANES: usize = 16;
/// Most input rows [`packed_matmul_host`] takes at once: the decode of a few streams. Where
/// the dense product overtakes it is not measured: at four rows the blocks still win
/// (SmolLM2, Flex, one thread: 110.7 against 70.3 tokens/s; one row 73.0 against 45.4).
pub const PACKED_MAX_ROWS: usize = 4;
/// Output rows per task.
const CHUNK: usize = 64;
/// Fewest weights of a matrix whose product is split over rayon's threads: SmolLM2's
/// attention projections (576 × 576 and 192 × 576) are, its norms are not. At `1 << 19` only
/// the MLP and the LM head were split, a fifth of a token's weights stayed on one thread
/// (reports/perf/NOTES.md §18).
const PARALLEL_MIN: usize = 1 << 16;

/// A block format of [`PackedMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// ggml `Q4_1`: `w = q·d + m`, `q` in `0..16`.
    Q4_1,
    /// ggml `Q8_0`: `w = q·d`, `q` in `-128..128`.
    Q8_0,
}

impl BlockFormat {
    /// Bytes of one block in a GGUF file.
    pub const fn ggml_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
        }
    }
    /// Bytes of one block's integers here.
    const fn quant_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 16,
            BlockFormat::Q8_0 => 32,
        }
    }
}

/// Why blocks cannot form a [`PackedMatrix`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PackedError {
    /// The row length is not a whole number of blocks.
    #[error("a packed row of {cols} weights is not a whole number of {BLOCK}-weight blocks")]
    RowLength {
        /// The row length.
        cols: usize,
    },
    /// The bytes are not `rows × cols / 32` blocks.
    #[error("{format:?} blocks of a {rows} × {cols} matrix take {expected} bytes, got {got}")]
    Bytes {
        /// The format.
        format: BlockFormat,
        /// Output rows.
        rows: usize,
        /// Weights per row.
        cols: usize,
        /// `rows · cols / 32 · block bytes`.
        expected: usize,
        /// The length given.
        got: usize,
    },
}

/// A `[rows, cols]` weight matrix in quantized blocks, row-major (each output's weights
/// contiguous), as a GGUF file stores a linear layer: `y[n] = Σ_k x[k]·w[n, k]`.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    /// Each block's integers: 16 bytes of nibbles (`Q4_1`) or 32 signed bytes (`Q8_0`).
    quants: Vec<u8>,
    /// Each block's `d`.
    scales: Vec<f32>,
    /// Each block's `m` (`Q4_1`; empty for `Q8_0`).
    mins: Vec<f32>,
}

impl PackedMatrix {
    /// The matrix from its blocks as a GGUF file stores them (`rows · cols / 32` blocks, row
    /// by row; f16 scales and minimums little-endian).
    pub fn from_ggml(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        raw: &[u8],
    ) -> Result<Self, PackedError> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(PackedError::RowLength { cols });
        }
        let blocks = rows * cols / BLOCK;
        let expected = blocks * format.ggml_bytes();
        if raw.len() != expected {
            return Err(PackedError::Bytes {
                format,
                rows,
                cols,
                expected,
                got: raw.len(),
            });
        }
        let half = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let mut quants = Vec::with_capacity(blocks * format.quant_bytes());
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::new();
        for block in raw.chunks_exact(format.ggml_bytes()) {
            scales.push(half(block, 0));
            match format {
                BlockFormat::Q4_1 => {
                    mins.push(half(block, 2));
                    quants.extend_from_slice(&block[4..]);
                }
                BlockFormat::Q8_0 => quants.extend_from_slice(&block[2..]),
            }
        }
        Ok(PackedMatrix {
            format,
            rows,
            cols,
            quants,
            scales,
            mins,
        })
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Weights per output row (the input width).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes held: the blocks' integers and their f32 scales and minimums.
    pub fn bytes(&self) -> usize {
        self.quants.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// The weights as f32, `[rows, cols]` row-major: `q·d + m` (`Q4_1`) or `q·d` (`Q8_0`),
    /// rounded once each — the values a dense model loaded from the same file holds.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        let qb = self.format.quant_bytes();
        for (b, q) in self.quants.chunks_exact(qb).enumerate() {
            let d = self.scales[b];
            match self.format {
                BlockFormat::Q4_1 => {
                    let m = self.mins[b];
                    out.extend(q.iter().map(|&v| f32::from(v & 0x0f) * d + m));
                    out.extend(q.iter().map(|&v| f32::from(v >> 4) * d + m));
                }
                BlockFormat::Q8_0 => out.extend(q.iter().map(|&v| f32::from(v as i8) * d)),
            }
        }
        out
    }
}

/// `x · wᵀ` by [`AttentionOps::packed_matmul`], or `None` where `B` has no packed product
/// or the input does not fit it (f32, `1..=PACKED_MAX_ROWS` rows of `w.cols()`): the caller
/// then multiplies by the dense weights.
///
/// # Shapes
/// - `x`: `[m, w.cols()]`
/// - output: `[m, w.rows()]`
pub fn packed_matmul<B: AttentionOps>(x: &Tensor<B, 2>, w: &PackedMatrix) -> Option<Tensor<B, 2>> {
    let [m, cols] = x.dims();
    let fits = (1..=PACKED_MAX_ROWS).contains(&m) && cols == w.cols && x.dtype() == DType::F32;
    if !fits {
        return None;
    }
    B::packed_matmul(into_prim(x.clone()), w).map(float)
}

/// Whether `B` multiplies by packed blocks at all ([`AttentionOps::packed_matmul`] answers
/// for one row of one zero block): the CPU backends do, the GPU backends and `Autodiff` do
/// not, and a caller need not keep blocks that would never be read.
pub fn packed_matmul_supported<B: AttentionOps>(device: &B::Device) -> bool {
    let Ok(w) = PackedMatrix::from_ggml(BlockFormat::Q8_0, 1, BLOCK, &[0; 34]) else {
        return false;
    };
    packed_matmul(&Tensor::<B, 2>::zeros([1, BLOCK], device), &w).is_some()
}

/// [`AttentionOps::packed_matmul`] for a CPU backend: the input read to the host, multiplied
/// by [`packed_matmul_host`], the output written back. `x` is as [`packed_matmul`] checked.
pub(crate) fn packed_matmul_via_host<B: Backend>(
    x: burn::tensor::ops::FloatTensor<B>,
    w: &PackedMatrix,
) -> Option<burn::tensor::ops::FloatTensor<B>> {
    let x: Tensor<B, 2> = float(x);
    let [m, _] = x.dims();
    let device = x.device();
    let data = x.into_data();
    let y = packed_matmul_host(data.as_slice::<f32>().ok()?, m, w);
    let y = Tensor::<B, 2>::from_data(TensorData::new(y, [m, w.rows]), &device);
    Some(into_prim(y))
}

/// `x · wᵀ` for `m ≤ PACKED_MAX_ROWS` input rows: `x` is `[m, w.cols()]` row-major, the
/// output `[m, w.rows()]`. Output rows are split in tasks of rayon's pool; the arithmetic is
/// the module docs' and the same on every CPU and thread count.
///
/// # Panics
/// If `m` is 0 or above [`PACKED_MAX_ROWS`], or `x.len() != m · w.cols()` (the caller's
/// shapes, checked by [`packed_matmul`]).
pub fn packed_matmul_host(x: &[f32], m: usize, w: &PackedMatrix) -> Vec<f32> {
    matmul_on(Isa::detect(), x, m, w)
}

/// [`packed_matmul_host`] on a given instruction set.
fn matmul_on(isa: Isa, x: &[f32], m: usize, w: &PackedMatrix) -> Vec<f32> {
    assert!((1..=PACKED_MAX_ROWS).contains(&m), "{m} rows");
    assert_eq!(x.len(), m * w.cols, "input length");
    let blocks = w.cols / BLOCK;
    // [rows, m]: each task fills whole output rows.
    let mut by_row = vec![0.0f32; w.rows * m];
    let task = |(c, out): (usize, &mut [f32])| {
        isa.run(Rows {
            x,
            m,
            blocks,
            w,
            first: c * CHUNK,
            out,
        })
    };
    // Handing a product to the pool costs a wake-up and a wait (≈ 10 µs): a small matrix is
    // done here, on the calling thread.
    if rayon::current_num_threads() > 1 && w.rows * w.cols >= PARALLEL_MIN {
        by_row.par_chunks_mut(CHUNK * m).enumerate().for_each(task);
    } else {
        by_row.chunks_mut(CHUNK * m).enumerate().for_each(task);
    }
    if m == 1 {
        return by_row;
    }
    let mut out = vec![0.0f32; m * w.rows];
    for (n, row) in by_row.chunks_exact(m).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            out[i * w.rows + n] = v;
        }
    }
    out
}

/// One task: output rows `first..first + out.len() / m` (`out` is `[rows, m]`).
struct Rows<'a> {
    x: &'a [f32],
    m: usize,
    blocks: usize,
    w: &'a PackedMatrix,
    first: usize,
    out: &'a mut [f32],
}

/// The instruction set a task runs on, detected at run time ([`pulp`]'s CPU tokens, which
/// make the intrinsics safe to call). Every variant computes the same bits.
#[derive(Clone, Copy)]
enum Isa {
    /// [`Rows::scalar_rows`]: the arithmetic written out, and the others' reference.
    Scalar,
    /// AVX2 with FMA: each 16-lane accumulator as two 8-lane registers.
    #[cfg(target_arch = "x86_64")]
    V3(pulp::x86::V3),
    /// AVX-512: one register per accumulator.
    #[cfg(target_arch = "x86_64")]
    V4(pulp::x86::V4),
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = pulp::x86::V4::try_new() {
                return Isa::V4(simd);
            }
            if let Some(simd) = pulp::x86::V3::try_new() {
                return Isa::V3(simd);
            }
        }
        Isa::Scalar
    }

    fn run(self, job: Rows<'_>) {
        match self {
            Isa::Scalar => by_shape!(job, job, scalar_rows),
            #[cfg(target_arch = "x86_64")]
            Isa::V3(simd) => pulp::Simd::vectorize(simd, x86::SimdRows { simd, job }),
            #[cfg(target_arch = "x86_64")]
            Isa::V4(simd) => pulp::Simd::vectorize(simd, x86::SimdRows { simd, job }),
        }
    }
}

/// Calls `$job.$run::<Q4, M>()` for the format and row count of `$rows` (constants in each
/// instance, so that the accumulators stay in registers and the loops know their lengths).
macro_rules! by_shape {
    ($rows:expr, $job:expr, $run:ident) => {
        match ($rows.w.format, $rows.m) {
            (BlockFormat::Q4_1, 1) => $job.$run::<true, 1>(),
            (BlockFormat::Q4_1, 2) => $job.$run::<true, 2>(),
            (BlockFormat::Q4_1, 3) => $job.$run::<true, 3>(),
            (BlockFormat::Q4_1, _) => $job.$run::<true, 4>(),
            (BlockFormat::Q8_0, 1) => $job.$run::<false, 1>(),
            (BlockFormat::Q8_0, 2) => $job.$run::<false, 2>(),
            (BlockFormat::Q8_0, 3) => $job.$run::<false, 3>(),
            (BlockFormat::Q8_0, _) => $job.$run::<false, 4>(),
        }
    };
}
use by_shape;

/// One output row's blocks: their integers, scales and minimums (empty for `Q8_0`).
type RowBlocks<'a> = (&'a [u8], &'a [f32], &'a [f32]);

impl<'a> Rows<'a> {
    /// Output row `r` of the task: its blocks' integers, scales and minimums.
    #[inline(always)]
    fn row<const Q4: bool>(&self, r: usize) -> RowBlocks<'a> {
        let (w, blocks) = (self.w, self.blocks);
        let qb = if Q4 { 16 } else { 32 };
        let row = self.first + r;
        let mins: &[f32] = if Q4 {
            &w.mins[row * blocks..(row + 1) * blocks]
        } else {
            &[]
        };
        (
            &w.quants[row * blocks * qb..(row + 1) * blocks * qb],
            &w.scales[row * blocks..(row + 1) * blocks],
            mins,
        )
    }

    /// The module docs' arithmetic, one lane at a time.
    fn scalar_rows<const Q4: bool, const M: usize>(self) {
        let qb = if Q4 { 16 } else { 32 };
        let (x, blocks, cols) = (self.x, self.blocks, self.w.cols);
        for r in 0..self.out.len() / M {
            let (quants, scales, mins) = self.row::<Q4>(r);
            // [input row][half][lane]
            let mut acc = [[[0.0f32; LANES]; 2]; M];
            for b in 0..blocks {
                let block = &quants[b * qb..][..qb];
                let d = scales[b];
                // Half 0 holds weights 0..16 of the block, half 1 weights 16..32, exactly as
                // `PackedMatrix::dequantize` computes them.
                let w: [[f32; LANES]; 2] = if Q4 {
                    let m = mins[b];
                    [
                        std::array::from_fn(|l| f32::from(block[l] & 0x0f) * d + m),
                        std::array::from_fn(|l| f32::from(block[l] >> 4) * d + m),
                    ]
                } else {
                    [
                        std::array::from_fn(|l| f32::from(block[l] as i8) * d),
                        std::array::from_fn(|l| f32::from(block[l + LANES] as i8) * d),
                    ]
                };
                for (i, acc) in acc.iter_mut().enumerate() {
                    let xb = &x[i * cols + b * BLOCK..][..BLOCK];
                    for (h, acc) in acc.iter_mut().enumerate() {
                        for l in 0..LANES {
                            acc[l] = xb[h * LANES + l].mul_add(w[h][l], acc[l]);
                        }
                    }
                }
            }
            for (i, [lo, hi]) in acc.iter().enumerate() {
                let lanes: [f32; LANES] = std::array::from_fn(|l| lo[l] + hi[l]);
                self.out[r * M + i] = lane_sum(&lanes);
            }
        }
    }
}

/// The AVX2 and AVX-512 instances of [`Rows::scalar_rows`]: the same operations in the
/// same order, 8 or 16 lanes per instruction; one row loop ([`x86::SimdRows`]) over both.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{__m128i, __m256, __m512};
    use pulp::cast;
    use pulp::x86::{V3, V4};

    use super::{BLOCK, BlockFormat, LANES, RowBlocks, Rows, lane_sum};

    /// 16 bytes of `s` from `at` (a length the compiler knows, so the check folds away).
    #[inline(always)]
    fn bytes16(s: &[u8], at: usize) -> __m128i {
        let a: [u8; 16] = s[at..at + 16].try_into().unwrap_or_default();
        cast(a)
    }

    /// What the row loop needs of an instruction set: a 16-lane vector of f32 (one AVX-512
    /// register, or two AVX2 ones), zero, addition, a block's weights and the fused
    /// multiply-add.
    pub(super) trait Lanes: Copy {
        type V: Copy + pulp::bytemuck::NoUninit;
        fn zero(self) -> Self::V;
        fn add(self, a: Self::V, b: Self::V) -> Self::V;
        /// Weights 0..16 and 16..32 of block `b` of `row`, as the dense model holds them.
        fn weights<const Q4: bool>(self, row: RowBlocks<'_>, b: usize) -> [Self::V; 2];
        /// `x[at..at + 16]·w + acc`, one rounding per lane.
        fn fma(self, x: &[f32], at: usize, w: Self::V, acc: Self::V) -> Self::V;
        /// The CPU's V3 part (prefetching).
        fn v3(self) -> V3;
    }

    /// A task on an instruction set's vectors: [`super::Rows::scalar_rows`]'s loop, each
    /// block's 16 lanes in one step.
    pub(super) struct SimdRows<'a, S> {
        pub(super) simd: S,
        pub(super) job: Rows<'a>,
    }

    impl<S: Lanes> pulp::WithSimd for SimdRows<'_, S> {
        type Output = ();
        #[inline(always)]
        fn with_simd<P: pulp::Simd>(self, _: P) {
            by_shape!(self.job, self, rows)
        }
    }

    impl<S: Lanes> SimdRows<'_, S> {
        /// One output row at a time, its blocks streamed in order, each block's weights
        /// formed once for the `M` input rows.
        // Index loops: an iterator adaptor left as a call would not be compiled for the
        // CPU's vectors (only what inlines into `vectorize` is).
        #[allow(clippy::needless_range_loop)]
        #[inline(always)]
        fn rows<const Q4: bool, const M: usize>(self) {
            let (s, job) = (self.simd, self.job);
            let (x, cols) = (job.x, job.w.cols);
            for r in 0..job.out.len() / M {
                let row = job.row::<Q4>(r);
                prefetch_ahead(s.v3(), row, PREFETCH_ROWS);
                let mut acc = [[s.zero(); 2]; M];
                for b in 0..job.blocks {
                    let [lo, hi] = s.weights::<Q4>(row, b);
                    for i in 0..M {
                        let at = i * cols + b * BLOCK;
                        acc[i][0] = s.fma(x, at, lo, acc[i][0]);
                        acc[i][1] = s.fma(x, at + LANES, hi, acc[i][1]);
                    }
                }
                for i in 0..M {
                    job.out[r * M + i] = lane_sum(&cast(s.add(acc[i][0], acc[i][1])));
                }
            }
        }
    }

    impl Lanes for V4 {
        type V = __m512;
        #[inline(always)]
        fn v3(self) -> V3 {
            *self
        }
        #[inline(always)]
        fn zero(self) -> __m512 {
            self.avx512f._mm512_setzero_ps()
        }
        #[inline(always)]
        fn add(self, a: __m512, b: __m512) -> __m512 {
            self.avx512f._mm512_add_ps(a, b)
        }
        #[inline(always)]
        fn weights<const Q4: bool>(self, row: RowBlocks<'_>, b: usize) -> [__m512; 2] {
            let (quants, scales, mins) = row;
            let f = self.avx512f;
            let d = f._mm512_set1_ps(scales[b]);
            if Q4 {
                // The block's 16 possible weights, `i·d + m`, rounded as the scalar's.
                let iota: __m512 = cast(std::array::from_fn::<f32, 16, _>(|i| i as f32));
                let table = f._mm512_add_ps(f._mm512_mul_ps(iota, d), f._mm512_set1_ps(mins[b]));
                // Each byte as a 32-bit index: the permutation reads its low 4 bits (the
                // low nibble); shifted by 4, the high nibble.
                let idx = f._mm512_cvtepu8_epi32(bytes16(quants, b * 16));
                [
                    f._mm512_permutexvar_ps(idx, table),
                    f._mm512_permutexvar_ps(f._mm512_srli_epi32::<4>(idx), table),
                ]
            } else {
                let lo = f._mm512_cvtepi8_epi32(bytes16(quants, b * 32));
                let hi = f._mm512_cvtepi8_epi32(bytes16(quants, b * 32 + 16));
                [
                    f._mm512_mul_ps(f._mm512_cvtepi32_ps(lo), d),
                    f._mm512_mul_ps(f._mm512_cvtepi32_ps(hi), d),
                ]
            }
        }
        #[inline(always)]
        fn fma(self, x: &[f32], at: usize, w: __m512, acc: __m512) -> __m512 {
            let a: [f32; 16] = x[at..at + 16].try_into().unwrap_or_default();
            self.avx512f._mm512_fmadd_ps(cast(a), w, acc)
        }
    }

    impl Lanes for V3 {
        type V = [__m256; 2];
        #[inline(always)]
        fn v3(self) -> V3 {
            self
        }
        #[inline(always)]
        fn zero(self) -> [__m256; 2] {
            [self.avx._mm256_setzero_ps(); 2]
        }
        #[inline(always)]
        fn add(self, a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
            [
                self.avx._mm256_add_ps(a[0], b[0]),
                self.avx._mm256_add_ps(a[1], b[1]),
            ]
        }
        #[inline(always)]
        fn weights<const Q4: bool>(self, row: RowBlocks<'_>, b: usize) -> [[__m256; 2]; 2] {
            let (quants, scales, mins) = row;
            let (avx, sse2) = (self.avx, self.sse2);
            let d = avx._mm256_set1_ps(scales[b]);
            // 8 integers as f32 times d (plus m for `Q4_1`), rounded as the scalar's.
            let scale = |q: __m256| {
                let w = avx._mm256_mul_ps(q, d);
                if Q4 {
                    avx._mm256_add_ps(w, avx._mm256_set1_ps(mins[b]))
                } else {
                    w
                }
            };
            let (lo, hi) = if Q4 {
                let (n, mask) = (bytes16(quants, b * 16), sse2._mm_set1_epi8(0x0f));
                (
                    sse2._mm_and_si128(n, mask),
                    sse2._mm_and_si128(sse2._mm_srli_epi16::<4>(n), mask),
                )
            } else {
                (bytes16(quants, b * 32), bytes16(quants, b * 32 + 16))
            };
            let [a, b2] = widen(self, lo, !Q4);
            let [c, e] = widen(self, hi, !Q4);
            [[scale(a), scale(b2)], [scale(c), scale(e)]]
        }
        #[inline(always)]
        fn fma(self, x: &[f32], at: usize, w: [__m256; 2], acc: [__m256; 2]) -> [__m256; 2] {
            let load = |at: usize| -> __m256 {
                let a: [f32; 8] = x[at..at + 8].try_into().unwrap_or_default();
                cast(a)
            };
            [
                self.fma._mm256_fmadd_ps(load(at), w[0], acc[0]),
                self.fma._mm256_fmadd_ps(load(at + 8), w[1], acc[1]),
            ]
        }
    }

    /// How many rows ahead of the one being multiplied its blocks are asked for. A single
    /// stream's product reads the weights from memory once; on the 2-core Xeon, in one process
    /// alternating with none (SmolLM2's shapes, `examples/packed_speed.rs`), 4 rows ahead took
    /// the layers from 3.74 to 3.09 ns a block and the head from 5.87 to 4.44, and cost 6% on a
    /// matrix already in cache.
    const PREFETCH_ROWS: usize = 4;

    /// Asks for the blocks of the row `ahead` rows after `row` (rows are contiguous), a cache
    /// line at a time; a prefetch past the matrix's end is a hint that never faults.
    #[inline(always)]
    fn prefetch_ahead(s: V3, row: RowBlocks<'_>, ahead: usize) {
        use core::arch::x86_64::_MM_HINT_T0;
        let (q, d, m) = row;
        let touch = |p: *const u8, len: usize| {
            let mut at = 0;
            while at < len {
                s.sse._mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at).cast());
                at += 64;
            }
        };
        touch(q.as_ptr().wrapping_add(q.len() * ahead), q.len());
        touch(d.as_ptr().wrapping_add(d.len() * ahead).cast(), 4 * d.len());
        touch(m.as_ptr().wrapping_add(m.len() * ahead).cast(), 4 * m.len());
    }

    /// Lanes 0..8 and 8..16 of a 16-lane vector of f32 from 16 integers (AVX2).
    #[inline(always)]
    fn widen(s: V3, v: __m128i, signed: bool) -> [__m256; 2] {
        let high = s.sse2._mm_srli_si128::<8>(v);
        let (a, b) = if signed {
            (
                s.avx2._mm256_cvtepi8_epi32(v),
                s.avx2._mm256_cvtepi8_epi32(high),
            )
        } else {
            (
                s.avx2._mm256_cvtepu8_epi32(v),
                s.avx2._mm256_cvtepu8_epi32(high),
            )
        };
        [s.avx._mm256_cvtepi32_ps(a), s.avx._mm256_cvtepi32_ps(b)]
    }
}

/// The 16 lanes added pairwise: `(a0 + a8) …`, then halves again, in a fixed order.
#[inline(always)]
fn lane_sum(a: &[f32; LANES]) -> f32 {
    let mut v = *a;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One `Q4_1` block: d = 0.5, m = −1, nibbles: byte j = j | (15 − j) << 4.
    fn q4_block() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        b
    }

    #[test]
    fn blocks_dequantize_as_ggml_defines_them() {
        let w = PackedMatrix::from_ggml(BlockFormat::Q4_1, 1, 32, &q4_block()).expect("block");
        let v = w.dequantize();
        // Weight j < 16: j·0.5 − 1; weight j + 16: (15 − j)·0.5 − 1.
        assert_eq!(&v[..3], &[-1.0, -0.5, 0.0]);
        assert_eq!(v[15], 6.5);
        assert_eq!(v[16], 6.5);
        assert_eq!(v[31], -1.0);
        let mut q8 = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        q8.extend((0..32i8).map(|j| (j - 16) as u8));
        let w = PackedMatrix::from_ggml(BlockFormat::Q8_0, 1, 32, &q8).expect("block");
        let v = w.dequantize();
        assert_eq!((v[0], v[16], v[31]), (-4.0, 0.0, 3.75));
    }

    #[test]
    fn a_block_times_a_hand_vector() {
        // x = 1 everywhere: y = Σ w = Σ_j (j·0.5 − 1) + Σ_j ((15 − j)·0.5 − 1)
        //   = 2 · (0.5 · 120 − 16) = 88.
        let w = PackedMatrix::from_ggml(BlockFormat::Q4_1, 1, 32, &q4_block()).expect("block");
        assert_eq!(packed_matmul_host(&[1.0; 32], 1, &w), vec![88.0]);
        // x_j = 1 for j < 16 only: Σ_j (j·0.5 − 1) = 60 − 16 = 44.
        let mut x = [0.0f32; 32];
        x[..16].fill(1.0);
        assert_eq!(packed_matmul_host(&x, 1, &w), vec![44.0]);
    }

    /// Random blocks: each f16 scale a normal number, nibbles and bytes uniform.
    fn random_blocks(format: BlockFormat, blocks: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut raw = Vec::new();
        for _ in 0..blocks {
            let d = 0.001 + (next() % 1000) as f32 * 1e-5;
            raw.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            if format == BlockFormat::Q4_1 {
                let m = -((next() % 1000) as f32) * 1e-4;
                raw.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
            }
            raw.extend((0..format.quant_bytes()).map(|_| next() as u8));
        }
        raw
    }

    #[test]
    fn matches_the_dense_product_of_its_weights() {
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let (rows, cols) = (200, 96);
            let raw = random_blocks(format, rows * cols / BLOCK, 7);
            let w = PackedMatrix::from_ggml(format, rows, cols, &raw).expect("blocks");
            let dense = w.dequantize();
            for m in 1..=PACKED_MAX_ROWS {
                let x: Vec<f32> = (0..m * cols)
                    .map(|k| ((k * 37 % 101) as f32 - 50.0) / 25.0)
                    .collect();
                let y = packed_matmul_host(&x, m, &w);
                assert_eq!(y.len(), m * rows);
                for i in 0..m {
                    for n in 0..rows {
                        let exact: f64 = (0..cols)
                            .map(|k| f64::from(x[i * cols + k]) * f64::from(dense[n * cols + k]))
                            .sum();
                        let scale: f64 = (0..cols)
                            .map(|k| (x[i * cols + k] * dense[n * cols + k]).abs() as f64)
                            .sum();
                        let got = f64::from(y[i * rows + n]);
                        assert!(
                            (got - exact).abs() <= 1e-5 * scale.max(1e-3),
                            "{format:?} m={m} row {i} out {n}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_are_independent_of_their_neighbours_and_of_threads() {
        // 1040 × 64 weights: above PARALLEL_MIN, so two threads split it (in 17 tasks, the
        // last one short).
        let rows = 1040;
        assert!(rows * 64 >= PARALLEL_MIN);
        let raw = random_blocks(BlockFormat::Q4_1, rows * 64 / BLOCK, 3);
        let w = PackedMatrix::from_ggml(BlockFormat::Q4_1, rows, 64, &raw).expect("blocks");
        let x: Vec<f32> = (0..3 * 64).map(|k| (k as f32 * 0.37).sin()).collect();
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("pool")
        };
        let together = pool(1).install(|| packed_matmul_host(&x, 3, &w));
        for i in 0..3 {
            let alone = packed_matmul_host(&x[i * 64..(i + 1) * 64], 1, &w);
            assert_eq!(alone, together[i * rows..(i + 1) * rows]);
        }
        assert_eq!(pool(2).install(|| packed_matmul_host(&x, 3, &w)), together);
    }

    #[test]
    fn every_instruction_set_gives_the_scalar_bits() {
        let mut isas = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            isas.extend(pulp::x86::V3::try_new().map(Isa::V3));
            isas.extend(pulp::x86::V4::try_new().map(Isa::V4));
        }
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let (rows, cols) = (150, 192);
            let raw = random_blocks(format, rows * cols / BLOCK, 11);
            let w = PackedMatrix::from_ggml(format, rows, cols, &raw).expect("blocks");
            for m in 1..=PACKED_MAX_ROWS {
                let x: Vec<f32> = (0..m * cols).map(|k| (k as f32 * 0.731).cos()).collect();
                let want = matmul_on(Isa::Scalar, &x, m, &w);
                for isa in &isas[1..] {
                    let got = matmul_on(*isa, &x, m, &w);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?}, {m} rows: an instruction set differs");
                }
            }
        }
        eprintln!("instruction sets compared: {}", isas.len());
    }

    /// The tensor-level op on the CPU backends is the host product; more than
    /// [`PACKED_MAX_ROWS`] rows, a wrong width and `Autodiff` get `None` (the dense path).
    fn tensor_op_on<B: AttentionOps>() {
        let (rows, cols) = (70, 64);
        let raw = random_blocks(BlockFormat::Q4_1, rows * cols / BLOCK, 5);
        let w = PackedMatrix::from_ggml(BlockFormat::Q4_1, rows, cols, &raw).expect("blocks");
        let device = Default::default();
        let x: Vec<f32> = (0..2 * cols).map(|k| (k as f32 * 0.1).sin()).collect();
        let t = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [2, cols]), &device);
        let y = packed_matmul(&t, &w).expect("a CPU backend has the op");
        assert_eq!(y.dims(), [2, rows]);
        let y = y.into_data().into_vec::<f32>().expect("f32");
        assert_eq!(y, packed_matmul_host(&x, 2, &w));
        let five = Tensor::<B, 2>::zeros([5, cols], &device);
        assert!(packed_matmul(&five, &w).is_none());
        let narrow = Tensor::<B, 2>::zeros([1, 32], &device);
        assert!(packed_matmul(&narrow, &w).is_none());
        let tracked = Tensor::<burn::backend::Autodiff<B>, 2>::zeros([1, cols], &device);
        assert!(packed_matmul(&tracked, &w).is_none());
        assert!(packed_matmul_supported::<B>(&device));
        assert!(!packed_matmul_supported::<burn::backend::Autodiff<B>>(
            &device
        ));
    }

    #[test]
    fn the_tensor_op_runs_on_ndarray() {
        tensor_op_on::<burn::backend::NdArray<f32>>();
    }

    #[cfg(feature = "flex")]
    #[test]
    fn the_tensor_op_runs_on_flex() {
        tensor_op_on::<burn::backend::Flex>();
    }

    #[test]
    fn malformed_blocks_are_errors() {
        assert_eq!(
            PackedMatrix::from_ggml(BlockFormat::Q4_1, 1, 48, &[0; 30]).err(),
            Some(PackedError::RowLength { cols: 48 })
        );
        assert!(matches!(
            PackedMatrix::from_ggml(BlockFormat::Q8_0, 2, 32, &[0; 34]),
            Err(PackedError::Bytes {
                expected: 68,
                got: 34,
                ..
            })
        ));
    }
}
