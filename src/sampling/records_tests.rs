use super::*;

#[test]
fn record_parses_frames_and_comms() {
    // The layout of struct sample_header in src/sampling/bpf/profiler.h, by hand:
    // an independent check of the generated type the parser uses.
    let mut data = vec![0u8; 72];
    data[0..8].copy_from_slice(&123u64.to_ne_bytes());
    data[8..12].copy_from_slice(&42u32.to_ne_bytes());
    data[12..16].copy_from_slice(&43u32.to_ne_bytes());
    data[16..20].copy_from_slice(&1u32.to_ne_bytes());
    data[20..22].copy_from_slice(&1u16.to_ne_bytes());
    data[22..24].copy_from_slice(&2u16.to_ne_bytes());
    data[24] = 1;
    data[40..43].copy_from_slice(b"app");
    data[56..59].copy_from_slice(b"thr");
    for addr in [0xffff_ffff_8100_0000u64, 0x401000, 0x402000] {
        data.extend_from_slice(&addr.to_ne_bytes());
    }
    let s = RawSample::parse(&data).unwrap();
    assert_eq!((s.timestamp_ns, s.pid, s.tid, s.cpu), (123, 42, 43, 1));
    assert_eq!(s.process_comm, "app");
    assert_eq!(s.thread_comm, "thr");
    assert_eq!(s.kernel_stack, vec![0xffff_ffff_8100_0000]);
    assert_eq!(s.user_stack, vec![0x401000, 0x402000]);
    assert_eq!(s.user_status, UnwindStatus::Truncated);
    assert_eq!(s.wait, None);
    assert!(RawSample::parse(&data[..data.len() - 1]).is_err());

    // An off-CPU record: flags OFF_CPU | RUNNABLE, off_cpu_ns at 32.
    data[25] = SAMPLE_FLAG_OFF_CPU | SAMPLE_FLAG_RUNNABLE;
    data[32..40].copy_from_slice(&5_000_000u64.to_ne_bytes());
    let s = RawSample::parse(&data).unwrap();
    assert_eq!(
        s.wait,
        Some(Wait {
            ns: 5_000_000,
            runnable: true
        })
    );
}

#[test]
fn a_stack_copy_follows_the_whole_sample_record() {
    let mut data = vec![0u8; size_of::<types::stack_sample>()];
    data[22..24].copy_from_slice(&1u16.to_ne_bytes());
    data[24] = 6; // no_table
    data[25] = SAMPLE_FLAG_STACK_COPY;
    data[72..80].copy_from_slice(&0x401234u64.to_ne_bytes());
    // struct stack_copy by hand: ip, sp, bp, bx, upper_start, frame, len,
    // upper_len, missing, upper_missing, exact_ip, bx_known, padding; then
    // 16 bytes from sp and 8 bytes of the upper part.
    let upper_start = 0x7ffc_0010_0000u64;
    for word in [
        0x401234u64,
        0x7ffc_0000_1000,
        0x7ffc_0000_1100,
        0x5555,
        upper_start,
    ] {
        data.extend_from_slice(&word.to_ne_bytes());
    }
    for field in [0u32, 24, 8, 0, 0] {
        data.extend_from_slice(&field.to_ne_bytes());
    }
    data.extend_from_slice(&[1, 1, 0, 0]);
    data.extend_from_slice(&0x4015ffu64.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes());
    data.extend_from_slice(&0x400100u64.to_ne_bytes());
    let s = RawSample::parse(&data).unwrap();
    assert_eq!(s.user_stack, vec![0x401234]);
    assert_eq!(s.user_status, UnwindStatus::NoTable);
    let copy = s.stack_copy.as_deref().unwrap();
    assert_eq!(
        (copy.ip, copy.sp, copy.bp, copy.bx),
        (0x401234, 0x7ffc_0000_1000, 0x7ffc_0000_1100, Some(0x5555))
    );
    assert_eq!((copy.frame, copy.exact_ip), (0, true));
    assert_eq!(copy.word(0x7ffc_0000_1000), Some(0x4015ff));
    assert_eq!(copy.word(0x7ffc_0000_1008), Some(0));
    assert_eq!(copy.word(0x7ffc_0000_1009), None);
    assert_eq!(copy.word(0x7ffc_0000_0ff8), None);
    assert_eq!(
        copy.word(0x7ffc_0000_1010),
        None,
        "the gap between the parts"
    );
    assert_eq!(copy.word(upper_start), Some(0x400100));
    assert_eq!(copy.word(upper_start + 1), None);
    // Shorter than its len says.
    assert!(RawSample::parse(&data[..data.len() - 1]).is_err());
    // A page the BPF program could not read is a hole.
    let missing_at = size_of::<types::stack_sample>() + 5 * 8 + 12;
    let mut holed = data.clone();
    holed[missing_at..missing_at + 4].copy_from_slice(&1u32.to_ne_bytes());
    let holed = RawSample::parse(&holed).unwrap();
    let copy = holed.stack_copy.as_deref().unwrap();
    assert_eq!(copy.word(0x7ffc_0000_1000), None);
    assert_eq!(copy.word(upper_start), Some(0x400100));
    // An upper part longer than the whole copy.
    let upper_len_at = size_of::<types::stack_sample>() + 5 * 8 + 8;
    data[upper_len_at..upper_len_at + 4].copy_from_slice(&25u32.to_ne_bytes());
    assert!(RawSample::parse(&data).is_err());
}

