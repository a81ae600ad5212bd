//! x86-64 specifics of the unwind tables: the DWARF register numbers of the
//! System V ABI (AMD64 supplement, figure 3.36) and the translation of one
//! row of gimli's evaluated CFI into a [`Rule`] the BPF walker evaluates
//! (its x86-64 counterpart is `src/sampling/bpf/arch_x86_64.h`). Another architecture
//! is another file beside this one, chosen by the object's ELF machine.

use gimli::{CfaRule, Reader, Register, RegisterRule, UnwindSection, UnwindTableRow};
use object::elf;

use super::rule::{Bx, CfaOffset, Fp, Rule, UnsupportedKind, MAX_RETURN_REGISTER};

/// The ELF `e_machine` of the objects this file's rules describe.
pub(super) const ELF_MACHINE: elf::Machine = elf::EM_X86_64;

/// rbx, where glibc's lazy-binding trampolines keep the caller's rsp.
const RBX: Register = Register(3);
/// rbp, the frame pointer.
const RBP: Register = Register(6);
/// rsp, the stack pointer.
const RSP: Register = Register(7);
/// The return address column (rip).
const RA: Register = Register(16);

/// Translates one gimli row into a rule, with the unsupported kind to count
/// (for [`UnsupportedKind::RbpRule`] the rule stays usable).
pub(super) fn translate<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    row: &UnwindTableRow<usize>,
    section: &S,
) -> (Rule, Option<UnsupportedKind>) {
    let unsupported = |kind| (Rule::Unsupported(kind), Some(kind));
    let ra = row.register(RA);
    if ra == Some(RegisterRule::Undefined) {
        return (Rule::Outermost, None);
    }
    let cfa = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset }
            if register == RSP || register == RBP || register == RBX =>
        {
            match CfaOffset::new(offset) {
                Some(cfa) => Ok((register, cfa)),
                None => return unsupported(UnsupportedKind::CfaOffset),
            }
        }
        CfaRule::RegisterAndOffset { .. } => return unsupported(UnsupportedKind::CfaRegister),
        CfaRule::Expression(expression) => match expression.get(section) {
            Ok(e) => match e.0.to_slice().ok().and_then(|bytes| plt_threshold(&bytes)) {
                Some(threshold) => Err(threshold),
                None => return unsupported(UnsupportedKind::CfaExpression),
            },
            Err(_) => return unsupported(UnsupportedKind::InvalidCfi),
        },
    };
    let fp_rule = row.register(RBP);
    if let Some(RegisterRule::Register(register)) = ra {
        return match (cfa, fp_rule) {
            (Ok((RSP, cfa)), None | Some(RegisterRule::Undefined | RegisterRule::SameValue))
                if register.0 <= u16::from(MAX_RETURN_REGISTER) && register != RSP =>
            {
                (
                    Rule::ReturnInRegister {
                        cfa,
                        register: register.0 as u8,
                    },
                    None,
                )
            }
            _ => unsupported(UnsupportedKind::ReturnAddress),
        };
    }
    if ra != Some(RegisterRule::Offset(-8)) {
        return unsupported(UnsupportedKind::ReturnAddress);
    }
    let fp = match fp_rule {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Some(Fp::Unchanged),
        Some(RegisterRule::Offset(n)) if n % 8 == 0 => {
            i16::try_from(n / 8).ok().map(Fp::AtCfaOffset)
        }
        Some(_) => None,
    };
    let kind = fp.is_none().then_some(UnsupportedKind::RbpRule);
    let fp = fp.unwrap_or(Fp::Unsupported);
    let bx = match row.register(RBX) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Bx::Unchanged,
        Some(RegisterRule::Offset(n)) => Bx::saved_at(n),
        Some(_) => Bx::Unknown,
    };
    let rule = match cfa {
        Ok((RSP, cfa)) => Rule::RspOffset { cfa, fp, bx },
        Ok((RBX, cfa)) => Rule::RbxOffset { cfa, fp, bx },
        Ok((_, cfa)) => Rule::RbpOffset { cfa, fp, bx },
        Err(threshold) => Rule::Plt { threshold, fp, bx },
    };
    (rule, kind)
}

/// The threshold of the PLT CFA expressions glibc's and binutils' linkers
/// emit for `.plt`: `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_lit11 (or lit10); DW_OP_ge; DW_OP_lit3; DW_OP_shl;
/// DW_OP_plus`, i.e. CFA = rsp + 8 + ((rip & 15) >= threshold) << 3.
fn plt_threshold(expression: &[u8]) -> Option<u8> {
    use gimli::constants::*;
    let lit = |n: u8| DW_OP_lit0.0 + n;
    let prefix = [DW_OP_breg7.0, 8, DW_OP_breg16.0, 0, lit(15), DW_OP_and.0];
    let suffix = [DW_OP_ge.0, lit(3), DW_OP_shl.0, DW_OP_plus.0];
    let rest = expression.strip_prefix(&prefix[..])?;
    let (&threshold_op, rest) = rest.split_first()?;
    if rest != suffix {
        return None;
    }
    [10, 11].into_iter().find(|&t| threshold_op == lit(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_plt_expressions_match() {
        let plt11 = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&plt11), Some(11));
        let mut plt10 = plt11;
        plt10[6] = 0x3a;
        assert_eq!(plt_threshold(&plt10), Some(10));
        let mut plt12 = plt11;
        plt12[6] = 0x3c;
        assert_eq!(plt_threshold(&plt12), None);
        assert_eq!(plt_threshold(&plt11[..10]), None);
        assert_eq!(plt_threshold(&[0x77, 8]), None);
    }
}
