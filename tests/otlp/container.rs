//! `container.id`: a workload moved into a cgroup v2 directory named as
//! Docker's systemd driver names a container's (`docker-ID.scope`) has
//! its samples labelled with ID; another workload's are not. Once in a
//! one-shot run (symbolized from the live tracker), once in continuous
//! mode (from a tracker snapshot) where the container's process exits in
//! the middle of a window: its id must outlive what the tracker knows of
//! it. The cgroup is removed afterwards.

use super::*;

/// The cgroup v2 hierarchy's mount point (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid v1/v2 system), from
/// `/proc/self/mountinfo`.
fn cgroup2_mount() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("/proc/self/mountinfo");
    mountinfo
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split_whitespace().nth(4)?;
            (after.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount_point))
        })
        .expect("no cgroup2 hierarchy is mounted (the test needs one to make a container's cgroup)")
}

/// `SLICE/docker-ID.scope` under the cgroup v2 mount: processes moved in
/// are moved back to the root cgroup, and both directories removed, on drop.
struct ContainerCgroup {
    root: PathBuf,
    slice: PathBuf,
    scope: PathBuf,
    id: String,
}

impl ContainerCgroup {
    fn create() -> Self {
        let root = cgroup2_mount();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let id = format!("{:032x}{:032x}", std::process::id(), nanos);
        let slice = root.join(format!("lsw-test-{}.slice", std::process::id()));
        let scope = slice.join(format!("docker-{id}.scope"));
        fs::create_dir_all(&scope)
            .unwrap_or_else(|e| panic!("creating {} (as root): {e}", scope.display()));
        ContainerCgroup {
            root,
            slice,
            scope,
            id,
        }
    }

    /// Move process `pid` (all its threads) into the container's cgroup.
    fn enter(&self, pid: u32) {
        fs::write(self.scope.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.scope.display()));
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(
            cgroup.contains(&format!("docker-{}.scope", self.id)),
            "{cgroup}"
        );
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.scope.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = fs::remove_dir(&self.scope);
        let _ = fs::remove_dir(&self.slice);
    }
}

/// The summary's `[pid, tid, container]` rows of process `pid`.
fn containers_of(summary: &Value, pid: u32) -> Vec<Value> {
    summary["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter(|row| row[0] == pid)
        .map(|row| row[2].clone())
        .collect()
}

/// Assert that every thread of `inside` carries `id` and none of
/// `outside` carries any, both sampled.
fn assert_labelled(summary: &Value, inside: u32, outside: u32, id: &str) {
    let (ins, outs) = (
        containers_of(summary, inside),
        containers_of(summary, outside),
    );
    assert!(!ins.is_empty() && !outs.is_empty(), "{summary}");
    assert!(ins.iter().all(|c| c == id), "{inside}: {ins:?}");
    assert!(outs.iter().all(Value::is_null), "{outside}: {outs:?}");
}

#[test]
fn samples_of_a_container_process_carry_its_container_id() {
    let _serial = serial();
    let program = compile("otlp_container", &chain_source(), NO_FP_FLAGS);
    let cgroup = ContainerCgroup::create();
    let inside = Workload::spawn(&program);
    let outside = Workload::spawn(&program);
    cgroup.enter(inside.pid());
    let pids = format!("{},{}", inside.pid(), outside.pid());

    // One-shot: symbolized from the live tracker.
    let dir = tempdir();
    let out = run(
        &[
            "--pids",
            &pids,
            "--sample-freq",
            "499",
            "--duration",
            "1.5",
            "--profile-format",
            "otlp",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let summary = check(&dir.path().join("profile.otlp.pb"));
    assert_labelled(&summary, inside.pid(), outside.pid(), &cgroup.id);

    // Continuous, from a snapshot of the tracker: the container's process
    // exits a second into a 2 s window, which is closed after the tracker
    // forgot the process (its samples all drained).
    let windows = tempdir();
    let mut profiler = Lightswitch::spawn(&[
        "--pids",
        &pids,
        "--sample-freq",
        "499",
        "--duration",
        "3",
        "--profile-interval",
        "2",
        "--profile-format",
        "otlp",
        "--profile-path",
        s(windows.path()),
    ]);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_millis(1000));
    let inside_pid = inside.pid();
    drop(inside);
    let out = profiler.wait(Duration::from_secs(60));
    out.assert_success();
    let mut files: Vec<PathBuf> = fs::read_dir(windows.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}\n{out}");
    assert_labelled(&check(&files[0]), inside_pid, outside.pid(), &cgroup.id);
    drop(cgroup);
}
