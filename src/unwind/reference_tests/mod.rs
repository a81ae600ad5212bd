//! Tables checked against gimli's own CFI evaluation: for real system
//! libraries here and for small C programs compiled by the test in
//! [`programs`], every table row (at its start and a few addresses inside
//! it) and every gimli row start is looked up the way the BPF program does
//! and compared with the `UnwindTableRow` gimli evaluates for the same
//! address.

use std::path::{Path, PathBuf};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, EvaluationResult,
    FrameDescriptionEntry, LittleEndian, Location, Register, RegisterRule, UnwindContext,
    UnwindSection, UnwindTableRow, Value,
};
use object::{Object, ObjectSection};

use super::cfi::build_table_with_debug_file;
use super::identity::find_debug_file;
use super::rule::{Bx, Fp, Rule, UnsupportedKind};
use super::table::{CfiSource, UnwindTable};

mod programs;

type Slice<'d> = EndianSlice<'d, LittleEndian>;

/// What one comparison run saw.
#[derive(Debug, Default)]
struct Report {
    /// Addresses compared with gimli.
    checked: u64,
    /// Of those, answered with an unsupported rule (each consistent with gimli's row).
    unsupported: u64,
    /// Addresses outside every FDE, answered end-of-function.
    outside: u64,
    /// Addresses skipped because FDEs overlap there.
    overlapped: u64,
    /// Disagreements (first few).
    mismatches: Vec<String>,
    mismatch_count: u64,
    fdes: u64,
}

struct Fde<'d> {
    start: u64,
    end: u64,
    overlapped: bool,
    fde: FrameDescriptionEntry<Slice<'d>>,
}

/// Compares `table` with gimli's evaluation of `section`.
fn compare<'d, S: UnwindSection<Slice<'d>>>(
    table: &UnwindTable,
    section: &S,
    bases: &BaseAddresses,
) -> Report {
    let mut report = Report::default();
    let mut fdes = Vec::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().expect("CFI parses") {
        if let CieOrFde::Fde(partial) = entry {
            report.fdes += 1;
            let fde = partial
                .parse(|s, b, o| s.cie_from_offset(b, o))
                .expect("FDE parses");
            if fde.len() > 0 {
                fdes.push(Fde {
                    start: fde.initial_address(),
                    end: fde.end_address(),
                    overlapped: false,
                    fde,
                });
            }
        }
    }
    fdes.sort_by_key(|f| f.start);
    // FDEs whose ranges overlap (transitively) form a group; all are skipped.
    let (mut group_start, mut group_end) = (0, 0);
    for i in 0..fdes.len() {
        if i > 0 && fdes[i].start < group_end {
            fdes[group_start..=i]
                .iter_mut()
                .for_each(|f| f.overlapped = true);
            group_end = group_end.max(fdes[i].end);
        } else {
            (group_start, group_end) = (i, fdes[i].end);
        }
    }
    let mut row_ctx = Box::new(UnwindContext::new());
    let mut gimli_rows = Vec::new();
    for f in fdes.iter().filter(|f| !f.overlapped) {
        let mut rows = f.fde.rows(section, bases, &mut row_ctx).expect("rows");
        while let Some(row) = rows.next_row().expect("row") {
            if row.start_address() < row.end_address() {
                gimli_rows.push(row.start_address());
                gimli_rows.push(row.end_address() - 1);
            }
        }
    }
    let mut ctx = Box::new(UnwindContext::new());
    let mut check = |addr: u64, rule: Rule, report: &mut Report| {
        let i = fdes.partition_point(|f| f.start <= addr);
        let Some(fde) = i.checked_sub(1).map(|i| &fdes[i]) else {
            report.outside_or_mismatch(addr, rule);
            return;
        };
        if fde.overlapped {
            report.overlapped += 1;
            return;
        }
        if addr >= fde.end {
            // Not overlapped: no earlier FDE reaches past this one's start.
            report.outside_or_mismatch(addr, rule);
            return;
        }
        let row = fde
            .fde
            .unwind_info_for_address(section, bases, &mut ctx, addr)
            .expect("gimli evaluates the FDE");
        report.checked += 1;
        if let Rule::Unsupported(_) = rule {
            report.unsupported += 1;
        }
        if let Err(why) = agrees(rule, row, &fde.fde, section, addr) {
            report.mismatch(format!("{addr:#x}: table {rule:?}, gimli {row:?}: {why}"));
        }
    };
    for row in table.iter_rows() {
        let (start, end) = (row.start, row.end);
        let mut addrs = vec![start, start + 1, start + (end - start) / 2, end - 1];
        addrs.retain(|&a| a < end);
        addrs.dedup();
        for addr in addrs {
            check(addr, table.lookup(addr), &mut report);
        }
    }
    for addr in gimli_rows {
        check(addr, table.lookup(addr), &mut report);
    }
    report
}

