//! Tests of [`super`] (`process/walker.rs`).

//! The follower against this test process's own maps, with the walker's
//! maps and the table supply recorded instead of written to BPF.

use super::*;
use crate::sampling::records::{ExecTime, UnwindStatus};
use crate::unwind::interp::Interpreters;
use std::cell::RefCell;

/// What was written to the walker's maps.
#[derive(Default)]
struct Recorded {
    described: RefCell<Vec<(u32, Vec<ExecMapping>, u64)>>,
    removed: RefCell<Vec<u32>>,
    files: RefCell<Vec<u32>>,
    forgotten: RefCell<Vec<(u64, u64)>>,
    exec: Option<ExecTime>,
}

impl WalkerMaps for Recorded {
    fn set_process(&self, pid: u32, mappings: &[ExecMapping], exec_id: u64) -> Result<()> {
        let entry = (pid, mappings.to_vec(), exec_id);
        self.described.borrow_mut().push(entry);
        Ok(())
    }
    fn remove_process(&self, pid: u32) {
        self.removed.borrow_mut().push(pid);
    }
    fn latest_exec(&self, _pid: u32) -> Option<ExecTime> {
        self.exec
    }
    fn set_object_file(&self, _: u64, _: u64, object_id: u32, _: &[(u64, u64, u64)]) -> Result<()> {
        self.files.borrow_mut().push(object_id);
        Ok(())
    }
    fn remove_object_file(&self, dev: u64, inode: u64) {
        self.forgotten.borrow_mut().push((dev, inode));
    }
    fn described_pids(&self) -> Vec<u32> {
        let removed = self.removed.borrow();
        let described = self.described.borrow();
        let mut pids: Vec<u32> = described.iter().map(|d| d.0).collect();
        pids.retain(|pid| !removed.contains(pid));
        pids.dedup();
        pids
    }
}

/// What the table supply was told.
#[derive(Default)]
struct Asked {
    objects: Vec<ObjectId>,
    vdso: Vec<Vec<u8>>,
    exited: Vec<u32>,
    startup: Vec<StartupScan>,
}

impl TableSupply for Asked {
    fn object_mapped(&mut self, object: ObjectId, _tracker: &ProcessTracker) {
        self.objects.push(object);
    }
    fn vdso_mapped(&mut self, image: Vec<u8>) {
        self.vdso.push(image);
    }
    fn jit_mapped(&mut self, _: u32, _: (u64, u64), _: &std::fs::File) -> Option<u32> {
        None
    }
    fn jit_grew(&mut self, _: u32, _: &std::fs::File) -> bool {
        false
    }
    fn process_exited(&mut self, pid: u32) {
        self.exited.push(pid);
    }
    fn startup_scanned(&mut self, scan: StartupScan) {
        self.startup.push(scan);
    }
}

fn sample_of(pid: u32) -> RawSample {
    RawSample {
        timestamp_ns: 0,
        pid,
        tid: pid,
        cpu: 0,
        process_comm: String::new(),
        thread_comm: String::new(),
        kernel_thread: false,
        kernel_stack: Vec::new(),
        user_stack: Vec::new(),
        user_status: UnwindStatus::Complete,
        python: Vec::new(),
        python_walked: false,
        stack_copy: None,
        wait: None,
    }
}

/// The follower with everything it is handed: the tracker, the walker's
/// maps and the table supply (both recorded) and the interpreters.
#[derive(Default)]
struct Rig {
    tracker: ProcessTracker,
    walker: Recorded,
    tables: Asked,
    follower: ProcessFollower,
    interpreters: Interpreters,
}

