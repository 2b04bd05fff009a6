//! Rotary positions (Su et al., arXiv 2104.09864) as one backend op.
//!
//! Composed from tensor ops, the "rotate half" rotation is seven passes over the head
//! dimension (two halves narrowed out, four products, a sum, a difference and a
//! concatenation), each through CPU backends' generic strided path when the halves are views
//! and the angles broadcast over the heads (burn-flex 0.21: 5.9% of a 32-row SmolLM2 decode on
//! the main thread; reports/perf/NOTES.md §9i). [`AttentionOps::rotary`] lets a backend do it
//! in one pass; the composition ([`reference_rotary`]) is the reference twin and the default.
//! The rotation is orthogonal, so its backward is the rotation by the opposite angles
//! (`sin` negated), which `Autodiff<B>` computes with the same op.

use burn::prelude::*;

use crate::attention::AttentionOps;
use crate::ops::{float, into_prim};

/// The reference twin: `[x1, x2] ↦ [x1·cos − x2·sin, x2·cos + x1·sin]`, `x1` and `x2` the
/// halves of the head dimension; each output is two products and one sum, rounded in that
/// order.
///
/// # Shapes
/// - `x`: `[batch, heads, seq, head_dim]`
/// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
/// - output: `[batch, heads, seq, head_dim]`
pub fn reference_rotary<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let half = x.dims()[3] / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x2 * cos + x1 * sin,
        ],
        3,
    )
}

/// Tensor-level wrapper: [`AttentionOps::rotary`] on `B`.
///
/// # Shapes
/// As [`reference_rotary`].
pub fn rotary<B: AttentionOps>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Tensor<B, 4> {
    float(B::rotary(
        into_prim(x),
        into_prim(cos.clone()),
        into_prim(sin.clone()),
    ))
}

/// [`reference_rotary`]'s arithmetic on host slices, one pass: `x` contiguous
/// `[batch, heads, seq, head_dim]`, `cos` and `sin` contiguous `[angle_rows, 1, seq, half]`
/// with `angle_rows` 1 (shared by every row) or `batch`. Each output element is computed as
/// the reference rounds it (two products, then one sum), so the results are bit for bit the
/// composition's.
#[cfg_attr(not(feature = "flex"), allow(dead_code))] // Flex's override is its one caller
pub(crate) fn rotary_host(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    [batch, heads, seq, head_dim]: [usize; 4],
    angle_rows: usize,
) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0f32; x.len()];
    for b in 0..batch {
        let angles = if angle_rows == 1 { 0 } else { b };
        for h in 0..heads {
            for s in 0..seq {
                let row = ((b * heads + h) * seq + s) * head_dim;
                let at = (angles * seq + s) * half;
                let (c, sn) = (&cos[at..at + half], &sin[at..at + half]);
                let (x1, x2) = x[row..row + head_dim].split_at(half);
                let (o1, o2) = out[row..row + head_dim].split_at_mut(half);
                for i in 0..half {
                    o1[i] = x1[i] * c[i] - x2[i] * sn[i];
                    o2[i] = x2[i] * c[i] + x1[i] * sn[i];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One pair by hand: head_dim 2, angle θ with cos 0.6, sin 0.8 (a 3-4-5 triangle):
    /// (1, 2) ↦ (1·0.6 − 2·0.8, 2·0.6 + 1·0.8) = (−1, 2).
    #[test]
    fn the_host_pass_rotates_a_pair_by_hand() {
        let got = rotary_host(&[1.0, 2.0], &[0.6], &[0.8], [1, 1, 1, 2], 1);
        assert!(
            (got[0] + 1.0).abs() < 1e-6 && (got[1] - 2.0).abs() < 1e-6,
            "{got:?}"
        );
    }

    /// Angles per row (`angle_rows` = batch) pick each row's own; shared ones serve every row.
    #[test]
    fn the_host_pass_reads_each_row_s_own_angles_or_the_shared_ones() {
        // batch 2, one head, one position, head_dim 2; row 0 unrotated, row 1 by 90°.
        let x = [1.0, 0.0, 1.0, 0.0];
        let per_row = rotary_host(&x, &[1.0, 0.0], &[0.0, 1.0], [2, 1, 1, 2], 2);
        assert_eq!(per_row, vec![1.0, 0.0, 0.0, 1.0]);
        let shared = rotary_host(&x, &[0.0], &[1.0], [2, 1, 1, 2], 1);
        assert_eq!(shared, vec![0.0, 1.0, 0.0, 1.0]);
    }
}
