//! Tests of [`super`] (`unwind/interp/mod.rs`).

use super::*;

fn native(address: u64) -> UserFrame {
    UserFrame {
        mapping: None,
        address,
    }
}

/// `sorted(key=f)` called from `g`: the eval loop ran `f` (entry), and
/// below `sorted` it ran `g` and `<module>` (entry).
#[test]
fn runs_go_leaf_ward_of_their_eval_frames() {
    let (f, g, module) = (
        INTERPRETED_TAG | 1,
        INTERPRETED_TAG | 2,
        INTERPRETED_TAG | 3,
    );
    let runs = runs_of(&[(f, true), (g, false), (module, true)], 2);
    assert_eq!(runs, vec![vec![f], vec![g, module]]);
    // Leaf first: sort helper, eval (f), sorted, eval (g), main.
    let mut frames = vec![native(10), native(100), native(20), native(101), native(30)];
    let mut runs = runs.into_iter();
    insert_before_each(
        &mut frames,
        |fr| fr.address == 100 || fr.address == 101,
        |_| runs.next().unwrap_or_default(),
    );
    let order: Vec<u64> = frames.iter().map(|fr| fr.address).collect();
    assert_eq!(order, vec![10, f, 100, 20, g, module, 101, 30]);
}

#[test]
fn runs_beyond_the_eval_frames_join_the_last() {
    let (a, b, c) = (
        INTERPRETED_TAG | 1,
        INTERPRETED_TAG | 2,
        INTERPRETED_TAG | 3,
    );
    let runs = runs_of(&[(a, true), (b, true), (c, false)], 1);
    assert_eq!(runs, vec![vec![a, b, c]]);
}

/// PyPy: its whole code is known, not an eval loop; one frame per stack.
#[test]
fn whole_code_gets_one_frame_per_stack() {
    let mut interpreters = Interpreters::default();
    let label = intern(FrameName {
        mapping: python::MAPPING_NAME,
        function: "[python: unsupported PyPy 7.3.11]".into(),
        file: None,
        line: None,
    });
    interpreters.procs.insert(
        9,
        Attached {
            eval: std::iter::once(100..200).collect(),
            whole_code: true,
            unsupported: Some(label),
            entry: None,
            verdict: Verdict::Unsupported,
        },
    );
    let spliced = |interpreters: &mut Interpreters, addresses: &[u64]| {
        let mut frames: Vec<UserFrame> = addresses.iter().map(|&a| native(a)).collect();
        interpreters.splice(9, &[], false, &mut frames);
        frames.iter().map(|f| f.address).collect::<Vec<u64>>()
    };
    // Leaf first: JIT code, PyPy's code twice, the launcher's main.
    assert_eq!(
        spliced(&mut interpreters, &[5000, 150, 120, 10]),
        [5000, 150, label, 120, 10]
    );
    // A walk that stopped in JIT code.
    assert_eq!(
        spliced(&mut interpreters, &[5000, 6000]),
        [5000, 6000, label]
    );
    assert!(spliced(&mut interpreters, &[]).is_empty());
    // Another process: untouched.
    let mut frames = vec![native(150)];
    interpreters.splice(10, &[], false, &mut frames);
    assert_eq!(frames.len(), 1);
}

#[test]
fn names_round_trip_through_tagged_addresses() {
    let name = FrameName {
        mapping: python::MAPPING_NAME,
        function: "Worker.middle".into(),
        file: Some("/t/chain.py".into()),
        line: Some(4),
    };
    let tagged = intern(name.clone());
    assert_ne!(tagged & INTERPRETED_TAG, 0);
    assert_eq!(*frame_name(tagged).unwrap(), name);
    assert_eq!(intern(name), tagged);
    assert!(frame_name(0x40_1000).is_none());
}
