//! What the profile holds, decoded with the crate's own prost types:
//! totals against the folded output, mappings and build IDs, gzip,
//! inlined frames, the truncation marker, mapping flags, function start
//! lines.

use super::*;

/// `--profile-format pprof,folded`: both files come from the same samples,
/// so the pprof stacks (rebuilt as folded lines) equal the folded file
/// line for line, the sample total equals the folded total and the
/// summary's, and the cpu value is count x period. Header fields: sample
/// types, period type, period = 1e9 / 499, default sample type, and a time
/// window inside the run's.
#[test]
fn totals_match_folded() {
    let _serial = serial();
    let chain = compile("lsw_pp_total", &chain_source(), NO_FP);
    let reader = compile("lsw_pp_treader", &reader_source(), NO_FP);
    let chain = Workload::spawn(&chain);
    let reader = Workload::spawn(&reader);
    let r = profile(&[chain.pid(), reader.pid()], "pprof,folded", &[]);
    let ix = r.index();
    let p = &r.profile;

    let folded = read_folded(&r.dir.path().join("folded.txt"));
    let folded_total = total(&folded);
    let samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    let cpu: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    assert!(
        r.summary.samples >= 2 * MIN_SAMPLES,
        "only {} samples:\n{}",
        r.summary.samples,
        r.out
    );
    assert_eq!(
        samples as u64, folded_total,
        "pprof vs folded totals:\n{}",
        r.out
    );
    assert_eq!(
        samples as u64, r.summary.samples,
        "pprof vs summary:\n{}",
        r.out
    );
    let folded_map: BTreeMap<String, u64> = folded
        .iter()
        .map(|(frames, n)| (frames.join(";"), *n))
        .collect();
    assert_eq!(folded_map.len(), folded.len(), "folded lines are distinct");
    let from_pprof = ix.folded();
    if from_pprof != folded_map {
        let only_pprof: Vec<_> = from_pprof
            .iter()
            .filter(|(k, v)| folded_map.get(*k) != Some(v))
            .collect();
        let only_folded: Vec<_> = folded_map
            .iter()
            .filter(|(k, v)| from_pprof.get(*k) != Some(v))
            .collect();
        panic!(
            "pprof and folded output of the same run disagree:\nonly in pprof: {only_pprof:#?}\n\
             only in folded: {only_folded:#?}"
        );
    }
    assert!(
        from_pprof.keys().any(|k| k.contains(KERNEL_SUFFIX)),
        "the reader must contribute kernel frames:\n{}",
        ix.show()
    );

    let period = 1_000_000_000 / FREQ as i64;
    assert_eq!(p.period, period, "period = 1e9 / {FREQ} Hz");
    assert_eq!(cpu, samples * period, "cpu nanoseconds = samples x period");
    for s in &p.sample {
        assert_eq!(s.value, [s.value[0], s.value[0] * period], "{s:?}");
        assert!(s.value[0] > 0, "{s:?}");
    }
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (ix.str(t.r#type), ix.str(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.as_ref().expect("period_type");
    assert_eq!((ix.str(pt.r#type), ix.str(pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(ix.str(p.default_sample_type), "cpu");

    let (started, finished) = (nanos(r.started), nanos(r.finished));
    assert!(
        p.time_nanos >= started && p.time_nanos <= finished,
        "time_nanos {} is outside the run [{started}, {finished}]",
        p.time_nanos
    );
    let want = (SECONDS * 1e9) as i64;
    assert!(
        (p.duration_nanos - want).abs() <= want / 5,
        "duration_nanos {} is not within 20% of --duration {SECONDS} s",
        p.duration_nanos
    );
    assert!(
        p.time_nanos + p.duration_nanos <= finished,
        "the window [{}, +{}] ends after the profiler exited ({finished})",
        p.time_nanos,
        p.duration_nanos
    );
}

/// Mappings of a process that reads /dev/zero (user and kernel frames):
/// the binary's mapping is its full path with the range and offset of its
/// line in /proc/PID/maps, holds every one of its locations, carries the
/// GNU build ID `readelf -n` prints, and has functions; every file mapping
/// carries its file's build ID; `[kernel.kallsyms]` holds the kernel
/// locations and has the build ID of /sys/kernel/notes. Locations are
/// unique per (mapping, address), functions per (name, system name, file).
#[test]
fn mappings_and_build_ids() {
    let _serial = serial();
    let program = compile("lsw_pp_reader", &reader_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let maps = proc_maps(target.pid());
    let ix = r.index();
    let p = &r.profile;
    let binary = fs::canonicalize(&program.path).unwrap();
    let binary = s(&binary);

    // The binary.
    let bin_maps: Vec<&proto::Mapping> = p
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == binary)
        .collect();
    let names: Vec<&str> = p.mapping.iter().map(|m| ix.str(m.filename)).collect();
    assert!(
        !bin_maps.is_empty(),
        "no mapping named {binary}; mappings: {names:?}"
    );
    assert_eq!(names[0], binary, "--pids: the target's executable first");
    let build_id = readelf_build_id(binary);
    assert!(!build_id.is_empty(), "gcc links a build ID by default");
    for m in &bin_maps {
        assert!(
            maps.iter().any(|l| l.path == binary
                && l.start == m.memory_start
                && l.end == m.memory_limit
                && l.offset == m.file_offset),
            "mapping {m:?} is not a line of /proc/PID/maps: {maps:#?}"
        );
        assert_eq!(ix.str(m.build_id), build_id, "{m:?}");
        assert!(m.has_functions, "{binary} is symbolized: {m:?}");
        for l in p.location.iter().filter(|l| l.mapping_id == m.id) {
            assert!(
                (m.memory_start..m.memory_limit).contains(&l.address),
                "location {l:?} is outside its mapping {m:?}"
            );
        }
    }
    let in_read_loop = ix.count(|s| {
        ix.user_stack(s)
            .iter()
            .any(|l| ix.name(l) == "read_loop" && bin_maps.iter().any(|m| m.id == l.mapping_id))
    });
    assert!(
        in_read_loop as f64 >= 0.75 * r.summary.samples as f64,
        "only {in_read_loop} of {} samples pass through read_loop in {binary}:\n{}",
        r.summary.samples,
        ix.show()
    );

    // Every mapping of a file has that file's build ID.
    for m in &p.mapping {
        let name = ix.str(m.filename);
        if name.starts_with('/') {
            assert_eq!(ix.str(m.build_id), readelf_build_id(name), "{name}: {m:?}");
        }
    }

    // The kernel.
    let kernel: Vec<&proto::Mapping> = p
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == KERNEL_MAPPING)
        .collect();
    assert_eq!(kernel.len(), 1, "one kernel mapping; mappings: {names:?}");
    let kernel = kernel[0];
    let kernel_id = kernel_build_id();
    assert!(!kernel_id.is_empty());
    assert_eq!(ix.str(kernel.build_id), kernel_id, "{kernel:?}");
    assert!(
        kernel.has_functions,
        "kallsyms names kernel frames: {kernel:?}"
    );
    let kernel_locations: Vec<&proto::Location> = p
        .location
        .iter()
        .filter(|l| l.mapping_id == kernel.id)
        .collect();
    assert!(!kernel_locations.is_empty());
    for l in &kernel_locations {
        assert!(
            (kernel.memory_start..kernel.memory_limit).contains(&l.address)
                && l.address >= 0xffff_8000_0000_0000,
            "kernel location {l:?} outside {kernel:?}"
        );
    }
    assert!(
        kernel_locations
            .iter()
            .any(|l| ix.names(l).iter().any(|n| n.contains("read"))),
        "no kernel function of read(2) among the kernel frames:\n{}",
        ix.show()
    );
    let with_kernel = ix.count(|s| ix.stack(s).iter().any(|l| ix.is_kernel(l)));
    assert!(
        with_kernel as f64 >= 0.5 * r.summary.samples as f64,
        "reading /dev/zero must put kernel frames on most samples ({with_kernel} of {}):\n{}",
        r.summary.samples,
        ix.show()
    );

    // Deduplication.
    let mut seen = HashSet::new();
    for l in p.location.iter().filter(|l| !ix.is_marker(l)) {
        assert!(
            seen.insert((l.mapping_id, l.address)),
            "two locations for mapping {} address {:#x}",
            l.mapping_id,
            l.address
        );
    }
    let mut seen = HashSet::new();
    for f in &p.function {
        assert!(
            seen.insert((f.name, f.system_name, f.filename)),
            "duplicate function {f:?}"
        );
    }
    let mut seen = HashSet::new();
    assert!(
        p.string_table.iter().all(|s| seen.insert(s)),
        "strings must be unique"
    );
}

/// `--pprof-compression gzip`: the file is gzip (1f 8b), `go tool pprof`
/// reads it, and it gunzips to a profile with the summary's sample count.
#[test]
fn gzip_compression() {
    let _serial = serial();
    let program = compile("lsw_pp_gzip", &chain_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &["--pprof-compression", "gzip"]);
    assert_eq!(&r.bytes[..2], [0x1f, 0x8b], "gzip magic");

    let raw = gunzip(&r.bytes);
    let p = proto::Profile::decode(raw.as_slice()).expect("decoding the gunzipped profile");
    check_structure(&p);
    let samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(samples as u64, r.summary.samples, "{}", r.out);
    assert!(r.summary.samples >= MIN_SAMPLES, "{}", r.out);

    let text = common::go_pprof(&["-sample_index=samples", "-top", s(&r.path)]);
    assert_eq!(
        header_total(&text) as u64,
        r.summary.samples,
        "`go tool pprof` reads the gzip'd file with every sample:\n{text}"
    );
    let rows = parse_top(&text);
    let hot = row(&rows, "chain_hot", &text);
    assert!(hot.flat >= 0.8 * r.summary.samples as f64, "{text}");
}

/// A function inlined into `outer` (always_inline, -O2 -g): the leaf
/// location has two or more lines, `inner` first at the line of its loop
/// and `outer` last at the line of the inlined call, and `go tool pprof`
/// shows `inner` as its own node.
#[test]
fn inlined_frames() {
    let _serial = serial();
    let source = inline_source();
    let program = compile("lsw_pp_inline", &source, NO_FP);
    let src = source_path(&program);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    let loop_line = line_of(&source, "sink += i;");
    let call_line = line_of(&source, "inner(1000000);");

    let inlined = ix.count(|s| {
        let Some(leaf) = ix.user_stack(s).first().copied() else {
            return false;
        };
        let names = ix.names(leaf);
        let lines: Vec<i64> = leaf.line.iter().map(|l| l.line).collect();
        names.len() >= 2
            && names[0] == "inner"
            && names.last() == Some(&"outer")
            && lines[0] == loop_line
            && *lines.last().unwrap() == call_line
    });
    assert!(
        r.summary.samples >= MIN_SAMPLES
            && inlined as f64 >= 0.9 * r.summary.samples as f64,
        "only {inlined} of {} samples end in a location [inner:{loop_line}, .., outer:{call_line}]:\n{}",
        r.summary.samples,
        ix.show()
    );
    let inner = r
        .profile
        .function
        .iter()
        .find(|f| ix.str(f.name) == "inner")
        .unwrap();
    assert_eq!(ix.str(inner.filename), s(&src), "{inner:?}");

    let text = common::go_pprof(&["-sample_index=samples", "-top", s(&r.path)]);
    let rows = parse_top(&text);
    // pprof marks a node that is only ever inlined.
    let inner_row = rows
        .iter()
        .find(|r| r.name == "inner" || r.name == "inner (inline)")
        .unwrap_or_else(|| panic!("no row for inner:\n{text}"));
    let outer_row = row(&rows, "outer", &text);
    assert!(
        inner_row.flat >= 0.9 * r.summary.samples as f64
            && outer_row.cum >= inner_row.flat
            && outer_row.flat <= 0.05 * inner_row.flat,
        "inner must hold the flat samples and outer its cum:\n{text}"
    );
}

/// Recursion 2000 deep, beyond the walker's 1024-frame limit: the
/// truncated samples end (root side) in a location named
/// `[unwind: truncated]` (no mapping, address 0), after exactly 1024 user
/// frames (`hot`, then 1023 `recurse`), and there are as many as the
/// summary's `truncated=` count.
#[test]
fn incomplete_stack_marker() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void recurse(int n) {{
    if (n > 1) recurse(n - 1); else hot();
    sink++;
}}
int main(void) {{ recurse(2000); sink++; return 0; }}
"
    );
    let program = compile("lsw_pp_rec2000", &source, NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();

    let mut marker_ids = BTreeSet::new();
    let marked = ix.count(|s| {
        let stack = ix.stack(s);
        let last = stack.last().unwrap();
        if !(ix.is_marker(last) && ix.name(last) == TRUNCATED) {
            return false;
        }
        marker_ids.insert(last.id);
        let user = ix.user_stack(s);
        assert!(
            stack[..stack.len() - 1].iter().all(|l| !ix.is_marker(l)),
            "the marker must be the only one and the last location: {s:?}"
        );
        assert!(
            user.len() == FRAME_LIMIT
                && ix.name(user[0]) == "hot"
                && user[1..].iter().all(|l| ix.name(l) == "recurse"),
            "a truncated sample must hold hot and 1023 recurse frames, got {} user frames:\n{}",
            user.len(),
            ix.show()
        );
        true
    });
    let truncated = r.truncated();
    assert_eq!(
        marked,
        truncated,
        "samples ending in {TRUNCATED} vs the summary's truncated= count:\n{}\n{}",
        ix.show(),
        r.out
    );
    assert!(
        truncated as f64 >= 0.85 * r.summary.samples as f64 && truncated >= MIN_SAMPLES,
        "only {truncated} of {} samples are truncated:\n{}\n{}",
        r.summary.samples,
        ix.show(),
        r.out
    );
    assert_eq!(marker_ids.len(), 1, "one deduplicated marker location");
    let marker = ix.location(*marker_ids.first().unwrap());
    assert_eq!((marker.mapping_id, marker.address), (0, 0), "{marker:?}");
    let f = ix.function(marker.line[0].function_id);
    assert_eq!(ix.str(f.filename), "", "{f:?}");
}

/// A `-g` build whose own functions all have files, lines and (in `outer`)
/// inlined frames: the binary's mapping says so, `has_functions`,
/// `has_filenames`, `has_line_numbers` and `has_inline_frames` all true.
/// pprof's own symbolizer sets these flags once it has symbolized a mapping
/// at that level; `_start`, which crt1.o brings without DWARF, cannot
/// unset them.
#[test]
fn debug_info_mapping_flags() {
    let _serial = serial();
    let program = compile("lsw_pp_flags", &inline_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    let binary = fs::canonicalize(&program.path).unwrap();
    let mappings: Vec<&proto::Mapping> = r
        .profile
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == s(&binary))
        .filter(|m| r.profile.location.iter().any(|l| l.mapping_id == m.id))
        .collect();
    assert!(
        !mappings.is_empty(),
        "no mapping of {} with locations",
        binary.display()
    );
    for m in mappings {
        let names: Vec<String> = r
            .profile
            .location
            .iter()
            .filter(|l| l.mapping_id == m.id)
            .map(|l| {
                let f = ix.function(l.line.last().unwrap().function_id);
                format!("{}@{:?}", ix.str(f.name), ix.str(f.filename))
            })
            .collect();
        assert!(
            m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames,
            "{} was symbolized with functions, files, lines and inlined frames: {m:?}\n\
             its locations: {names:?}",
            binary.display()
        );
    }
}

/// Functions carry `start_line`, the line their definition starts on.
#[test]
#[ignore = "not implemented: Function.start_line needs the declaration line (DW_AT_decl_line), which the symbolizer does not report yet"]
fn function_start_line() {
    let _serial = serial();
    let source = chain_source();
    let program = compile("lsw_pp_start", &source, NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    for (name, definition) in [
        ("chain_hot", "void chain_hot(void) {"),
        ("chain_b", "void chain_b(void) {"),
        ("chain_a", "void chain_a(void) {"),
        ("main", "int main(void) {"),
    ] {
        let f = r
            .profile
            .function
            .iter()
            .find(|f| ix.str(f.name) == name)
            .unwrap_or_else(|| panic!("no function {name}"));
        assert_eq!(
            f.start_line,
            line_of(&source, definition),
            "{name}'s start_line: {f:?}"
        );
    }
}