impl Report {
    /// Outside every FDE the table has no rule, but for the outermost
    /// marks the builder adds there by design (an entry point without CFI,
    /// the byte before `makecontext`'s trampoline; unit-tested in
    /// `builder.rs` and `context_start.rs`).
    fn outside_or_mismatch(&mut self, addr: u64, rule: Rule) {
        if rule == Rule::EndOfFunction || rule == Rule::Outermost {
            self.outside += 1;
        } else {
            self.mismatch(format!("{addr:#x}: {rule} outside every FDE"));
        }
    }

    fn mismatch(&mut self, what: String) {
        self.mismatch_count += 1;
        if self.mismatches.len() < 10 {
            self.mismatches.push(what);
        }
    }

    /// No disagreement, enough coverage, and few unsupported answers.
    fn assert_good(&self, name: &str, max_unsupported_fraction: f64) {
        eprintln!("{name}: {self:?}");
        assert_eq!(self.mismatch_count, 0, "{name}: {:#?}", self.mismatches);
        assert!(self.checked > 0, "{name}: nothing checked");
        assert!(
            (self.unsupported as f64) <= max_unsupported_fraction * self.checked as f64,
            "{name}: {} of {} unsupported",
            self.unsupported,
            self.checked
        );
        assert!(
            self.overlapped * 100 <= self.checked,
            "{name}: {} addresses in overlapping FDEs",
            self.overlapped
        );
    }
}

