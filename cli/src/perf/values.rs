//! Element encodings and the values the checks use (see the `perf` module docs for the ranges).

use symcomm::{DataType, RedOp};

use super::desc::Source;

/// Largest absolute value the inputs use (a bound on the ranges below).
const VALUE_CAP: i64 = 100;

/// How a type stores numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fmt {
    /// IEEE-style binary floating point (f64, f32, f16, bf16, OCP fp8), no NaN/inf produced.
    Float { ebits: u32, mbits: u32 },
    /// Two's complement or unsigned integer.
    Int { signed: bool, bits: u32 },
}

impl Fmt {
    pub(super) fn of(dt: DataType) -> Option<Fmt> {
        let float = |ebits, mbits| Some(Fmt::Float { ebits, mbits });
        let int = |signed, bits| Some(Fmt::Int { signed, bits });
        match dt {
            DataType::F64 => float(11, 52),
            DataType::F32 => float(8, 23),
            DataType::F16 => float(5, 10),
            DataType::Bf16 => float(8, 7),
            DataType::Fp8E4m3 => float(4, 3),
            DataType::Fp8E5m2 => float(5, 2),
            DataType::I8 => int(true, 8),
            DataType::U8 => int(false, 8),
            DataType::I32 => int(true, 32),
            DataType::U32 => int(false, 32),
            DataType::I64 => int(true, 64),
            DataType::U64 => int(false, 64),
            _ => None,
        }
    }

    fn signed(self) -> bool {
        match self {
            Fmt::Float { .. } => true,
            Fmt::Int { signed, .. } => signed,
        }
    }

    /// Largest m such that every integer in 0..=m is exact.
    fn exact_max(self) -> i64 {
        match self {
            Fmt::Float { mbits, .. } => 1i64 << (mbits + 1).min(62),
            Fmt::Int { signed, bits } => {
                let b = if signed { bits - 1 } else { bits };
                if b >= 63 { i64::MAX } else { (1i64 << b) - 1 }
            }
        }
    }

    fn bias(ebits: u32) -> i32 {
        (1 << (ebits - 1)) - 1
    }

    /// The bits of integer `v` (exact for the values of [`Data::input`]; integers wrap).
    fn encode(self, v: i64) -> u64 {
        match self {
            Fmt::Int { bits, .. } => {
                if bits >= 64 {
                    v as u64
                } else {
                    (v as u64) & ((1u64 << bits) - 1)
                }
            }
            Fmt::Float { ebits, mbits } => {
                if v == 0 {
                    return 0;
                }
                let sign = u64::from(v < 0) << (ebits + mbits);
                let a = v.unsigned_abs();
                let e = 63 - a.leading_zeros();
                let man = if e >= mbits {
                    a >> (e - mbits)
                } else {
                    a << (mbits - e)
                } & ((1u64 << mbits) - 1);
                let field = (e as i32 + Self::bias(ebits)) as u64;
                sign | (field << mbits) | man
            }
        }
    }

    /// The value of float bits (finite encodings).
    fn decode(self, b: u64) -> f64 {
        match self {
            Fmt::Int { .. } => b as f64,
            Fmt::Float { ebits, mbits } => {
                let neg = (b >> (ebits + mbits)) & 1 == 1;
                let field = ((b >> mbits) & ((1u64 << ebits) - 1)) as i32;
                let man = (b & ((1u64 << mbits) - 1)) as f64 / 2f64.powi(mbits as i32);
                let bias = Self::bias(ebits);
                let mag = if field == 0 {
                    man * 2f64.powi(1 - bias)
                } else {
                    (1.0 + man) * 2f64.powi(field - bias)
                };
                if neg { -mag } else { mag }
            }
        }
    }

    /// One unit in the last place at `x` (floats).
    fn ulp(self, x: f64) -> f64 {
        match self {
            Fmt::Int { .. } => 0.0,
            Fmt::Float { ebits, mbits } => {
                let min_exp = 1 - Self::bias(ebits);
                let e = if x == 0.0 {
                    min_exp
                } else {
                    (x.abs().log2().floor() as i32).max(min_exp)
                };
                2f64.powi(e - mbits as i32)
            }
        }
    }
}

/// What a checked element must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Expect {
    Bits(u64),
    /// Float avg: within 2 ulp of this value.
    Near(f64),
    Any,
}

/// The inputs of one check: type, op, rank count, seed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Data {
    pub(super) fmt: Fmt,
    pub(super) dsize: usize,
    pub(super) op: Option<RedOp>,
    pub(super) nranks: u32,
    pub(super) seed: u64,
}

