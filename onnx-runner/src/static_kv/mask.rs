//! The additive attention masks a static graph takes: `attn_mask` over the buffers' keys, and a
//! static draft.onnx's `fast_attn_mask` of its fast rows.

use ndarray::Array4;

/// The mask value of a hidden key (the exporter's `static_graph::HIDDEN`).
pub const HIDDEN: f32 = f32::MIN;

/// The additive mask of `rows` rows at positions `pos0..pos0 + rows` over `l_max` keys.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max]`
pub fn attn_mask(
    pos0: usize,
    rows: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    Array4::from_shape_fn((1, 1, rows, l_max), |(_, _, t, j)| {
        let p = pos0 + t;
        let visible = j <= p && sliding_window.is_none_or(|w| p - j < w);
        if visible { 0.0 } else { HIDDEN }
    })
}

/// The additive mask of the fast rows of a static draft.onnx (`fast_attn_mask`): `rows` rows at
/// positions `pos0..pos0 + rows` over the `l_max` buffer keys then the rows' own `rows` keys. Row
/// `t` at position `p` sees buffer keys `0..p` (not its own position: the slow row's key there
/// is not the fast row's), the last `sliding_window - 1` of them when the config has one, and
/// its own key at column `l_max + t`, never another row's.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max + rows]`
pub fn fast_attn_mask(
    pos0: usize,
    rows: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    Array4::from_shape_fn((1, 1, rows, l_max + rows), |(_, _, t, j)| {
        let p = pos0 + t;
        let visible = match j.checked_sub(l_max) {
            Some(own) => own == t,
            None => j < p && sliding_window.is_none_or(|w| p - j < w),
        };
        if visible { 0.0 } else { HIDDEN }
    })
}
