//! Decoded unwind rules: what one [`RawRow`] means, as a Rust value.
//!
//! [`Rule`] is the builder's output before encoding and what
//! [`crate::unwind::UnwindTable::lookup`] answers. Only representable rules
//! can be built (offsets are range-checked by [`CfaOffset::new`]), so encoding
//! never fails; decoding a raw row checks every field.

use std::fmt;

use crate::sampling::skel::defines;
use crate::sampling::unwind_row::{
    CfaType, FpType, RawRow, CFA_OFFSET_HIGH_SHIFT, CFA_OFFSET_SCALED, CFA_TYPE_MASK,
    FP_CFA_FROM_RBX, FP_TYPE_MASK, MAX_RBX_SLOT, RBX_RULE_SHIFT, RBX_UNKNOWN,
};

/// Largest CFA offset a row can hold, bytes: 2^20 - 1 units of 8 bytes (16
/// bits in `cfa_offset`, `CFA_OFFSET_HIGH_MASK`'s 4 in `cfa_type`).
pub const MAX_CFA_OFFSET: u32 = ((((defines::CFA_OFFSET_HIGH_MASK + 1) << 16) - 1) * 8) as u32;

/// Why a CFI rule could not be turned into a row the BPF program evaluates.
///
/// The number ([`UnsupportedKind::code`]) is stored in `fp_offset` of a
/// [`CfaType::Unsupported`] row and indexes the BPF side's per-kind counters
/// (`STAT_UNSUPPORTED_BASE + kind`); it is part of the table format
/// (`docs/unwind-tables.md`): never renumber, only append (below 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum UnsupportedKind {
    /// `DW_CFA_def_cfa_expression` other than the two PLT expressions.
    CfaExpression = 1,
    /// CFA computed from a register other than rsp, rbp or rbx; counted
    /// by the walker also when an rbx-based CFA meets an rbx it cannot
    /// recover (a frame-pointer step or an unfollowed rbx rule below it).
    CfaRegister = defines::UNSUPPORTED_KIND_CFA_REGISTER as u16,
    /// CFA offset negative, above [`MAX_CFA_OFFSET`], or above 65535 and not a
    /// multiple of 8.
    CfaOffset = 3,
    /// Return-address (DWARF register 16) rule other than "saved at CFA-8" or
    /// "undefined".
    ReturnAddress = defines::UNSUPPORTED_KIND_RETURN_ADDRESS as u16,
    /// rbp rule other than unchanged or "saved at CFA + 8*k" (k fits i16).
    /// Counted only: the row stays usable with [`FpType::Unsupported`], so this
    /// kind never appears in an unsupported row.
    RbpRule = 5,
    /// gimli could not evaluate the FDE's CFI program; its whole range becomes
    /// one unsupported row.
    InvalidCfi = 6,
    /// FDE whose range overflows or lies above 2^48 (page numbers are u32);
    /// the FDE is left out of the table (counted, not in any row).
    AddressRange = 7,
}

impl UnsupportedKind {
    /// Every kind, in numbering order.
    pub const ALL: [UnsupportedKind; 7] = [
        UnsupportedKind::CfaExpression,
        UnsupportedKind::CfaRegister,
        UnsupportedKind::CfaOffset,
        UnsupportedKind::ReturnAddress,
        UnsupportedKind::RbpRule,
        UnsupportedKind::InvalidCfi,
        UnsupportedKind::AddressRange,
    ];

    /// The kind's number (1..=7) as stored in rows and cache files.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// Inverse of [`UnsupportedKind::code`].
    pub fn from_code(code: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// Short name used in `show-unwind` output and logs.
    pub fn name(self) -> &'static str {
        match self {
            UnsupportedKind::CfaExpression => "cfa-expression",
            UnsupportedKind::CfaRegister => "cfa-register",
            UnsupportedKind::CfaOffset => "cfa-offset",
            UnsupportedKind::ReturnAddress => "return-address-rule",
            UnsupportedKind::RbpRule => "rbp-rule",
            UnsupportedKind::InvalidCfi => "invalid-cfi",
            UnsupportedKind::AddressRange => "address-range",
        }
    }
}