pub(super) fn mix(mut z: u64) -> u64 {
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Data {
    /// Rank `rank`'s input element `j` (an integer; see the module docs for the ranges).
    fn input(&self, rank: u32, j: u64) -> i64 {
        let h = mix(self.seed ^ mix(u64::from(rank).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ j));
        let n = i64::from(self.nranks);
        let m = self.fmt.exact_max();
        let pick = |lo: i64, hi: i64| lo + (h % (hi - lo + 1) as u64) as i64;
        match self.op {
            None => match self.fmt {
                Fmt::Int { .. } => h as i64,
                Fmt::Float { .. } => {
                    let r = (m / 2).min(1000);
                    pick(-r, r)
                }
            },
            Some(RedOp::Prod) => {
                let twos = (j + u64::from(rank)) % u64::from(self.nranks)
                    == self.seed % 7 % u64::from(self.nranks);
                if twos && h & 1 == 1 {
                    2
                } else if self.fmt.signed() && h % 4 == 0 {
                    -1
                } else {
                    1
                }
            }
            Some(RedOp::Min | RedOp::Max) => {
                if self.fmt.signed() {
                    pick(-8, 8)
                } else {
                    pick(0, 16)
                }
            }
            // Sum, avg: the total stays exact.
            Some(_) => {
                let k = (m / n).min(VALUE_CAP);
                if k == 0 {
                    i64::from((j + u64::from(rank)) % u64::from(self.nranks) == 0)
                } else {
                    pick(0, k)
                }
            }
        }
    }

    /// What an output element must hold; `before` is the element's bits before the call (what
    /// [`Source::Untouched`] elements must still hold).
    pub(super) fn expect(&self, src: Source, before: u64) -> Expect {
        match src {
            Source::Untouched => Expect::Bits(before),
            Source::Copy { rank, index } => Expect::Bits(self.fmt.encode(self.input(rank, index))),
            Source::Reduce { index } => {
                let vals = (0..self.nranks).map(|r| self.input(r, index));
                let enc = |v: i64| Expect::Bits(self.fmt.encode(v));
                match self.op {
                    Some(RedOp::Sum) => enc(vals.sum()),
                    Some(RedOp::Prod) => enc(vals.product()),
                    Some(RedOp::Min) => enc(vals.min().unwrap_or(0)),
                    Some(RedOp::Max) => enc(vals.max().unwrap_or(0)),
                    Some(RedOp::Avg) => {
                        let sum: i64 = vals.sum();
                        match self.fmt {
                            Fmt::Int { .. } => enc(sum / i64::from(self.nranks)),
                            Fmt::Float { .. } => Expect::Near(sum as f64 / f64::from(self.nranks)),
                        }
                    }
                    _ => Expect::Any,
                }
            }
        }
    }

    pub(super) fn matches(&self, got: u64, want: Expect) -> bool {
        match want {
            Expect::Any => true,
            Expect::Bits(b) => got == b,
            Expect::Near(x) => (self.fmt.decode(got) - x).abs() <= 2.0 * self.fmt.ulp(x),
        }
    }

    /// `count` elements from input index `first` of `rank`, as bytes.
    pub(super) fn input_bytes(&self, rank: u32, first: u64, count: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(count as usize * self.dsize);
        for j in first..first + count {
            let bits = self.fmt.encode(self.input(rank, j));
            out.extend_from_slice(&bits.to_le_bytes()[..self.dsize]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn encodings_round_trip() {
        for dt in DataType::ALL {
            let fmt = Fmt::of(dt).unwrap();
            if let Fmt::Float { .. } = fmt {
                let m = fmt.exact_max().min(4096);
                for v in -m..=m {
                    assert_eq!(fmt.decode(fmt.encode(v)), v as f64, "{} {v}", dt.name());
                }
            }
        }
        let f32f = Fmt::of(DataType::F32).unwrap();
        assert_eq!(f32f.encode(3), u64::from(3.0f32.to_bits()));
        assert_eq!(f32f.encode(-7), u64::from((-7.0f32).to_bits()));
        let bf = Fmt::of(DataType::Bf16).unwrap();
        assert_eq!(bf.encode(5), u64::from(5.0f32.to_bits() >> 16));
    }

    /// An untouched element (reduce's output off the root) must still hold what it held: a
    /// write into it counts as wrong.
    #[test]
    fn untouched_outputs_must_keep_their_bytes() {
        let data = Data {
            fmt: Fmt::of(DataType::F32).unwrap(),
            dsize: 4,
            op: Some(RedOp::Sum),
            nranks: 3,
            seed: 7,
        };
        let want = data.expect(Source::Untouched, 0xA5A5_A5A5);
        assert!(data.matches(0xA5A5_A5A5, want));
        assert!(!data.matches(0x4040_0000, want));
    }
}
