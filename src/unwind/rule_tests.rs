//! Round trips of every rule through raw rows, offsets and rbx save
//! slots a row can hold, rows that must not decode, `show-unwind` text.

use super::*;

fn all_rules() -> Vec<Rule> {
    let fps = [
        Fp::Unchanged,
        Fp::AtCfaOffset(-2),
        Fp::AtCfaOffset(i16::MIN),
        Fp::Unsupported,
    ];
    let mut rules = vec![Rule::EndOfFunction, Rule::SignalFrame, Rule::Outermost];
    rules.extend(UnsupportedKind::ALL.map(Rule::Unsupported));
    let bxs = [
        Bx::Unchanged,
        Bx::BelowCfa(1),
        Bx::BelowCfa(MAX_RBX_SLOT),
        Bx::Unknown,
    ];
    for (fp, bx) in fps.into_iter().flat_map(|fp| bxs.map(|bx| (fp, bx))) {
        for bytes in [0, 8, 16, 65535, 65536, 102416, i64::from(MAX_CFA_OFFSET)] {
            let cfa = CfaOffset::new(bytes).expect("representable");
            rules.push(Rule::RspOffset { cfa, fp, bx });
            rules.push(Rule::RbpOffset { cfa, fp, bx });
            rules.push(Rule::RbxOffset { cfa, fp, bx });
        }
        rules.push(Rule::Plt {
            threshold: 11,
            fp,
            bx,
        });
        rules.push(Rule::Plt {
            threshold: 10,
            fp,
            bx,
        });
    }
    for register in [0, 5, MAX_RETURN_REGISTER] {
        for bytes in [0, 8, i64::from(MAX_CFA_OFFSET)] {
            let cfa = CfaOffset::new(bytes).expect("representable");
            rules.push(Rule::ReturnInRegister { cfa, register });
        }
    }
    rules
}

#[test]
fn every_rule_round_trips_through_a_raw_row() {
    for rule in all_rules() {
        let raw = rule.to_raw(0x1234);
        assert_eq!(raw.pc_low, 0x1234);
        assert_eq!(Rule::from_raw(raw), Ok(rule), "{raw:?}");
        assert_eq!(RawRow::from_bytes(raw.to_bytes()), raw);
    }
}

#[test]
fn cfa_offsets_are_bytes_when_small_and_scaled_when_large() {
    let raw = Rule::RspOffset {
        cfa: CfaOffset::new(102416).expect("100 KiB frame fits"),
        fp: Fp::Unchanged,
        bx: Bx::Unchanged,
    }
    .to_raw(0);
    assert_eq!(raw.cfa_type, CfaType::RspOffset as u8 | CFA_OFFSET_SCALED);
    assert_eq!(u32::from(raw.cfa_offset) * 8, 102416);
    let raw = Rule::RbpOffset {
        cfa: CfaOffset::new(65535).expect("fits"),
        fp: Fp::Unchanged,
        bx: Bx::Unchanged,
    }
    .to_raw(0);
    assert_eq!(
        (raw.cfa_type, raw.cfa_offset),
        (CfaType::RbpOffset as u8, 65535)
    );
    for bad in [-8, 65537, i64::from(MAX_CFA_OFFSET) + 8, i64::MAX] {
        assert_eq!(CfaOffset::new(bad), None, "{bad}");
    }
}

#[test]
fn malformed_rows_do_not_decode() {
    let bad = [
        RawRow {
            cfa_type: CfaType::ReturnInRegister as u8,
            fp_offset: i16::from(MAX_RETURN_REGISTER) + 1,
            ..RawRow::default()
        },
        RawRow {
            cfa_type: CfaType::ReturnInRegister as u8,
            fp_type: FpType::AtCfaOffset as u8,
            fp_offset: 5,
            ..RawRow::default()
        },
        RawRow {
            cfa_type: CfaType::Plt as u8 | CFA_OFFSET_SCALED,
            ..RawRow::default()
        },
        RawRow {
            cfa_type: CfaType::Outermost as u8,
            cfa_offset: 3,
            ..RawRow::default()
        },
        RawRow {
            cfa_type: CfaType::Unsupported as u8,
            fp_offset: 99,
            ..RawRow::default()
        },
        RawRow {
            cfa_type: CfaType::RspOffset as u8,
            fp_type: 3,
            ..RawRow::default()
        },
        // Only an rbp-typed row may take its CFA from rbx.
        RawRow {
            cfa_type: CfaType::RspOffset as u8,
            fp_type: FP_CFA_FROM_RBX,
            ..RawRow::default()
        },
        // Rows without a CFA carry no rbx rule.
        RawRow {
            cfa_type: CfaType::Outermost as u8,
            fp_type: 1 << RBX_RULE_SHIFT,
            ..RawRow::default()
        },
    ];
    for raw in bad {
        assert!(Rule::from_raw(raw).is_err(), "{raw:?}");
    }
}

#[test]
fn rbx_rules_hold_the_save_slots_rows_can_encode() {
    assert_eq!(Bx::saved_at(-56), Bx::BelowCfa(7));
    assert_eq!(Bx::saved_at(-240), Bx::BelowCfa(MAX_RBX_SLOT));
    for unrepresentable in [0, 8, -4, -248, 128, i64::MIN] {
        assert_eq!(
            Bx::saved_at(unrepresentable),
            Bx::Unknown,
            "{unrepresentable}"
        );
    }
    let rule = Rule::RbxOffset {
        cfa: CfaOffset::new(56).expect("fits"),
        fp: Fp::Unchanged,
        bx: Bx::BelowCfa(7),
    };
    assert_eq!(rule.to_string(), "rbx+56");
    assert_eq!(
        rule.bx().map(|b| b.to_string()).as_deref(),
        Some("rbx=*(cfa-56)")
    );
}

#[test]
fn rules_print_as_in_show_unwind() {
    let cfa = CfaOffset::new(16).expect("fits");
    let rule = Rule::RbpOffset {
        cfa,
        fp: Fp::AtCfaOffset(-2),
        bx: Bx::Unchanged,
    };
    assert_eq!(rule.to_string(), "rbp+16");
    assert_eq!(
        rule.fp().map(|f| f.to_string()).as_deref(),
        Some("rbp=*(cfa-16)")
    );
    assert_eq!(
        Rule::Plt {
            threshold: 11,
            fp: Fp::Unchanged,
            bx: Bx::Unchanged,
        }
        .to_string(),
        "plt(11)"
    );
    assert_eq!(
        Rule::Unsupported(UnsupportedKind::CfaRegister).to_string(),
        "unsupported(cfa-register)"
    );
    assert_eq!(
        Rule::ReturnInRegister {
            cfa: CfaOffset::new(8).expect("fits"),
            register: 5
        }
        .to_string(),
        "rsp+8 ra=r5"
    );
}