impl fmt::Display for UnsupportedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of unsupported-kind number `code` (as rows and the BPF
/// program's counters carry it), `"unknown"` for numbers not assigned.
pub fn unsupported_kind_name(code: u16) -> &'static str {
    UnsupportedKind::from_code(code).map_or("unknown", UnsupportedKind::name)
}

/// A CFA offset, in bytes, that a row can represent: any value up to 65535,
/// or a multiple of 8 up to [`MAX_CFA_OFFSET`] (stored scaled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CfaOffset(u32);

impl CfaOffset {
    /// `bytes` if a row can hold it, else `None`.
    pub fn new(bytes: i64) -> Option<Self> {
        let b = u32::try_from(bytes).ok()?;
        (b <= u32::from(u16::MAX) || (b % 8 == 0 && b <= MAX_CFA_OFFSET)).then_some(CfaOffset(b))
    }

    /// The offset in bytes.
    pub fn bytes(self) -> u32 {
        self.0
    }

    /// (`cfa_offset` field, bits to OR into `cfa_type`: the scaled flag
    /// and the scaled offset's bits 16-19).
    fn encode(self) -> (u16, u8) {
        match u16::try_from(self.0) {
            Ok(v) => (v, 0),
            // Checked by `new`: a multiple of 8 whose quotient fits in 20 bits.
            Err(_) => {
                let scaled = self.0 / 8;
                let high = ((scaled >> 16) as u8) << CFA_OFFSET_HIGH_SHIFT;
                (scaled as u16, CFA_OFFSET_SCALED | high)
            }
        }
    }
}

/// How the caller's rbp is recovered (for rules that compute a CFA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp {
    /// rbp keeps its value (DWARF: not set, undefined or same value).
    Unchanged,
    /// rbp = *(CFA + 8 * slots).
    AtCfaOffset(i16),
    /// Any other rbp rule: the walk continues, but a later rbp-based CFA is
    /// unknown.
    Unsupported,
}

/// How the caller's rbx is recovered (for rules that compute a CFA). The
/// walker carries rbx only for an rbx-based CFA further up
/// ([`Rule::RbxOffset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bx {
    /// rbx keeps its value (DWARF: not set, undefined or same value).
    Unchanged,
    /// rbx = *(CFA - 8 * slots), slots in 1..=[`MAX_RBX_SLOT`].
    BelowCfa(u8),
    /// Any other rule: an rbx-based CFA further up cannot be computed.
    Unknown,
}

impl Bx {
    /// The rule for "rbx saved at CFA + `offset` bytes": [`Bx::BelowCfa`]
    /// when a row can hold it, else [`Bx::Unknown`].
    pub fn saved_at(offset: i64) -> Bx {
        let slots = offset.checked_neg().filter(|n| n % 8 == 0).map(|n| n / 8);
        match slots.and_then(|n| u8::try_from(n).ok()) {
            Some(n @ 1..=MAX_RBX_SLOT) => Bx::BelowCfa(n),
            _ => Bx::Unknown,
        }
    }

    /// The rule's bits in the raw `fp_type` byte.
    fn encode(self) -> u8 {
        let code = match self {
            Bx::Unchanged => 0,
            Bx::BelowCfa(slots) => slots,
            Bx::Unknown => RBX_UNKNOWN,
        };
        code << RBX_RULE_SHIFT
    }

    /// Inverse of [`Bx::encode`] (the other bits of `fp_type` are ignored).
    fn decode(fp_type: u8) -> Bx {
        match fp_type >> RBX_RULE_SHIFT {
            0 => Bx::Unchanged,
            RBX_UNKNOWN => Bx::Unknown,
            slots => Bx::BelowCfa(slots),
        }
    }
}

