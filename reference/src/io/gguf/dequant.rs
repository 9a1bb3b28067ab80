//! Dequantisation of ggml blocks to f32, bit for bit as gguf-py (`gguf.quants.dequantize`, the
//! numpy port of ggml-quants.c) computes it.
//!
//! Every kernel turns one block of `type_size` bytes into `block_size` values. Scales are f16
//! (`d`, `m`, `dmin`) widened to f32; products and sums are done one f32 operation at a time in
//! the order gguf-py does them (Rust never fuses `a * b + c` into an FMA, numpy does not either),
//! which is what makes the results equal bit for bit.
//!
//! Block layouts (bytes; `nibble_j` of a 16-byte `qs` is `qs[j] & 15` for j < 16 and
//! `qs[j - 16] >> 4` otherwise):
//!
//! | type | bytes | layout | value j |
//! |------|-------|--------|---------|
//! | Q4_0 | 18 | `d, qs[16]` | `d * (nibble_j - 8)` |
//! | Q4_1 | 20 | `d, m, qs[16]` | `d * nibble_j + m` |
//! | Q5_0 | 22 | `d, qh: u32, qs[16]` | `d * ((nibble_j \| bit_j(qh) << 4) - 16)` |
//! | Q5_1 | 24 | `d, m, qh: u32, qs[16]` | `d * (nibble_j \| bit_j(qh) << 4) + m` |
//! | Q8_0 | 34 | `d, qs: [i8; 32]` | `qs[j] * d` |
//! | Q4_K | 144 | `d, dmin, scales[12], qs[128]` | 8 sub-blocks of 32: `(d * sc) * q - (dmin * mn)` |
//! | Q5_K | 176 | `d, dmin, scales[12], qh[32], qs[128]` | as Q4_K, a fifth bit from `qh` |
//! | Q6_K | 210 | `ql[128], qh[64], scales: [i8; 16], d` | 16 sub-blocks of 16: `(d * sc) * (q - 32)` |

use super::ggml_type::GgmlType;

/// The ggml types [`dequantize`] handles.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Dequantise `bytes` holding whole blocks of `ty` into f32 values, or `None` if `ty` is not in
/// [`SUPPORTED`]. Trailing bytes short of a whole block are ignored (the reader never passes any).
///
/// # Shapes
/// - `bytes`: `[n_blocks * type_size]`
/// - returns: `[n_blocks * block_size]`
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let kernel: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, out| out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, out| out[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, out| out[0] = f32::from_bits(u32::from(u16_at(b, 0)) << 16),
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        _ => return None,
    };
    let (block, size) = (ty.block_size(), ty.type_size());
    let mut out = vec![0f32; bytes.len() / size * block];
    for (b, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(block)) {
        kernel(b, o);
    }
    Some(out)
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// The f16 at byte `i`, widened to f32 (exact).
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16_at(b, i)).to_f32()
}

/// Nibble `j` (0..32) of a 16-byte `qs`: low nibbles hold values 0..16, high nibbles 16..32.
fn nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    }
}

fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(qs, j) as i8 - 8);
    }
}

fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(qs, j)) + m;
    }
}

/// The 5-bit quant j of a Q5_0 / Q5_1 block: a nibble plus bit j of `qh`.
fn five_bit(qh: u32, qs: &[u8], j: usize) -> u8 {
    nibble(qs, j) | ((((qh >> j) & 1) as u8) << 4)
}

fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bit(qh, qs, j) as i8 - 16);
    }
}

fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bit(qh, qs, j)) + m;
    }
}

fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Scale and min (6 bits each) of sub-block `s` (0..8) from the 12 packed bytes of Q4_K / Q5_K
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        let k = s - 4;
        (
            (scales[8 + k] & 0x0F) | ((scales[k] >> 2) & 0x30),
            (scales[8 + k] >> 4) | ((scales[4 + k] >> 2) & 0x30),
        )
    }
}

/// Q4_K and Q5_K share everything but the fifth bit: `qh` is `None` for Q4_K.
fn k_quant(d: f32, dmin: f32, scales: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let (sc, mn) = scale_min_k4(scales, s);
        let ds = d * f32::from(sc);
        let dm = dmin * f32::from(mn);
        // Sub-blocks 2g and 2g+1 are the low and high nibbles of bytes 32g..32g+32.
        let (group, shift) = (s / 2, 4 * (s % 2));
        for (i, o) in sub.iter_mut().enumerate() {
            let mut q = (qs[32 * group + i] >> shift) & 0x0F;
            if let Some(qh) = qh {
                q |= ((qh[i] >> s) & 1) << 4;
            }
            *o = ds * f32::from(q) - dm;
        }
    }
}

