//! The symbolizer over real objects: names, lines, what a continuous
//! symbolizer keeps between windows.

use super::*;
use crate::profile::Line;
use crate::sampling::records::RawSample;
use std::time::Duration;

#[test]
fn demangles_rust_and_cpp_and_keeps_c() {
    assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
    assert_eq!(demangle("_Z3addii"), "add(int, int)");
    assert_eq!(demangle("main"), "main");
}

/// An address `eighths`/8 into the first executable mapping of this
/// test process whose path satisfies `wanted` (/proc/self/maps).
pub(super) fn address_in(wanted: impl Fn(&str) -> bool, eighths: u64) -> u64 {
    crate::process::maps::read_maps(std::process::id())
        .unwrap()
        .into_iter()
        .find(|m| m.executable && wanted(&m.path))
        .map(|m| m.start + (m.end - m.start) / 8 * eighths)
        .unwrap()
}

/// The paths of the objects whose parsed data `symbolizer` keeps,
/// sorted.
pub(super) fn kept_objects(
    symbolizer: &Symbolizer,
    tracker: &crate::process::ProcessTracker,
) -> Vec<String> {
    let mut kept: Vec<String> = symbolizer
        .objects
        .parsed
        .borrow()
        .keys()
        .map(|&object| tracker.object(object).expect("known object").path.clone())
        .collect();
    kept.sort();
    kept
}

#[test]
fn continuous_symbolizer_keeps_lines_and_only_the_objects_of_new_addresses() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let in_exe = address_in(|p| p == exe, 4);
    let in_ld = address_in(|p| p.contains("/ld-linux"), 4);
    let in_libc = address_in(|p| p.contains("/libc.so"), 4);
    let elsewhere_in_libc = address_in(|p| p.contains("/libc.so"), 5);
    let pid = std::process::id();
    let mut tracker = crate::process::ProcessTracker::new();
    let window = Window {
        start_unix_ns: 0,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 99,
        off_cpu: false,
    };
    let symbolizer = Symbolizer::new();
    let symbolize = |tracker: &mut crate::process::ProcessTracker, stacks: &[Vec<u64>]| {
        let mut aggregator = Aggregator::new();
        for stack in stacks {
            aggregator.add(&RawSample::for_test(pid, 0, stack.clone()), tracker);
        }
        let profile = symbolizer.build_profile(&aggregator, &*tracker, window);
        assert!(profile.samples.iter().all(|s| s.frames.len() >= 3));
        let kept = kept_objects(&symbolizer, tracker);
        let names: Vec<Vec<Line>> = profile.frames.iter().map(|f| f.lines.to_vec()).collect();
        (kept, names)
    };
    let (both, names) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
    // libc and ld.so are kept; the test binary only if it is small.
    let exe_is_small = std::fs::metadata(&exe).unwrap().len() <= KEPT_OBJECT_MAX_BYTES;
    assert_eq!(both.len(), 2 + usize::from(exe_is_small), "{both:?}");
    assert_eq!(both.contains(&exe), exe_is_small, "{both:?}");
    // The same addresses again: answered from the cache; the parsed
    // objects stay for KEEP_PARSED_WINDOWS windows, then go.
    for _ in 0..KEEP_PARSED_WINDOWS {
        let (kept, names_again) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
        assert_eq!(kept, both);
        assert_eq!(names_again, names);
    }
    let (none, names_again) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
    assert!(none.is_empty(), "{none:?}");
    assert_eq!(names_again, names);
    // A new address in libc: only libc is parsed (and kept).
    let (libc_only, _) = symbolize(&mut tracker, &[vec![elsewhere_in_libc, in_ld, in_exe]]);
    assert_eq!(libc_only.len(), 1);
    assert!(libc_only[0].contains("/libc.so"), "{libc_only:?}");
    // The one-shot symbolizer names the same frames.
    let mut aggregator = Aggregator::new();
    aggregator.add(
        &RawSample::for_test(pid, 0, vec![in_libc, in_ld, in_exe]),
        &mut tracker,
    );
    let fresh =
        Symbolizer::one_shot(&Default::default()).build_profile(&aggregator, &tracker, window);
    let fresh: Vec<Vec<Line>> = fresh.frames.iter().map(|f| f.lines.to_vec()).collect();
    assert_eq!(fresh, names);
}

/// The one-shot profile of one sample of this process with user stack
/// `stack` (leaf first), in a window of one second.
fn one_shot_profile(stack: Vec<u64>) -> Profile {
    let mut tracker = crate::process::ProcessTracker::new();
    let mut aggregator = Aggregator::new();
    aggregator.add(
        &RawSample::for_test(std::process::id(), 0, stack),
        &mut tracker,
    );
    let window = Window {
        start_unix_ns: 0,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 99,
        off_cpu: false,
    };
    Symbolizer::one_shot(&Default::default()).build_profile(&aggregator, &tracker, window)
}

/// User frames of `profile` left unnamed.
fn unnamed_user_frames(profile: &Profile) -> usize {
    profile
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::User && !f.symbolized)
        .count()
}