/// The unwind rule in effect at a pc: one decoded row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// No FDE covers the pc.
    EndOfFunction,
    /// CFA = rsp + offset; the return address is at CFA - 8.
    RspOffset {
        /// Offset added to rsp.
        cfa: CfaOffset,
        /// Caller's rbp.
        fp: Fp,
        /// Caller's rbx.
        bx: Bx,
    },
    /// CFA = rbp + offset; the return address is at CFA - 8.
    RbpOffset {
        /// Offset added to rbp.
        cfa: CfaOffset,
        /// Caller's rbp.
        fp: Fp,
        /// Caller's rbx.
        bx: Bx,
    },
    /// CFA = rbx + offset; the return address is at CFA - 8. glibc's
    /// lazy-binding trampolines (`_dl_runtime_resolve_xsave*`) keep the
    /// caller's rsp in rbx while rsp is realigned for `xsave`.
    RbxOffset {
        /// Offset added to rbx.
        cfa: CfaOffset,
        /// Caller's rbp.
        fp: Fp,
        /// Caller's rbx.
        bx: Bx,
    },
    /// PLT stub: CFA = rsp + 8 + ((rip & 15) >= threshold ? 8 : 0).
    Plt {
        /// 11 for `.plt` entries, 10 for the binutils variant with lit10.
        threshold: u8,
        /// Caller's rbp.
        fp: Fp,
        /// Caller's rbx.
        bx: Bx,
    },
    /// Signal trampoline: the interrupted registers are in the ucontext at rsp.
    SignalFrame,
    /// The return address is undefined: the outermost frame.
    Outermost,
    /// CFA = rsp + offset, rbp unchanged, and the return address is in a
    /// register rather than on the stack: hand-written code that pops it
    /// around a system call, such as glibc's `vfork` (in rdi), whose child
    /// and parent both resume there. Only the interrupted frame's registers
    /// are known, so a walk follows this rule in the leaf frame and stops
    /// anywhere else.
    ReturnInRegister {
        /// Offset added to rsp.
        cfa: CfaOffset,
        /// DWARF number of the register (0-15: the general-purpose ones).
        register: u8,
    },
    /// A rule the BPF program cannot evaluate.
    Unsupported(UnsupportedKind),
}

/// Largest DWARF register number [`Rule::ReturnInRegister`] can name: the
/// 16 general-purpose registers (x86-64: rax to r15).
pub const MAX_RETURN_REGISTER: u8 = 15;

/// A raw row whose fields do not decode to a [`Rule`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid unwind row {0:?}")]
pub struct InvalidRow(pub RawRow);

impl Rule {
    /// The rule as a row starting `pc_low` bytes into its page.
    pub fn to_raw(self, pc_low: u16) -> RawRow {
        let mut raw = RawRow {
            pc_low,
            ..RawRow::default()
        };
        let set_saved = |fp: Fp, bx: Bx, raw: &mut RawRow| {
            raw.fp_type = match fp {
                Fp::Unchanged => FpType::Unchanged as u8,
                Fp::AtCfaOffset(slots) => {
                    raw.fp_offset = slots;
                    FpType::AtCfaOffset as u8
                }
                Fp::Unsupported => FpType::Unsupported as u8,
            } | bx.encode();
        };
        match self {
            Rule::EndOfFunction => raw.cfa_type = CfaType::EndOfFunction as u8,
            Rule::RspOffset { cfa, fp, bx }
            | Rule::RbpOffset { cfa, fp, bx }
            | Rule::RbxOffset { cfa, fp, bx } => {
                let kind = if matches!(self, Rule::RspOffset { .. }) {
                    CfaType::RspOffset
                } else {
                    CfaType::RbpOffset
                };
                let (offset, flags) = cfa.encode();
                raw.cfa_type = kind as u8 | flags;
                raw.cfa_offset = offset;
                set_saved(fp, bx, &mut raw);
                if matches!(self, Rule::RbxOffset { .. }) {
                    raw.fp_type |= FP_CFA_FROM_RBX;
                }
            }
            Rule::Plt { threshold, fp, bx } => {
                raw.cfa_type = CfaType::Plt as u8;
                raw.cfa_offset = u16::from(threshold);
                set_saved(fp, bx, &mut raw);
            }
            Rule::ReturnInRegister { cfa, register } => {
                let (offset, flags) = cfa.encode();
                raw.cfa_type = CfaType::ReturnInRegister as u8 | flags;
                raw.cfa_offset = offset;
                raw.fp_type = FpType::Unchanged as u8;
                raw.fp_offset = i16::from(register);
            }
            Rule::SignalFrame => raw.cfa_type = CfaType::SignalFrame as u8,
            Rule::Outermost => raw.cfa_type = CfaType::Outermost as u8,
            Rule::Unsupported(kind) => {
                raw.cfa_type = CfaType::Unsupported as u8;
                raw.fp_offset = kind.code() as i16;
            }
        }
        raw
    }

