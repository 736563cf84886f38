//! The value model of the collective tests: element types with exact encode/decode of the
//! values the tests use, inputs whose reductions over up to 8 ranks are exact in every type
//! (nccl-tests style), the reference reduction, and the seeded generator that selects cases
//! (`SYMCOMM_TEST_SEED` replays a run).
//!
//! Used by `emu_collectives.rs` (device collectives through the built-in kernels), `coll.rs`
//! (host collectives on a `Communicator`) and the GPU checks (`gpu/cases.rs`: the same kernels on
//! a GPU, and on the emulator with `--emu`).

use symcomm::abi::*;
use symcomm::{DataType, RedOp};

// ---------------------------------------------------------------------------------------------
// Element types: codes, sizes, and exact encode/decode of the values the tests use.

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fmt {
    /// IEEE-like binary format with exponent bits, mantissa bits, bias (f16, bf16, fp8).
    Mini {
        ebits: u32,
        mbits: u32,
        bias: i32,
    },
    F32,
    F64,
    Int {
        signed: bool,
        bits: u32,
    },
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct DType {
    /// `SYMCOMM_DTYPE_*`.
    pub(crate) code: u32,
    /// Rust-style name (`f32`, `bf16`, `fp8_e4m3`, ...).
    pub(crate) name: &'static str,
    /// Bytes per element.
    pub(crate) size: usize,
    pub(crate) fmt: Fmt,
}

pub(crate) const DTYPES: [DType; 12] = [
    DType {
        code: SYMCOMM_DTYPE_F32,
        name: "f32",
        size: 4,
        fmt: Fmt::F32,
    },
    DType {
        code: SYMCOMM_DTYPE_F64,
        name: "f64",
        size: 8,
        fmt: Fmt::F64,
    },
    DType {
        code: SYMCOMM_DTYPE_F16,
        name: "f16",
        size: 2,
        fmt: Fmt::Mini {
            ebits: 5,
            mbits: 10,
            bias: 15,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_BF16,
        name: "bf16",
        size: 2,
        fmt: Fmt::Mini {
            ebits: 8,
            mbits: 7,
            bias: 127,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_FP8_E4M3,
        name: "fp8_e4m3",
        size: 1,
        fmt: Fmt::Mini {
            ebits: 4,
            mbits: 3,
            bias: 7,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_FP8_E5M2,
        name: "fp8_e5m2",
        size: 1,
        fmt: Fmt::Mini {
            ebits: 5,
            mbits: 2,
            bias: 15,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_I8,
        name: "i8",
        size: 1,
        fmt: Fmt::Int {
            signed: true,
            bits: 8,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_U8,
        name: "u8",
        size: 1,
        fmt: Fmt::Int {
            signed: false,
            bits: 8,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_I32,
        name: "i32",
        size: 4,
        fmt: Fmt::Int {
            signed: true,
            bits: 32,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_U32,
        name: "u32",
        size: 4,
        fmt: Fmt::Int {
            signed: false,
            bits: 32,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_I64,
        name: "i64",
        size: 8,
        fmt: Fmt::Int {
            signed: true,
            bits: 64,
        },
    },
    DType {
        code: SYMCOMM_DTYPE_U64,
        name: "u64",
        size: 8,
        fmt: Fmt::Int {
            signed: false,
            bits: 64,
        },
    },
];

/// The element type named `name` (`f32`, `bf16`, ...) of [`DTYPES`].
pub(crate) fn dtype(name: &str) -> DType {
    *DTYPES
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no element type {name}"))
}

/// A value of the test: exact float, or integer (wrapped to the type's width when encoded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Val {
    F(f64),
    I(i128),
}

impl DType {
    /// Bits of an exactly representable value.
    pub(crate) fn encode(&self, v: Val) -> u64 {
        match (self.fmt, v) {
            (Fmt::F32, Val::F(x)) => u64::from((x as f32).to_bits()),
            (Fmt::F64, Val::F(x)) => x.to_bits(),
            (Fmt::Mini { ebits, mbits, bias }, Val::F(x)) => {
                let sign = if x.is_sign_negative() {
                    1u64 << (ebits + mbits)
                } else {
                    0
                };
                let a = x.abs();
                if a == 0.0 {
                    return sign;
                }
                let e = a.log2().floor() as i32;
                let (field, man) = if e + bias <= 0 {
                    (0i32, a / 2f64.powi(1 - bias) * 2f64.powi(mbits as i32))
                } else {
                    (e + bias, (a / 2f64.powi(e) - 1.0) * 2f64.powi(mbits as i32))
                };
                assert!(
                    man.fract() == 0.0 && field < (1 << ebits),
                    "{x} is not exact in {}",
                    self.name
                );
                sign | ((field as u64) << mbits) | man as u64
            }
            (Fmt::Int { bits, .. }, Val::I(i)) => (i as u128 & mask(bits)) as u64,
            _ => unreachable!("value kind does not match {}", self.name),
        }
    }

    /// The value of some bits (floats: as f64; ints: sign-extended).
    pub(crate) fn decode(&self, b: u64) -> Val {
        match self.fmt {
            Fmt::F32 => Val::F(f64::from(f32::from_bits(b as u32))),
            Fmt::F64 => Val::F(f64::from_bits(b)),
            Fmt::Mini { ebits, mbits, bias } => {
                let sign = if (b >> (ebits + mbits)) & 1 == 1 {
                    -1.0
                } else {
                    1.0
                };
                let field = ((b >> mbits) & ((1 << ebits) - 1)) as i32;
                let man = (b & ((1 << mbits) - 1)) as f64 / 2f64.powi(mbits as i32);
                Val::F(if field == 0 {
                    sign * man * 2f64.powi(1 - bias)
                } else {
                    sign * (1.0 + man) * 2f64.powi(field - bias)
                })
            }
            Fmt::Int { signed, bits } => {
                let u = u128::from(b) & mask(bits);
                Val::I(if signed && bits < 128 && (u >> (bits - 1)) & 1 == 1 {
                    u as i128 - (1i128 << bits)
                } else {
                    u as i128
                })
            }
        }
    }

    /// Wraps an integer to the type (floats unchanged).
    pub(crate) fn wrap(&self, v: Val) -> Val {
        self.decode(self.encode(v))
    }

    /// Relative precision of the type (floats), for avg's one rounding.
    pub(crate) fn epsilon(&self) -> f64 {
        match self.fmt {
            Fmt::F32 => 2f64.powi(-23),
            Fmt::F64 => 2f64.powi(-52),
            Fmt::Mini { mbits, .. } => 2f64.powi(-(mbits as i32)),
            Fmt::Int { .. } => 0.0,
        }
    }
}

pub(crate) fn mask(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

pub(crate) const OPS: [(u32, &str); 5] = [
    (SYMCOMM_REDOP_SUM, "sum"),
    (SYMCOMM_REDOP_PROD, "prod"),
    (SYMCOMM_REDOP_MIN, "min"),
    (SYMCOMM_REDOP_MAX, "max"),
    (SYMCOMM_REDOP_AVG, "avg"),
];

/// The hash behind [`input`]: 47 well-spread bits of (rank, i, salt), wrapping (so any index,
/// e.g. a tile number in the high bits, is valid).
pub(crate) fn hash(rank: u32, i: u64, salt: u64) -> u64 {
    u64::from(rank)
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(i.wrapping_mul(0x85eb_ca6b))
        .wrapping_add(salt)
        .wrapping_mul(0xc2b2_ae35)
        >> 17
}

/// Input element `i` of `rank`, chosen so that reductions over <= 8 ranks are exact in the type
/// (nccl-tests style): small integers for sums, {-1, 1, 2} for products, powers of two.
pub(crate) fn input(dt: &DType, op: u32, rank: u32, i: u64, salt: u64) -> Val {
    let h = hash(rank, i, salt);
    if let Fmt::Int { .. } = dt.fmt {
        // Any bits: integer sums and products wrap.
        let wide = (h as i128) * 0x1_0000_0001 + i128::from(rank);
        return dt.wrap(Val::I(if op == SYMCOMM_REDOP_PROD {
            (wide % 7) - 3
        } else {
            wide
        }));
    }
    let fp8 = dt.size == 1;
    let v = match op {
        SYMCOMM_REDOP_PROD => [1.0, 2.0, -1.0][(h % 3) as usize],
        SYMCOMM_REDOP_MIN | SYMCOMM_REDOP_MAX => (h % 17) as f64 - 8.0,
        _ if fp8 => (h % 2) as f64,
        _ => (h % 4) as f64,
    };
    Val::F(v)
}

/// Reduction of `vals` (rank order) with `op`, as the type computes it (exact for the inputs
/// above; avg is checked with a tolerance).
pub(crate) fn reduce_vals(dt: &DType, op: u32, vals: &[Val]) -> Val {
    let n = vals.len();
    match vals[0] {
        Val::F(_) => {
            let xs: Vec<f64> = vals
                .iter()
                .map(|v| {
                    if let Val::F(x) = v {
                        *x
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            Val::F(match op {
                SYMCOMM_REDOP_SUM => xs.iter().sum(),
                SYMCOMM_REDOP_PROD => xs.iter().product(),
                SYMCOMM_REDOP_MIN => xs.iter().copied().fold(f64::INFINITY, f64::min),
                SYMCOMM_REDOP_MAX => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                _ => xs.iter().sum::<f64>() / n as f64,
            })
        }
        Val::I(_) => {
            let xs: Vec<i128> = vals
                .iter()
                .map(|v| {
                    if let Val::I(x) = v {
                        *x
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            let wrap = |x: i128| match dt.wrap(Val::I(x)) {
                Val::I(w) => w,
                Val::F(_) => unreachable!(),
            };
            match op {
                SYMCOMM_REDOP_SUM => Val::I(wrap(xs.iter().fold(0i128, |a, &b| wrap(a + b)))),
                SYMCOMM_REDOP_PROD => {
                    Val::I(xs.iter().fold(1i128, |a, &b| wrap(a.wrapping_mul(b))))
                }
                SYMCOMM_REDOP_MIN => Val::I(*xs.iter().min().unwrap()),
                SYMCOMM_REDOP_MAX => Val::I(*xs.iter().max().unwrap()),
                _ => {
                    // Integer avg: the wrapped sum divided by n, truncated toward zero.
                    let s = xs.iter().fold(0i128, |a, &b| wrap(a + b));
                    Val::I(s / n as i128)
                }
            }
        }
    }
}

impl DType {
    /// The host API's type of the same code.
    pub(crate) fn data_type(&self) -> DataType {
        let t = DataType::ALL[self.code as usize];
        assert_eq!(t.code(), self.code, "DataType::ALL is in code order");
        t
    }

    /// Whether the type is a floating-point one.
    pub(crate) fn is_float(&self) -> bool {
        !matches!(self.fmt, Fmt::Int { .. })
    }
}

/// The host API's op of a `SYMCOMM_REDOP_*` code.
pub(crate) fn red_op(code: u32) -> RedOp {
    let op = RedOp::ALL[code as usize];
    assert_eq!(op.code(), code, "RedOp::ALL is in code order");
    op
}

/// Name of a `SYMCOMM_REDOP_*` code (`sum`, ...).
pub(crate) fn op_name(code: u32) -> &'static str {
    OPS.iter().find(|o| o.0 == code).map_or("-", |o| o.1)
}

/// Input element `i` of `rank` among `nranks` for `op`, exactly reducible with every op
/// including floating-point avg: as [`input`], except that floating-point avg inputs are
/// `q + d(rank)` for ranks below `nranks - 1` and `q - (the sum of those d)` on the last rank
/// (`q` in 0..4 from the index, `d` in {0, 1} from rank and index), so every rank's value is a
/// small integer (-7..=3, exact in every type, fp8 included), the sum is `nranks * q` exactly
/// (any order, in f32) and the average is exactly `q`: the result is checked bit for bit,
/// without avg's tolerance.
pub(crate) fn input_exact(dt: &DType, op: u32, rank: u32, nranks: u32, i: u64, salt: u64) -> Val {
    if op != SYMCOMM_REDOP_AVG || !dt.is_float() {
        return input(dt, op, rank, i, salt);
    }
    let d = |r: u32| (mix(u64::from(r) + 1, i, salt) >> 7) % 2;
    let q = (mix(0, i, salt) >> 9) % 4;
    let v = if rank + 1 < nranks {
        (q + d(rank)) as f64
    } else {
        q as f64 - (0..nranks - 1).map(d).sum::<u64>() as f64
    };
    Val::F(v)
}

/// Arbitrary bits (all of the type's width: NaNs, infinities, subnormals, negative zeros
/// included) for element `i` of `rank`: inputs of the collectives that only move data, which
/// must arrive bit for bit.
pub(crate) fn raw_bits(dt: &DType, rank: u32, i: u64, salt: u64) -> u64 {
    let bits = mix(u64::from(rank), i, salt);
    if dt.size >= 8 {
        bits
    } else {
        bits & ((1u64 << (8 * dt.size)) - 1)
    }
}

/// A well-mixed hash of (a, b, salt) (splitmix64's finalizer).
fn mix(a: u64, b: u64, salt: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
        .wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// Case selection.

/// A small deterministic generator (splitmix64), so a failing selection can be replayed.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// The seed of a test: `SYMCOMM_TEST_SEED` when set (decimal), else a fixed default; printed so
/// that a failing run can be replayed.
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("SYMCOMM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c011);
    println!("SYMCOMM_TEST_SEED={seed}");
    seed
}