fn q4_k(b: &[u8], out: &mut [f32]) {
    k_quant(
        f16_at(b, 0),
        f16_at(b, 2),
        &b[4..16],
        None,
        &b[16..144],
        out,
    );
}

fn q5_k(b: &[u8], out: &mut [f32]) {
    k_quant(
        f16_at(b, 0),
        f16_at(b, 2),
        &b[4..16],
        Some(&b[16..48]),
        &b[48..176],
        out,
    );
}

fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, o) in out.iter_mut().enumerate() {
        // Two halves of 128 values; in each, ql gives 4 low bits (64 bytes, two nibbles each) and
        // qh 2 high bits (32 bytes, four pairs each).
        let (half, r) = (e / 128, e % 128);
        let low = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = (low | (high << 4)) as i8 - 32;
        let ds = d * f32::from(scales[e / 16] as i8);
        *o = ds * f32::from(q);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    fn deq(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        dequantize(ty, bytes).unwrap()
    }

    #[test]
    fn plain_types() {
        let f32s: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(deq(GgmlType::F32, &f32s), vec![1.5, -2.0]);
        let f16s = [h(0.5), h(-3.0)].concat();
        assert_eq!(deq(GgmlType::F16, &f16s), vec![0.5, -3.0]);
        // bf16 0x3fc0 = 1.5, 0xc000 = -2.0
        assert_eq!(
            deq(GgmlType::BF16, &[0xc0, 0x3f, 0x00, 0xc0]),
            vec![1.5, -2.0]
        );
    }

    #[test]
    fn q8_0_block() {
        // d = 0.5; q = 0, 1, -1, 2, -2, ... ; value = q * 0.5
        let mut b = h(0.5).to_vec();
        let qs: Vec<i8> = (0..32)
            .map(|j| if j % 2 == 0 { -(j / 2) } else { j / 2 + 1 })
            .collect();
        b.extend(qs.iter().map(|&q| q as u8));
        let want: Vec<f32> = qs.iter().map(|&q| f32::from(q) * 0.5).collect();
        assert_eq!(deq(GgmlType::Q8_0, &b), want);
        assert_eq!(&want[..4], &[0.0, 0.5, -0.5, 1.0]);
        assert_eq!(deq(GgmlType::Q8_0, &[&b[..], &b[..]].concat()).len(), 64);
    }

    #[test]
    fn q4_0_block() {
        // d = 2; byte j = low nibble j, high nibble 15 - j  ->  values 2*(j-8) then 2*(7-j)
        let mut b = h(2.0).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let out = deq(GgmlType::Q4_0, &b);
        assert_eq!(out[0], -16.0);
        assert_eq!(out[15], 14.0);
        assert_eq!(out[16], 14.0);
        assert_eq!(out[31], -16.0);
    }

    #[test]
    fn q4_1_block() {
        // d = 0.5, m = -1; low nibbles j, high nibbles 3  ->  0.5*j - 1 then 0.5
        let mut b = [h(0.5), h(-1.0)].concat();
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let out = deq(GgmlType::Q4_1, &b);
        assert_eq!(&out[..3], &[-1.0, -0.5, 0.0]);
        assert_eq!(out[15], 6.5);
        assert!(out[16..].iter().all(|&v| v == 0.5));
    }

    #[test]
    fn q5_0_block() {
        // d = 1; all nibbles 0; qh sets bit 0 and bit 31  ->  q = 16 - 16 = 0 there, -16 elsewhere
        let mut b = h(1.0).to_vec();
        b.extend((1u32 | (1 << 31)).to_le_bytes());
        b.extend([0u8; 16]);
        let out = deq(GgmlType::Q5_0, &b);
        assert_eq!(out[0], 0.0);
        assert_eq!(out[31], 0.0);
        assert!(out[1..31].iter().all(|&v| v == -16.0));
        // nibble 15 in the low half of byte 1 plus bit 1 -> q = 31 -> 15
        b[6 + 1] = 0x0F;
        b[2] |= 0b10;
        assert_eq!(deq(GgmlType::Q5_0, &b)[1], 15.0);
    }

    #[test]
    fn q5_1_block() {
        // d = 0.25, m = 1; nibble 4 everywhere (low and high); qh bit 17 -> q = 20 at j = 17
        let mut b = [h(0.25), h(1.0)].concat();
        b.extend((1u32 << 17).to_le_bytes());
        b.extend([0x44u8; 16]);
        let out = deq(GgmlType::Q5_1, &b);
        assert_eq!(out[0], 2.0); // 0.25 * 4 + 1
        assert_eq!(out[17], 6.0); // 0.25 * 20 + 1
    }

    /// 12 scale bytes giving sub-block s the scale `s + 1` and the min `2 * s`.
    fn k_scales() -> [u8; 12] {
        let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8u8).map(|s| (s + 1, 2 * s)).unzip();
        let mut b = [0u8; 12];
        for s in 0..4 {
            b[s] = sc[s] | ((sc[s + 4] >> 4) << 6);
            b[s + 4] = mn[s] | ((mn[s + 4] >> 4) << 6);
            b[s + 8] = (sc[s + 4] & 0x0F) | ((mn[s + 4] & 0x0F) << 4);
        }
        b
    }

    #[test]
    fn scale_min_unpacking() {
        let b = k_scales();
        for s in 0..8 {
            assert_eq!(scale_min_k4(&b, s), (s as u8 + 1, 2 * s as u8));
        }
        // 6-bit values use the top bits of bytes 0..8.
        let big = [0xff, 0, 0, 0, 0xff, 0, 0, 0, 0xff, 0, 0, 0];
        assert_eq!(scale_min_k4(&big, 4), (63, 63));
        assert_eq!(scale_min_k4(&big, 0), (63, 63));
    }

    #[test]
    fn q4_k_block() {
        // d = 1, dmin = 0.5; every byte 0x21: low nibble 1, high nibble 2.
        // Sub-block s uses the low nibble when s is even: value = (s+1) * q - 0.5 * 2s.
        let mut b = [h(1.0), h(0.5)].concat();
        b.extend(k_scales());
        b.extend([0x21u8; 128]);
        let out = deq(GgmlType::Q4_K, &b);
        for s in 0..8 {
            let q = if s % 2 == 0 { 1.0 } else { 2.0 };
            let want = (s as f32 + 1.0) * q - 0.5 * (2 * s) as f32;
            assert!(
                out[32 * s..32 * s + 32].iter().all(|&v| v == want),
                "sub-block {s}"
            );
        }
    }

    #[test]
    fn q5_k_block() {
        // As q4_k_block, plus qh byte i = 0b0000_0100 sets the fifth bit in sub-block 2 only.
        let mut b = [h(1.0), h(0.5)].concat();
        b.extend(k_scales());
        b.extend([0b100u8; 32]);
        b.extend([0x21u8; 128]);
        let out = deq(GgmlType::Q5_K, &b);
        assert_eq!(out[0], 1.0); // s = 0: 1 * 1 - 0
        assert_eq!(out[64], 3.0 * 17.0 - 2.0); // s = 2: 3 * (1 | 16) - 0.5 * 4
        assert_eq!(out[96], 4.0 * 2.0 - 3.0); // s = 3: 4 * 2 - 0.5 * 6
    }

    #[test]
    fn q6_k_block() {
        // ql all 0x10 (low nibble 0 for values r < 64, 1 for 64 <= r < 128), qh all 0b1110_0100
        // (pairs 0, 1, 2, 3 for r / 32 = 0, 1, 2, 3), scales[i] = i - 8, d = 0.5.
        let mut b = vec![0x10u8; 128];
        b.extend([0b1110_0100u8; 64]);
        b.extend((0..16).map(|i| (i as i8 - 8) as u8));
        b.extend(h(0.5));
        let out = deq(GgmlType::Q6_K, &b);
        for (e, &got) in out.iter().enumerate() {
            let r = e % 128;
            let low = if r < 64 { 0 } else { 1 };
            let high = (r / 32) as i32;
            let q = (low | (high << 4)) - 32;
            let want = 0.5 * (e / 16) as f32 - 4.0;
            assert_eq!(got, want * q as f32, "value {e}");
        }
        assert_eq!(out[0], 0.5 * -8.0 * -32.0);
    }

    #[test]
    fn unsupported_types_are_none() {
        for ty in [
            GgmlType::Q8_1,
            GgmlType::Q2_K,
            GgmlType::IQ4_XS,
            GgmlType::I32,
        ] {
            assert!(!SUPPORTED.contains(&ty));
            assert_eq!(dequantize(ty, &vec![0; ty.type_size()]), None);
        }
    }
}