impl Rig {
    fn with_walker(walker: Recorded) -> Self {
        Self {
            walker,
            ..Default::default()
        }
    }
    /// `on_sample` of a sample of `pid`.
    fn sample(&mut self, pid: u32) {
        let sample = sample_of(pid);
        self.follower.on_sample(
            &sample,
            &mut self.tracker,
            &self.walker,
            &mut self.tables,
            &mut self.interpreters,
        );
    }
    /// `on_event` of one process event.
    fn event(&mut self, event: ProcessEvent) {
        self.follower.on_event(
            event,
            &mut self.tracker,
            &self.walker,
            &mut self.tables,
            &mut self.interpreters,
        );
    }
    /// One step of the start-up scan (5 s budget); true while it goes on.
    fn continue_scan(&mut self) -> bool {
        self.follower.continue_scan(
            &mut self.tracker,
            &self.walker,
            &mut self.tables,
            &mut self.interpreters,
            Duration::from_secs(5),
        )
    }
}

/// The object of the mapping holding this test's own code.
fn own_object(tracker: &mut ProcessTracker) -> (u64, ObjectId) {
    let addr = own_object as *const () as usize as u64;
    let id = tracker.find_mapping(std::process::id(), 0, addr).unwrap();
    (addr, tracker.mapping(id).unwrap().object.unwrap())
}

#[test]
fn a_process_is_described_at_its_first_sample_and_again_after_its_exit() {
    let pid = std::process::id();
    let mut rig = Rig::default();
    rig.sample(pid);
    rig.sample(pid);
    assert_eq!(rig.walker.described.borrow().len(), 1, "described once");
    assert_eq!(rig.follower.described(), 1);
    let (addr, object) = own_object(&mut rig.tracker);
    {
        let described = rig.walker.described.borrow();
        let (described_pid, mappings, exec_id) = &described[0];
        assert_eq!((*described_pid, *exec_id), (pid, 0));
        let own = mappings
            .iter()
            .find(|m| m.start <= addr && addr < m.end)
            .expect("own code described");
        assert_eq!((own.object_id, own.frame_pointers), (object.0, false));
        let vdso = mappings.iter().find(|m| m.object_id == VDSO_OBJECT_ID);
        assert!(vdso.is_some_and(|m| !m.frame_pointers), "{mappings:?}");
    }
    assert!(rig.tables.objects.contains(&object));
    assert_eq!(rig.tables.vdso.len(), 1);
    assert!(rig.tables.vdso[0].starts_with(b"\x7fELF"));
    let files = rig.walker.files.borrow().len();
    assert!(rig.walker.files.borrow().contains(&object.0));
    // The vDSO's table is registered too, under its own file key, so that
    // the exec and mmap programs describe a process's vDSO at once.
    assert!(rig.walker.files.borrow().contains(&VDSO_OBJECT_ID));

    rig.event(ProcessEvent::Exit { pid });
    assert_eq!(*rig.walker.removed.borrow(), vec![pid]);
    assert_eq!(rig.follower.described(), 0);
    // A new process under the pid is described at its first sample; the
    // exec and mmap programs know the objects' files already.
    rig.sample(pid);
    assert_eq!(rig.walker.described.borrow().len(), 2);
    assert_eq!(rig.walker.files.borrow().len(), files);
    // Once it is gone and its objects have been unused for the grace,
    // the walker forgets their files (and they close).
    rig.event(ProcessEvent::Exit { pid });
    let later = crate::util::timefmt::monotonic_ns() + crate::process::EXIT_GRACE_NS + 1;
    let Rig {
        tracker,
        walker,
        follower,
        ..
    } = &mut rig;
    assert_eq!(tracker.retire_exited(later), 1);
    tracker.retire_exited(later + super::super::lifetime::OBJECT_GRACE_NS);
    let retired = tracker.take_retired_objects();
    assert!(retired.iter().any(|(id, _)| *id == object));
    assert_eq!(tracker.object_count(), 0);
    follower.objects_retired(retired, walker);
    // Every file but the vDSO's, which is never retired.
    assert_eq!(walker.forgotten.borrow().len(), files - 1);
    // Retired ids are not forgotten twice.
    follower.objects_retired(tracker.take_retired_objects(), walker);
    assert_eq!(walker.forgotten.borrow().len(), files - 1);
}