    /// Decodes a row's rule (its `pc_low` is ignored). Fields a rule does not
    /// use must be zero.
    pub fn from_raw(raw: RawRow) -> Result<Rule, InvalidRow> {
        let bad = || InvalidRow(raw);
        let scaled = raw.cfa_type & CFA_OFFSET_SCALED != 0;
        let fp = || match raw.fp_type & FP_TYPE_MASK {
            t if t == FpType::Unchanged as u8 && raw.fp_offset == 0 => Ok(Fp::Unchanged),
            t if t == FpType::AtCfaOffset as u8 => Ok(Fp::AtCfaOffset(raw.fp_offset)),
            t if t == FpType::Unsupported as u8 && raw.fp_offset == 0 => Ok(Fp::Unsupported),
            _ => Err(bad()),
        };
        let bx = Bx::decode(raw.fp_type);
        let from_rbx = raw.fp_type & FP_CFA_FROM_RBX != 0;
        let no_fields = raw.fp_type == 0 && raw.cfa_offset == 0 && raw.fp_offset == 0;
        let high = u32::from((raw.cfa_type & !CFA_OFFSET_SCALED) >> CFA_OFFSET_HIGH_SHIFT);
        if high != 0 && !scaled {
            return Err(bad());
        }
        let cfa = |raw_offset: u16| {
            let bytes = if scaled {
                ((high << 16) | u32::from(raw_offset)) * 8
            } else {
                u32::from(raw_offset)
            };
            CfaOffset::new(i64::from(bytes)).ok_or_else(bad)
        };
        let kind = raw.cfa_type & CFA_TYPE_MASK;
        if from_rbx && kind != CfaType::RbpOffset as u8 {
            return Err(bad());
        }
        let rule = match kind {
            k if k == CfaType::RspOffset as u8 => Rule::RspOffset {
                cfa: cfa(raw.cfa_offset)?,
                fp: fp()?,
                bx,
            },
            k if k == CfaType::RbpOffset as u8 && from_rbx => Rule::RbxOffset {
                cfa: cfa(raw.cfa_offset)?,
                fp: fp()?,
                bx,
            },
            k if k == CfaType::RbpOffset as u8 => Rule::RbpOffset {
                cfa: cfa(raw.cfa_offset)?,
                fp: fp()?,
                bx,
            },
            k if k == CfaType::ReturnInRegister as u8 && raw.fp_type == FpType::Unchanged as u8 => {
                Rule::ReturnInRegister {
                    cfa: cfa(raw.cfa_offset)?,
                    register: u8::try_from(raw.fp_offset)
                        .ok()
                        .filter(|&r| r <= MAX_RETURN_REGISTER)
                        .ok_or_else(bad)?,
                }
            }
            _ if scaled => return Err(bad()),
            k if k == CfaType::Plt as u8 => Rule::Plt {
                threshold: u8::try_from(raw.cfa_offset)
                    .ok()
                    .filter(|t| *t <= 16)
                    .ok_or_else(bad)?,
                fp: fp()?,
                bx,
            },
            k if k == CfaType::EndOfFunction as u8 && no_fields => Rule::EndOfFunction,
            k if k == CfaType::SignalFrame as u8 && no_fields => Rule::SignalFrame,
            k if k == CfaType::Outermost as u8 && no_fields => Rule::Outermost,
            k if k == CfaType::Unsupported as u8 && raw.fp_type == 0 && raw.cfa_offset == 0 => {
                let code = u16::try_from(raw.fp_offset).map_err(|_| bad())?;
                Rule::Unsupported(UnsupportedKind::from_code(code).ok_or_else(bad)?)
            }
            _ => return Err(bad()),
        };
        Ok(rule)
    }