/// A sample in one of libc's PLT stubs is named `callee@plt` (a
/// symbol-table lookup alone gives the function before `.plt`).
#[test]
fn a_frame_in_a_plt_stub_is_named_after_its_callee() {
    use object::{Object, ObjectSection};
    let libc = crate::process::maps::read_maps(std::process::id())
        .unwrap()
        .into_iter()
        .find(|m| m.executable && m.path.contains("/libc.so"))
        .unwrap();
    let data = std::fs::read(&libc.path).unwrap();
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).unwrap();
    let plt = file.section_by_name(".plt").unwrap();
    let (plt_offset, _) = plt.file_range().unwrap();
    let stubs = plt::PltStubs::of(&file).unwrap();
    // The last stub of `.plt` (the first is the resolver's).
    let stub = plt.address() + plt.size() - 16;
    let callee = stubs.name_of(stub).unwrap().to_string();
    let in_stub = libc.start + (plt_offset + (stub - plt.address()) - libc.file_offset) + 4;
    let profile = one_shot_profile(vec![in_stub, address_in(|p| p.contains("/libc.so"), 3)]);
    let names: Vec<&str> = profile
        .frames
        .iter()
        .flat_map(|f| f.lines.iter().map(|l| l.function.as_ref()))
        .collect();
    assert!(
        names.contains(&format!("{callee}@plt").as_str()),
        "{callee}@plt not in {names:?}"
    );
}

#[test]
fn continuous_symbolizer_leaves_big_objects_for_a_later_window_once_over_budget() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let exe = exe.to_string_lossy().into_owned();
    // The test binary's frame is a return address into this test (the
    // symbolizer looks up the byte before a caller's address): a fixed
    // fraction of its text can fall on a function's first byte, whose
    // previous byte is padding no symbol covers.
    let in_exe = continuous_symbolizer_leaves_big_objects_for_a_later_window_once_over_budget
        as *const () as usize as u64
        + 1;
    assert!(address_in(|p| p == exe, 0) <= in_exe);
    let stack = vec![address_in(|p| p.contains("/libc.so"), 3), in_exe];
    let pid = std::process::id();
    let mut tracker = crate::process::ProcessTracker::new();
    let mut aggregator = Aggregator::new();
    aggregator.add(&RawSample::for_test(pid, 0, stack), &mut tracker);
    let symbolizer = Symbolizer::new();
    let unnamed = |duration_ns: u64| {
        let window = Window {
            start_unix_ns: 0,
            duration_ns,
            sample_freq_hz: 99,
            off_cpu: false,
        };
        unnamed_user_frames(&symbolizer.build_profile(&aggregator, &tracker, window))
    };
    // A window of no length has time for one object only: the kept
    // ones come first (libc; the test binary too if it is small), the
    // other's frame stays unnamed.
    assert_eq!(unnamed(0), 1);
    // The next window (with time) names it.
    assert_eq!(unnamed(1_000_000_000), 0);
}

/// The profiler's own executable (here, the test binary) is named from
/// its symbol table: its full names, without reading its DWARF for
/// source lines or inlined frames.
#[test]
fn the_profilers_own_frames_are_named_without_its_dwarf() {
    let in_exe =
        the_profilers_own_frames_are_named_without_its_dwarf as *const () as usize as u64 + 1;
    let profile = one_shot_profile(vec![in_exe]);
    let own: Vec<&Line> = profile
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::User)
        .flat_map(|f| f.lines.iter())
        .collect();
    assert_eq!(own.len(), 1, "{own:?}");
    assert!(
        own[0]
            .function
            .ends_with("::the_profilers_own_frames_are_named_without_its_dwarf"),
        "{own:?}"
    );
    assert_eq!((&own[0].file, own[0].line), (&None, None), "{own:?}");
}

#[test]
fn a_worker_behind_names_no_new_object_until_it_catches_up() {
    let stack = vec![
        address_in(|p| p.contains("/libc.so"), 3),
        address_in(|p| p.contains("/ld-linux"), 3),
    ];
    let pid = std::process::id();
    let mut tracker = crate::process::ProcessTracker::new();
    let mut aggregator = Aggregator::new();
    aggregator.add(&RawSample::for_test(pid, 0, stack), &mut tracker);
    let symbolizer = Symbolizer::new();
    let window = Window {
        start_unix_ns: 0,
        duration_ns: 10_000_000_000,
        sample_freq_hz: 99,
        off_cpu: false,
    };
    let unnamed = || unnamed_user_frames(&symbolizer.build_profile(&aggregator, &tracker, window));
    assert_eq!(
        symbolizer.object_budget(1_000_000_000),
        ObjectBudget::Time(Duration::from_millis(500))
    );
    symbolizer.set_backlog(1);
    assert_eq!(
        symbolizer.object_budget(1_000_000_000),
        ObjectBudget::Time(Duration::from_millis(250))
    );
    // Two windows waiting: not even one object, however long the window.
    symbolizer.set_backlog(BACKLOG_NO_OBJECTS);
    assert_eq!(
        symbolizer.object_budget(1_000_000_000),
        ObjectBudget::Nothing
    );
    assert_eq!(unnamed(), 2);
    assert_eq!(unnamed(), 2, "unnamed frames are not cached");
    symbolizer.set_backlog(0);
    assert_eq!(unnamed(), 0);
    assert_eq!(
        Symbolizer::one_shot(&Default::default()).object_budget(1_000_000_000),
        ObjectBudget::Unlimited
    );
}
