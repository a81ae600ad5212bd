//! The compact unwind row and page types shared with the BPF program
//! (`struct unwind_row`, `struct page_key`, `struct page_value` in
//! `src/sampling/bpf/profiler.h`; keep both in agreement). Every number
//! here is the header's own: its enums through the skeleton, its `#define`s
//! through [`crate::sampling::skel::defines`].

use crate::sampling::skel::defines;
use crate::sampling::skel::types::{cfa_type, fp_type};

/// log2 of the page size: a page is 64 KiB of an object's virtual address
/// space (`UNWIND_PAGE_BITS`).
pub const PAGE_BITS: u32 = defines::UNWIND_PAGE_BITS as u32;
/// Page size, bytes.
pub const PAGE_SIZE: u64 = 1 << PAGE_BITS;

/// How the CFA is computed (`enum cfa_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CfaType {
    /// No FDE covers this pc.
    EndOfFunction = cfa_type::CFA_END_OF_FUNCTION.0 as u8,
    /// CFA = rsp + offset.
    RspOffset = cfa_type::CFA_RSP_OFFSET.0 as u8,
    /// CFA = rbp + offset.
    RbpOffset = cfa_type::CFA_RBP_OFFSET.0 as u8,
    /// PLT stub: CFA = rsp + 8 + ((rip & 15) >= threshold ? 8 : 0).
    Plt = cfa_type::CFA_PLT.0 as u8,
    /// Signal trampoline: registers are restored from the ucontext at rsp.
    SignalFrame = cfa_type::CFA_SIGNAL_FRAME.0 as u8,
    /// The return address is undefined: outermost frame.
    Outermost = cfa_type::CFA_OUTERMOST.0 as u8,
    /// A rule the BPF program cannot evaluate.
    Unsupported = cfa_type::CFA_UNSUPPORTED.0 as u8,
    /// CFA = rsp + offset; the return address is in the register whose
    /// DWARF number is in `fp_offset`, rbp unchanged (glibc's `vfork` keeps
    /// it in rdi across the syscall). Known only for the interrupted frame.
    ReturnInRegister = cfa_type::CFA_RETURN_IN_REGISTER.0 as u8,
}

/// Bits of the raw `cfa_type` byte that hold the [`CfaType`].
pub const CFA_TYPE_MASK: u8 = defines::CFA_TYPE_MASK as u8;
/// Flag in the raw `cfa_type` byte: the CFA offset is in units of 8 bytes,
/// and bits 3-6 hold bits 16-19 of that scaled offset.
pub const CFA_OFFSET_SCALED: u8 = defines::CFA_OFFSET_SCALED as u8;
/// Shift of the high scaled-offset bits in the raw `cfa_type` byte.
pub const CFA_OFFSET_HIGH_SHIFT: u8 = defines::CFA_OFFSET_HIGH_SHIFT as u8;

/// How the caller's rbp is recovered (`enum fp_type`, bits 0-1 of the raw
/// `fp_type` byte; see [`FP_TYPE_MASK`] for the other bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum FpType {
    /// rbp keeps its value.
    Unchanged = fp_type::FP_UNCHANGED.0 as u8,
    /// rbp = *(CFA + fp_offset * 8).
    AtCfaOffset = fp_type::FP_AT_CFA_OFFSET.0 as u8,
    /// Any other rule.
    Unsupported = fp_type::FP_UNSUPPORTED.0 as u8,
}

/// Bits of the raw `fp_type` byte that hold the [`FpType`].
pub const FP_TYPE_MASK: u8 = defines::FP_TYPE_MASK as u8;
/// Flag in the raw `fp_type` byte of a [`CfaType::RbpOffset`] row: the CFA
/// is rbx + offset, not rbp + offset (glibc's lazy-binding trampolines
/// realign rsp and keep the old one in rbx).
pub const FP_CFA_FROM_RBX: u8 = defines::FP_CFA_FROM_RBX as u8;
/// Shift of the rbx rule in the raw `fp_type` byte (bits 3-7): 0, rbx keeps
/// its value; 1-[`MAX_RBX_SLOT`], the caller's rbx is saved at CFA - 8 *
/// that; [`RBX_UNKNOWN`], any other rule.
pub const RBX_RULE_SHIFT: u8 = defines::RBX_RULE_SHIFT as u8;
/// Deepest save slot of rbx below the CFA a row can hold, in 8-byte units.
pub const MAX_RBX_SLOT: u8 = RBX_UNKNOWN - 1;
/// The rbx rule value for a rule the walker does not follow.
pub const RBX_UNKNOWN: u8 = defines::RBX_UNKNOWN as u8;

/// One row as the BPF program reads it (`struct unwind_row`, 8 bytes,
/// native endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct RawRow {
    /// pc - page start, bytes.
    pub pc_low: u16,
    /// [`CfaType`] | high offset bits << [`CFA_OFFSET_HIGH_SHIFT`] | [`CFA_OFFSET_SCALED`].
    pub cfa_type: u8,
    /// [`FpType`] | [`FP_CFA_FROM_RBX`] | rbx rule << [`RBX_RULE_SHIFT`].
    pub fp_type: u8,
    /// CFA offset in bytes (or units of 8 with [`CFA_OFFSET_SCALED`]); PLT threshold.
    pub cfa_offset: u16,
    /// Saved-rbp offset from the CFA in units of 8 bytes; unsupported kind for
    /// [`CfaType::Unsupported`]; DWARF register number for
    /// [`CfaType::ReturnInRegister`].
    pub fp_offset: i16,
}

impl RawRow {
    /// The row's 8 bytes as the BPF map stores them.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.pc_low.to_ne_bytes());
        b[2] = self.cfa_type;
        b[3] = self.fp_type;
        b[4..6].copy_from_slice(&self.cfa_offset.to_ne_bytes());
        b[6..8].copy_from_slice(&self.fp_offset.to_ne_bytes());
        b
    }

    /// Inverse of [`RawRow::to_bytes`].
    pub fn from_bytes(b: [u8; 8]) -> Self {
        RawRow {
            pc_low: u16::from_ne_bytes([b[0], b[1]]),
            cfa_type: b[2],
            fp_type: b[3],
            cfa_offset: u16::from_ne_bytes([b[4], b[5]]),
            fp_offset: i16::from_ne_bytes([b[6], b[7]]),
        }
    }
}

/// Where one page's rows are in an object's row array (`struct page_value`,
/// with the page number of `struct page_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Page {
    /// vaddr >> [`PAGE_BITS`].
    pub page: u32,
    /// Index of the page's first row in the table's rows.
    pub first_row: u32,
    /// Number of rows in the page (at least 1).
    pub row_count: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_is_eight_bytes_and_round_trips() {
        assert_eq!(std::mem::size_of::<RawRow>(), 8);
        let row = RawRow {
            pc_low: 0x1234,
            cfa_type: CfaType::RspOffset as u8 | CFA_OFFSET_SCALED,
            fp_type: FpType::AtCfaOffset as u8,
            cfa_offset: 12800,
            fp_offset: -2,
        };
        assert_eq!(RawRow::from_bytes(row.to_bytes()), row);
    }
}