    /// The rbp rule, for rules that compute a CFA from a register.
    pub fn fp(self) -> Option<Fp> {
        match self {
            Rule::RspOffset { fp, .. }
            | Rule::RbpOffset { fp, .. }
            | Rule::RbxOffset { fp, .. }
            | Rule::Plt { fp, .. } => Some(fp),
            Rule::ReturnInRegister { .. } => Some(Fp::Unchanged),
            _ => None,
        }
    }

    /// The rbx rule, for rules that compute a CFA from a register.
    pub fn bx(self) -> Option<Bx> {
        match self {
            Rule::RspOffset { bx, .. }
            | Rule::RbpOffset { bx, .. }
            | Rule::RbxOffset { bx, .. }
            | Rule::Plt { bx, .. } => Some(bx),
            Rule::ReturnInRegister { .. } => Some(Bx::Unchanged),
            _ => None,
        }
    }
}

/// The CFA part of a rule as `show-unwind` prints it: `rsp+8`, `rbp+16`, `rbx+56`,
/// `plt(11)`, `rsp+8 ra=r5` (return address in DWARF register 5),
/// `signal-frame`, `end-of-function`, `outermost`, `unsupported(kind)`.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::EndOfFunction => f.write_str("end-of-function"),
            Rule::RspOffset { cfa, .. } => write!(f, "rsp+{}", cfa.bytes()),
            Rule::RbpOffset { cfa, .. } => write!(f, "rbp+{}", cfa.bytes()),
            Rule::RbxOffset { cfa, .. } => write!(f, "rbx+{}", cfa.bytes()),
            Rule::Plt { threshold, .. } => write!(f, "plt({threshold})"),
            Rule::ReturnInRegister { cfa, register } => {
                write!(f, "rsp+{} ra=r{register}", cfa.bytes())
            }
            Rule::SignalFrame => f.write_str("signal-frame"),
            Rule::Outermost => f.write_str("outermost"),
            Rule::Unsupported(kind) => write!(f, "unsupported({kind})"),
        }
    }
}

/// `rbp=unchanged`, `rbp=*(cfa-16)`, `rbp=unsupported`.
impl fmt::Display for Fp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fp::Unchanged => f.write_str("rbp=unchanged"),
            Fp::AtCfaOffset(slots) => {
                let bytes = i32::from(*slots) * 8;
                if bytes < 0 {
                    write!(f, "rbp=*(cfa-{})", -bytes)
                } else {
                    write!(f, "rbp=*(cfa+{bytes})")
                }
            }
            Fp::Unsupported => f.write_str("rbp=unsupported"),
        }
    }
}

/// `rbx=unchanged`, `rbx=*(cfa-56)`, `rbx=unknown`.
impl fmt::Display for Bx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bx::Unchanged => f.write_str("rbx=unchanged"),
            Bx::BelowCfa(slots) => write!(f, "rbx=*(cfa-{})", u32::from(*slots) * 8),
            Bx::Unknown => f.write_str("rbx=unknown"),
        }
    }
}

#[cfg(test)]
#[path = "rule_tests.rs"]
mod tests;