const RBX: Register = Register(3);
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// Whether the table's `rule` at `addr` means what gimli's `row` says.
fn agrees<'d, S: UnwindSection<Slice<'d>>>(
    rule: Rule,
    row: &UnwindTableRow<usize>,
    fde: &FrameDescriptionEntry<Slice<'d>>,
    section: &S,
    addr: u64,
) -> Result<(), String> {
    let ensure = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
    let ra = row.register(RA);
    let ra_normal = ra == Some(RegisterRule::Offset(-8));
    let fp_agrees = |fp: Fp| match (fp, row.register(RBP)) {
        (Fp::Unchanged, None | Some(RegisterRule::Undefined | RegisterRule::SameValue)) => Ok(()),
        (Fp::AtCfaOffset(slots), Some(RegisterRule::Offset(n))) if n == i64::from(slots) * 8 => {
            Ok(())
        }
        (Fp::Unsupported, Some(RegisterRule::Offset(n)))
            if n % 8 != 0 || i16::try_from(n / 8).is_err() =>
        {
            Ok(())
        }
        (
            Fp::Unsupported,
            Some(
                RegisterRule::ValOffset(_)
                | RegisterRule::Register(_)
                | RegisterRule::Expression(_)
                | RegisterRule::ValExpression(_)
                | RegisterRule::Architectural
                | RegisterRule::Constant(_),
            ),
        ) => Ok(()),
        (fp, r) => Err(format!("rbp: table {fp:?}, gimli {r:?}")),
    };
    let bx_agrees = |bx: Bx| match (bx, row.register(RBX)) {
        (Bx::Unchanged, None | Some(RegisterRule::Undefined | RegisterRule::SameValue)) => Ok(()),
        (Bx::BelowCfa(slots), Some(RegisterRule::Offset(n))) if n == -8 * i64::from(slots) => {
            Ok(())
        }
        // Any other rule, or a save slot a row cannot hold (not below the
        // CFA, or deeper than 30 words).
        (Bx::Unknown, Some(RegisterRule::Offset(n))) if n >= 0 || n % 8 != 0 || n < -240 => Ok(()),
        (Bx::Unknown, Some(r)) if !matches!(r, RegisterRule::Offset(_)) => Ok(()),
        (bx, r) => Err(format!("rbx: table {bx:?}, gimli {r:?}")),
    };
    if fde.is_signal_trampoline() {
        return ensure(rule == Rule::SignalFrame, "signal trampoline");
    }
    match rule {
        Rule::EndOfFunction => Err("end-of-function inside an FDE".into()),
        Rule::SignalFrame => Err("signal frame outside a signal trampoline".into()),
        Rule::Outermost => ensure(ra == Some(RegisterRule::Undefined), "outermost"),
        Rule::RspOffset { cfa, fp, bx }
        | Rule::RbpOffset { cfa, fp, bx }
        | Rule::RbxOffset { cfa, fp, bx } => {
            let register = match rule {
                Rule::RspOffset { .. } => RSP,
                Rule::RbpOffset { .. } => RBP,
                _ => RBX,
            };
            let expected = CfaRule::RegisterAndOffset {
                register,
                offset: i64::from(cfa.bytes()),
            };
            ensure(*row.cfa() == expected, "cfa")?;
            ensure(ra_normal, "return address")?;
            fp_agrees(fp)?;
            bx_agrees(bx)
        }
        Rule::ReturnInRegister { cfa, register } => {
            let expected = CfaRule::RegisterAndOffset {
                register: RSP,
                offset: i64::from(cfa.bytes()),
            };
            ensure(*row.cfa() == expected, "cfa")?;
            ensure(
                ra == Some(RegisterRule::Register(Register(u16::from(register)))),
                "return address register",
            )?;
            fp_agrees(Fp::Unchanged)
        }
        Rule::Plt { threshold, fp, bx } => {
            let CfaRule::Expression(expression) = row.cfa() else {
                return Err("plt without an expression".into());
            };
            let expression = expression.get(section).map_err(|e| e.to_string())?;
            let rsp = 0x7ffd_1234_5670u64;
            for low in 0..16 {
                let rip = (addr & !15) | low;
                let got = evaluate_cfa(expression, fde, rsp, rip)?;
                let want = rsp + 8 + if low >= u64::from(threshold) { 8 } else { 0 };
                ensure(
                    got == want,
                    &format!("plt cfa at rip {rip:#x}: {got:#x} vs {want:#x}"),
                )?;
            }
            ensure(ra_normal, "return address")?;
            fp_agrees(fp)?;
            bx_agrees(bx)
        }
        Rule::Unsupported(kind) => {
            let cfa = row.cfa();
            let ok = match kind {
                UnsupportedKind::CfaExpression => matches!(cfa, CfaRule::Expression(_)),
                UnsupportedKind::CfaRegister => matches!(cfa,
                    CfaRule::RegisterAndOffset { register, .. }
                        if *register != RSP && *register != RBP && *register != RBX),
                UnsupportedKind::CfaOffset => matches!(cfa,
                    CfaRule::RegisterAndOffset { offset, .. } if *offset < 0 || *offset > 65535),
                UnsupportedKind::ReturnAddress => !ra_normal,
                _ => false,
            };
            ensure(ok, &format!("unsupported kind {kind}"))
        }
    }
}

/// Evaluates a CFA expression with gimli for the given rsp and rip.
fn evaluate_cfa(
    expression: gimli::Expression<Slice<'_>>,
    fde: &FrameDescriptionEntry<Slice<'_>>,
    rsp: u64,
    rip: u64,
) -> Result<u64, String> {
    let mut eval = expression.evaluation(fde.cie().encoding());
    let mut result = eval.evaluate().map_err(|e| e.to_string())?;
    loop {
        match result {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => {
                let value = match register {
                    RSP => rsp,
                    RA => rip,
                    other => return Err(format!("expression reads register {other:?}")),
                };
                result = eval
                    .resume_with_register(Value::Generic(value))
                    .map_err(|e| e.to_string())?;
            }
            other => return Err(format!("expression needs {other:?}")),
        }
    }
    match eval.as_result() {
        [piece] => match piece.location {
            Location::Address { address } => Ok(address),
            ref other => Err(format!("expression result {other:?}")),
        },
        other => Err(format!("expression result {other:?}")),
    }
}

