//! The packed product alone, on SmolLM2-135M's shapes: what one decoded token's products cost
//! (a program, not a test; numbers vary with the machine's load and clock, so compare runs
//! made side by side):
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p rlany-kernels --example packed_speed`
//!
//! Prints the median over repetitions of: the 30 layers' seven `Q4_1` products read from
//! memory once each (as a decode reads them), the tied `Q8_0` head, and one `Q4_1` matrix
//! multiplied again and again (in cache: the arithmetic alone), in ns per 32-weight block.
use rlany_kernels::packed::{BlockFormat, PackedMatrix, packed_matmul_host};
use std::time::Instant;

/// A matrix of pseudo-random blocks whose f16 scales and minimums are finite.
fn matrix(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> PackedMatrix {
    let block = format.ggml_bytes();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let raw: Vec<u8> = (0..rows * cols / 32 * block)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = i % block;
            // The high byte of each f16 (scale, and minimum for Q4_1): a small exponent.
            if at == 1 || (format == BlockFormat::Q4_1 && at == 3) {
                0x20
            } else {
                (s >> 33) as u8
            }
        })
        .collect();
    match PackedMatrix::from_ggml(format, rows, cols, &raw) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (d, f, kv, layers, vocab) = (576, 1536, 192, 30, 49152);
    let x = |n: usize| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.37).sin()).collect() };
    let (x_d, x_f) = (x(d), x(f));
    // Per layer: q, k, v, o, gate, up (input d_model) and down (input ffn).
    let shapes = [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)];
    let mats: Vec<PackedMatrix> = (0..layers as u64)
        .flat_map(|l| {
            shapes
                .iter()
                .enumerate()
                .map(move |(k, &(r, c))| matrix(BlockFormat::Q4_1, r, c, l * 10 + k as u64))
        })
        .collect();
    let head = matrix(BlockFormat::Q8_0, vocab, d, 999);
    let blocks = |m: &PackedMatrix| (m.rows() * m.cols() / 32) as f64;
    let layer_blocks: f64 = mats.iter().map(blocks).sum();
    let input = |m: &PackedMatrix| if m.cols() == d { &x_d } else { &x_f };
    let (mut cold, mut top, mut hot) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        for m in &mats {
            std::hint::black_box(packed_matmul_host(input(m), 1, m));
        }
        cold.push(t.elapsed().as_secs_f64() * 1e9 / layer_blocks);
        let t = Instant::now();
        std::hint::black_box(packed_matmul_host(&x_d, 1, &head));
        top.push(t.elapsed().as_secs_f64() * 1e9 / blocks(&head));
        let m = &mats[4];
        let t = Instant::now();
        for _ in 0..100 {
            std::hint::black_box(packed_matmul_host(&x_d, 1, m));
        }
        hot.push(t.elapsed().as_secs_f64() * 1e9 / (100.0 * blocks(m)));
    }
    let (cold, top, hot) = (median(cold), median(top), median(hot));
    println!(
        "ns per block (median of 15): layers from memory {cold:.2}, Q8_0 head {top:.2}, \
         Q4_1 in cache {hot:.2}; one token's products {:.2} ms",
        (cold * layer_blocks + top * blocks(&head)) / 1e6
    );
}