#[test]
fn a_process_gone_without_an_exit_event_is_forgotten_by_the_walker() {
    let pid = std::process::id();
    let mut rig = Rig::default();
    rig.sample(pid);
    assert_eq!(rig.follower.described(), 1);
    rig.follower
        .processes_vanished(&[pid], &rig.walker, &mut rig.tables);
    assert_eq!(*rig.walker.removed.borrow(), vec![pid]);
    assert_eq!(rig.tables.exited, vec![pid], "its JIT tables can go");
    assert_eq!(rig.follower.described(), 0);
}

#[test]
fn descriptions_of_processes_gone_from_proc_are_swept() {
    // Above the kernel's pid limit: never in /proc.
    const GONE: u32 = 5_200_000;
    let own = std::process::id();
    let walker = Recorded::default();
    walker.set_process(GONE, &[], 0).unwrap();
    walker.set_process(own, &[], 0).unwrap();
    let mut follower = ProcessFollower::new();
    assert_eq!(follower.sweep_descriptions(&walker), 1);
    assert_eq!(*walker.removed.borrow(), vec![GONE]);
    // Not again before the next sweep is due.
    walker.set_process(GONE + 1, &[], 0).unwrap();
    assert_eq!(follower.sweep_descriptions(&walker), 0);
}

#[test]
fn a_process_whose_image_is_older_than_its_latest_exec_is_not_described() {
    let mut rig = Rig::with_walker(Recorded {
        exec: Some(ExecTime {
            timestamp_ns: 12_345,
            exec_id: 7,
        }),
        ..Default::default()
    });
    rig.sample(std::process::id());
    assert!(rig.walker.described.borrow().is_empty());
    assert_eq!(rig.follower.described(), 0);
    assert!(rig.tables.objects.is_empty());
}

#[test]
fn the_startup_scan_reports_its_tables_once_when_it_is_over() {
    let pid = std::process::id();
    let mut rig = Rig::default();
    // The second pid is above the kernel's pid_max: never a process.
    rig.follower
        .scan_processes(&[pid, u32::MAX - 5], Instant::now());
    while rig.continue_scan() {}
    assert!(!rig.continue_scan());
    assert_eq!(rig.tables.startup.len(), 1, "reported once");
    let (_, object) = own_object(&mut rig.tracker);
    let scan = &rig.tables.startup[0];
    assert_eq!(scan.processes, 1);
    assert!(scan.objects.contains(&object.0));
    assert!(scan.objects.contains(&VDSO_OBJECT_ID));
    assert_eq!(rig.follower.described(), 1);
}

/// A vDSO the BPF programs described (at an exec, or at a sample that
/// found it unknown) becomes the process's `[vdso]` mapping, without an
/// object, as `/proc/PID/maps` would have given it: the symbolizer's vDSO
/// source names its frames.
#[test]
fn a_vdso_the_bpf_programs_described_is_the_processs_vdso_mapping() {
    let pid = std::process::id();
    let mut rig = Rig::default();
    own_object(&mut rig.tracker);
    // Below mmap_min_addr: nothing of this process is mapped there.
    let start = 0x2000;
    let now = crate::util::timefmt::monotonic_ns();
    rig.event(ProcessEvent::Mapping {
        pid,
        start,
        end: start + 0x2000,
        file_offset: 0,
        object: VDSO_OBJECT_ID,
        timestamp_ns: now,
    });
    let id = rig
        .tracker
        .find_mapping(pid, now, start + 0x10)
        .expect("mapped");
    let mapping = rig.tracker.mapping(id).unwrap();
    assert_eq!((mapping.name.as_str(), mapping.object), ("[vdso]", None));
    assert_eq!((mapping.start, mapping.end), (start, start + 0x2000));
}