/// Builds `elf`'s table and compares it with gimli over `.eh_frame` (or
/// `.debug_frame` from `debug_file` / the object itself).
fn build_and_compare(elf: &[u8], debug_file: Option<&[u8]>) -> (UnwindTable, Report) {
    let table = build_table_with_debug_file(elf, debug_file).expect("table builds");
    let file = object::File::parse(elf).expect("ELF");
    let address_of = |name| file.section_by_name(name).map_or(0, |s| s.address());
    let report = match table.stats().source {
        CfiSource::EhFrame => {
            let section = file.section_by_name(".eh_frame").expect(".eh_frame");
            let data = section.data().expect("data");
            let mut eh_frame = EhFrame::new(data, LittleEndian);
            eh_frame.set_address_size(8);
            let bases = BaseAddresses::default()
                .set_eh_frame(section.address())
                .set_text(address_of(".text"))
                .set_got(address_of(".got"));
            compare(&table, &eh_frame, &bases)
        }
        CfiSource::DebugFrame => {
            let debug = object::File::parse(debug_file.unwrap_or(elf)).expect("ELF");
            let section = debug.section_by_name(".debug_frame").expect(".debug_frame");
            let data = section
                .uncompressed_data()
                .expect("uncompressed .debug_frame");
            let mut debug_frame = DebugFrame::new(&data, LittleEndian);
            debug_frame.set_address_size(8);
            compare(&table, &debug_frame, &BaseAddresses::default())
        }
    };
    assert_eq!(table.stats().fdes, report.fdes);
    (table, report)
}

/// The first existing path, if any.
fn first_existing(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.exists())
}

#[test]
fn libc_rows_agree_with_gimli() {
    let Some(path) = first_existing(&[
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib64/libc.so.6",
    ]) else {
        eprintln!("skipped: no libc.so.6");
        return;
    };
    let bytes = std::fs::read(&path).expect("read libc");
    let (table, report) = build_and_compare(&bytes, None);
    report.assert_good("libc", 0.01);
    let rows: Vec<Rule> = table.iter_rows().map(|r| r.rule).collect();
    assert!(rows.contains(&Rule::SignalFrame), "libc has __restore_rt");
    assert!(
        rows.iter().any(|r| matches!(r, Rule::Plt { .. })),
        "libc has a .plt"
    );
    assert!(rows.iter().any(|r| matches!(r, Rule::RbpOffset { .. })));
    assert!(
        rows.iter()
            .any(|r| matches!(r, Rule::ReturnInRegister { register: 5, .. })),
        "libc's vfork keeps its return address in rdi"
    );
    assert_eq!(table.stats().source, CfiSource::EhFrame);
}

#[test]
fn libstdcxx_rows_agree_with_gimli() {
    let Some(path) = first_existing(&[
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/lib64/libstdc++.so.6",
    ]) else {
        eprintln!("skipped: no libstdc++.so.6");
        return;
    };
    let bytes = std::fs::read(&path).expect("read libstdc++");
    let (_, report) = build_and_compare(&bytes, None);
    report.assert_good("libstdc++", 0.01);
}

#[test]
fn libc_debug_file_is_found_by_build_id() {
    let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    if !Path::new("/usr/lib/debug/.build-id").exists() {
        eprintln!("skipped: no debug files installed");
        return;
    }
    let roots = [std::path::PathBuf::from(
        super::identity::DEFAULT_DEBUG_ROOT,
    )];
    if let Some(debug) = find_debug_file(path, &bytes, &roots) {
        assert!(
            debug.starts_with("/usr/lib/debug/.build-id"),
            "{}",
            debug.display()
        );
    }
}
