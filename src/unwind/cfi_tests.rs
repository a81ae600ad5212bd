//! Tests of [`super`] (`unwind/cfi.rs`).

use super::*;

#[test]
fn corrupt_and_foreign_objects_are_errors() {
    assert!(matches!(
        build_table(b"\x7fELF garbage"),
        Err(BuildError::Elf(_) | BuildError::Unsupported(_))
    ));
    assert!(build_table(&[]).is_err());
    if let Ok(libc) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") {
        // Every truncation is an error or a (partial) table, never a panic.
        for len in (0..libc.len()).step_by(libc.len() / 97) {
            let _ = build_table(&libc[..len]);
        }
        let mut wrong_machine = libc.clone();
        wrong_machine[18] = 183; // EM_AARCH64
        assert!(matches!(
            build_table(&wrong_machine),
            Err(BuildError::Unsupported(_))
        ));
    }
}

fn cfa8() -> Rule {
    Rule::RspOffset {
        cfa: super::super::rule::CfaOffset::new(8).expect("fits"),
        fp: super::super::rule::Fp::Unchanged,
        bx: super::super::rule::Bx::Unchanged,
    }
}

#[test]
fn an_entry_point_without_cfi_is_the_outermost_frame() {
    let end = Rule::EndOfFunction;
    // In a 64-byte gap between two FDEs: the whole gap.
    let mut rules = vec![(0x100, cfa8()), (0x140, end), (0x180, cfa8())];
    entry_point_rules(&mut rules, 0x140);
    assert_eq!(
        rules,
        [(0x100, cfa8()), (0x140, Rule::Outermost), (0x180, cfa8())]
    );
    // Later in a long gap: from the entry, at most 128 bytes.
    let mut rules = vec![(0x100, cfa8()), (0x140, end), (0x1000, cfa8())];
    entry_point_rules(&mut rules, 0x150);
    assert_eq!(
        rules,
        [
            (0x100, cfa8()),
            (0x140, end),
            (0x150, Rule::Outermost),
            (0x1d0, end),
            (0x1000, cfa8())
        ]
    );
    // Before every FDE, and after the last.
    let mut rules = vec![(0x100, cfa8()), (0x140, end)];
    entry_point_rules(&mut rules, 0x40);
    assert_eq!(rules[..2], [(0x40, Rule::Outermost), (0xc0, end)]);
    let mut rules = vec![(0x100, cfa8()), (0x140, end)];
    entry_point_rules(&mut rules, 0x200);
    assert_eq!(rules[2..], [(0x200, Rule::Outermost), (0x280, end)]);
    // Covered by an FDE: left alone.
    let mut rules = vec![(0x100, cfa8()), (0x140, end)];
    entry_point_rules(&mut rules, 0x120);
    assert_eq!(rules, [(0x100, cfa8()), (0x140, end)]);
}

/// glibc's dynamic loader has no CFI at its entry point: its table
/// ends a walk there as complete, not by frame pointers.
#[test]
fn the_dynamic_loaders_entry_is_outermost() {
    let Some(bytes) = [
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok()) else {
        eprintln!("skipped: no ld-linux-x86-64.so.2");
        return;
    };
    let entry = parse_x86_64(&bytes).expect("ELF").entry();
    let table = build_table(&bytes).expect("ld.so has CFI");
    assert_eq!(table.lookup(entry), Rule::Outermost);
    assert_eq!(table.lookup(entry + 8), Rule::Outermost);
}
