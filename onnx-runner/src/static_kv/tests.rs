//! The masks of a static export, checked row by row.

use super::*;

/// Rows at positions 2 and 3 of a buffer of 5; with a window of 2, position 3 no longer sees
/// key 1.
#[test]
fn mask_is_causal_from_the_rows_positions_and_slides() {
    let m = attn_mask(2, 2, 5, None);
    let seen = |m: &Array4<f32>, t: usize| -> Vec<bool> {
        (0..5).map(|j| m[[0, 0, t, j]] == 0.0).collect()
    };
    assert_eq!(seen(&m, 0), [true, true, true, false, false]);
    assert_eq!(seen(&m, 1), [true, true, true, true, false]);
    let w = attn_mask(2, 2, 5, Some(2));
    assert_eq!(seen(&w, 0), [false, true, true, false, false]);
    assert_eq!(seen(&w, 1), [false, false, true, true, false]);
    assert_eq!(w[[0, 0, 0, 0]], HIDDEN);
}

/// Fast rows at positions 2 and 3 of a buffer of 5: buffer keys before their position, then
/// their own key among the two appended; with a window of 2, position 3 sees key 2 only.
#[test]
fn fast_mask_sees_earlier_buffer_keys_and_its_own_key() {
    let seen = |m: &Array4<f32>, t: usize| -> Vec<bool> {
        (0..7).map(|j| m[[0, 0, t, j]] == 0.0).collect()
    };
    let m = fast_attn_mask(2, 2, 5, None);
    assert_eq!(m.shape(), [1, 1, 2, 7]);
    assert_eq!(seen(&m, 0), [true, true, false, false, false, true, false]);
    assert_eq!(seen(&m, 1), [true, true, true, false, false, false, true]);
    let w = fast_attn_mask(2, 2, 5, Some(2));
    assert_eq!(seen(&w, 0), [false, true, false, false, false, true, false]);
    assert_eq!(seen(&w, 1), [false, false, true, false, false, false, true]);
}