#[test]
fn events_parse_and_unknown_types_do_not() {
    let record = |kind: u32, pid: u32, address: u64| {
        let mut data = Vec::new();
        data.extend_from_slice(&kind.to_ne_bytes());
        data.extend_from_slice(&pid.to_ne_bytes());
        data.extend_from_slice(&address.to_ne_bytes());
        data.extend_from_slice(&99u64.to_ne_bytes());
        data.extend_from_slice(&0x5000u64.to_ne_bytes());
        data.extend_from_slice(&0x1000u64.to_ne_bytes());
        data.extend_from_slice(&6u32.to_ne_bytes());
        data.extend_from_slice(&0u32.to_ne_bytes());
        data
    };
    let parse = |data: &[u8]| TimedEvent::parse(data).map(|e| (e.event, e.timestamp_ns));
    assert_eq!(
        ProcessEvent::parse(&record(5, 7, 0x4000)),
        Some(ProcessEvent::Mapping {
            pid: 7,
            start: 0x4000,
            end: 0x5000,
            file_offset: 0x1000,
            object: 6,
            timestamp_ns: 99
        })
    );
    assert_eq!(
        parse(&record(1, 7, 0)),
        Some((
            ProcessEvent::Exec {
                pid: 7,
                timestamp_ns: 99
            },
            99
        ))
    );
    assert_eq!(
        parse(&record(2, 7, 0)),
        Some((ProcessEvent::Exit { pid: 7 }, 99))
    );
    assert_eq!(
        parse(&record(3, 7, 0x4000)),
        Some((
            ProcessEvent::UnknownMapping {
                pid: 7,
                address: 0x4000
            },
            99
        ))
    );
    assert_eq!(
        ProcessEvent::parse(&record(4, 8, 7)),
        Some(ProcessEvent::Fork {
            pid: 8,
            parent: 7,
            timestamp_ns: 99
        })
    );
    assert_eq!(parse(&record(9, 7, 0)), None);
    assert_eq!(parse(&record(1, 7, 0)[..47]), None);
}

#[test]
fn process_info_holds_the_mappings_in_the_c_layout() {
    let mapping = ExecMapping {
        start: 0x1000,
        end: 0x2000,
        bias: 0x400,
        object_id: 9,
        frame_pointers: true,
    };
    let value = process_info_value(&[mapping], 5, 3);
    assert_eq!(value.len(), 16 + 32 * MAX_PROCESS_MAPPINGS);
    assert_eq!(value[0..4], 1u32.to_ne_bytes());
    assert_eq!(value[4..8], 5u32.to_ne_bytes());
    assert_eq!(value[8..16], 3u64.to_ne_bytes());
    assert_eq!(value[16..24], 0x1000u64.to_ne_bytes());
    assert_eq!(value[24..32], 0x2000u64.to_ne_bytes());
    assert_eq!(value[32..40], 0x400u64.to_ne_bytes());
    assert_eq!(value[40..44], 9u32.to_ne_bytes());
    assert_eq!(value[44..48], 1u32.to_ne_bytes());
    let many = vec![mapping; MAX_PROCESS_MAPPINGS + 3];
    assert_eq!(
        process_info_value(&many, 1, 0)[0..4],
        (MAX_PROCESS_MAPPINGS as u32).to_ne_bytes()
    );
}
