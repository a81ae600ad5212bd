//! Which container a process runs in: the id its runtime named its cgroup
//! after, read from `/proc/PID/cgroup` once per process (at the first
//! sample the tracker resolves for it; a forked process starts in its
//! parent's cgroup and takes its parent's answer), and kept while a window
//! holding its samples may still become a profile, exited or not.
//!
//! Runtimes put the container's 64-hex id in the last components of the
//! cgroup path, in cgroup v1 and v2 alike:
//! - Docker: `/docker/ID` (cgroupfs driver), `/system.slice/docker-ID.scope`
//!   (systemd driver);
//! - containerd and CRI-O under Kubernetes:
//!   `/kubepods/burstable/podUID/ID` (cgroupfs),
//!   `/kubepods.slice/.../cri-containerd-ID.scope` or `.../crio-ID.scope`
//!   (systemd);
//! - Podman: `/machine.slice/libpod-ID.scope`, `/libpod_parent/libpod-ID`.
//!
//! The innermost component that is such a name wins (a container in a
//! container is the inner one). Anything else (`0::/`, `user.slice`,
//! `crio-conmon-ID.scope`, a 32-hex name) is no container.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{ProcessMaps, ProcessTracker};

/// Most bytes of `/proc/PID/cgroup` read: one line per hierarchy (about a
/// dozen in cgroup v1), each at most a path; what follows is ignored.
pub const CGROUP_READ_LIMIT: u64 = 16 * 1024;

/// Length of a container id: 32 bytes in hex.
const ID_LEN: usize = 64;

/// Prefixes runtimes give the cgroup of a container (before its id).
const PREFIXES: [&str; 4] = ["docker-", "cri-containerd-", "crio-", "libpod-"];

/// What the tracker knows of a process's container.
#[derive(Debug, Clone, Default)]
pub(super) enum Container {
    /// `/proc/PID/cgroup` not read yet (no sample resolved for it).
    #[default]
    Unread,
    /// Read: the container id, or `None` when its cgroup names none (or
    /// the file could not be read).
    Known(Option<Arc<str>>),
}

impl Container {
    fn id(&self) -> Option<&Arc<str>> {
        match self {
            Container::Known(id) => id.as_ref(),
            Container::Unread => None,
        }
    }
}

/// The container id of process `pid`: [`container_id`] of the first
/// [`CGROUP_READ_LIMIT`] bytes of `/proc/PID/cgroup` (paths as seen from
/// the profiler's cgroup namespace). `None` when the process is in no
/// container, or its file cannot be read (it exited).
pub fn read_container_id(pid: u32) -> Option<Arc<str>> {
    let mut text = String::new();
    File::open(format!("/proc/{pid}/cgroup"))
        .and_then(|f| f.take(CGROUP_READ_LIMIT).read_to_string(&mut text))
        .ok()?;
    container_id(&text).map(Arc::from)
}

/// The container id a `/proc/PID/cgroup` text names (lines
/// `HIERARCHY:CONTROLLERS:PATH`): the first line whose path has one (see
/// the module docs), as 64 lower-case hex digits.
pub fn container_id(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(id_of_component)
    })
}

/// The container id one cgroup path component names: `ID`, or one of
/// [`PREFIXES`] then `ID`, with or without `.scope`.
fn id_of_component(name: &str) -> Option<&str> {
    let name = name.strip_suffix(".scope").unwrap_or(name);
    let id = PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    (id.len() == ID_LEN && id.bytes().all(|b| hex(&b))).then_some(id)
}

impl ProcessTracker {
    /// The container process `pid` runs in (or ran in: a process gone
    /// keeps its answer until [`Self::retire_exited`] retires what a
    /// window could refer to), when its cgroup names one. A pid reused
    /// within a window answers for the process known now if that one is in
    /// a container, else for the one before it.
    pub fn container_id(&self, pid: u32) -> Option<&Arc<str>> {
        self.processes
            .get(&pid)
            .and_then(|p| p.container.id())
            .or_else(|| self.departed_containers.get(&pid).map(|(_, id)| id))
    }

    /// Read `pid`'s container the first time one of its samples is
    /// resolved: one read of `/proc/PID/cgroup` per process known. Not for
    /// a process whose exit was noticed: its pid's file is gone or another
    /// process's.
    pub(super) fn learn_container(&mut self, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            if matches!(p.container, Container::Unread) && p.exited_at_ns.is_none() {
                p.container = Container::Known(read_container_id(pid));
            }
        }
    }

    /// Forget the containers of processes gone before `before_mono_ns`
    /// (see [`Self::retire_exited`]).
    pub(super) fn retire_departed_containers(&mut self, before_mono_ns: u64) {
        self.departed_containers
            .retain(|_, (at, _)| *at >= before_mono_ns);
    }
}

/// Containers of processes gone, by pid, with when they went
/// (CLOCK_MONOTONIC ns).
pub(super) type Departed = FxHashMap<u32, (u64, Arc<str>)>;

impl ProcessMaps {
    /// This process, known under `pid`, is forgotten or replaced (it
    /// exited or its pid was reused) while windows holding its samples may
    /// be open: its container goes to `departed`, where it stays until the
    /// retirement cut-off passes `at` (its exit or its latest sample,
    /// CLOCK_MONOTONIC ns).
    pub(super) fn container_departs(&mut self, pid: u32, at: u64, departed: &mut Departed) {
        if let Container::Known(Some(id)) = std::mem::take(&mut self.container) {
            departed.insert(pid, (at, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f797c539e6c745de61a93ca3ff892358ecbcaccd8414d5db545c38428142970";

    fn id_of(cgroup: &str) -> Option<String> {
        container_id(cgroup).map(str::to_string)
    }

    #[test]
    fn docker_cgroupfs_v1_and_v2() {
        let v1 = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n2:cpu,cpuacct:/docker/{ID}\n\
             1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        assert_eq!(id_of(&v1).as_deref(), Some(ID));
        assert_eq!(id_of(&format!("0::/docker/{ID}\n")).as_deref(), Some(ID));
    }

    #[test]
    fn docker_systemd_v1_and_v2() {
        let v1 = format!(
            "10:devices:/system.slice/docker-{ID}.scope\n\
             1:name=systemd:/system.slice/docker-{ID}.scope\n0::/\n"
        );
        assert_eq!(id_of(&v1).as_deref(), Some(ID));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(id_of(&v2).as_deref(), Some(ID));
        // systemd inside the container puts its processes below the scope.
        let nested = format!("0::/system.slice/docker-{ID}.scope/init.scope\n");
        assert_eq!(id_of(&nested).as_deref(), Some(ID));
    }

    #[test]
    fn kubernetes_containerd_and_crio() {
        let pod = "kubepods-burstable-pod0b6f8d5a_1f0e_4b4d_9a3c_5d8e1c2b7a90.slice";
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/{pod}/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(id_of(&systemd).as_deref(), Some(ID));
        let crio =
            format!("11:memory:/kubepods.slice/kubepods-besteffort.slice/{pod}/crio-{ID}.scope\n");
        assert_eq!(id_of(&crio).as_deref(), Some(ID));
        let cgroupfs = format!(
            "9:cpuset:/kubepods/burstable/pod0b6f8d5a-1f0e-4b4d-9a3c-5d8e1c2b7a90/{ID}\n\
             0::/kubepods/burstable/pod0b6f8d5a-1f0e-4b4d-9a3c-5d8e1c2b7a90/{ID}\n"
        );
        assert_eq!(id_of(&cgroupfs).as_deref(), Some(ID));
    }

    #[test]
    fn podman() {
        let v2 = format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n");
        assert_eq!(id_of(&v2).as_deref(), Some(ID));
        let v1 = format!("4:memory:/machine.slice/libpod-{ID}.scope\n");
        assert_eq!(id_of(&v1).as_deref(), Some(ID));
    }

    #[test]
    fn innermost_container_wins() {
        let inner = "a".repeat(64);
        let nested = format!("0::/docker/{ID}/docker/{inner}\n");
        assert_eq!(id_of(&nested), Some(inner));
    }

    #[test]
    fn no_container() {
        for cgroup in [
            "0::/\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "12:pids:/\n1:name=systemd:/init.scope\n0::/init.scope\n",
            // Podman's and CRI-O's monitor runs beside the container.
            &format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"),
            &format!("0::/kubepods.slice/crio-conmon-{ID}.scope\n"),
            // 32 hex digits, upper case, 63 or 65 digits: not a container id.
            "4:memory:/process_api/bc65e8e537d3904afe402f778b83ca11\n",
            &format!("0::/docker/{}\n", ID.to_uppercase()),
            &format!("0::/docker/{}\n", &ID[1..]),
            &format!("0::/docker/{ID}0\n"),
            &format!("0::/system.slice/docker-{ID}.service\n"),
            "",
            "garbage without colons\n",
        ] {
            assert_eq!(id_of(cgroup), None, "{cgroup:?}");
        }
    }

    #[test]
    fn reads_this_process() {
        // This process's own file reads; whatever it names is well formed.
        if let Some(id) = read_container_id(std::process::id()) {
            assert_eq!(id.len(), ID_LEN);
        }
        assert_eq!(read_container_id(u32::MAX), None);
    }

    #[test]
    fn a_gone_process_keeps_its_container_until_its_windows_close() {
        const PID: u32 = 4242;
        const S: u64 = 1_000_000_000;
        let mut tracker = ProcessTracker::new();
        tracker.apply_maps(PID, &[]);
        let id: Arc<str> = Arc::from(ID);
        tracker.processes.get_mut(&PID).unwrap().container = Container::Known(Some(id.clone()));
        tracker.processes.get_mut(&PID).unwrap().last_sample_ns = 2 * S;
        tracker.process_exited(PID, 3 * S);
        // Every sample drained: the process goes, its container stays.
        assert_eq!(tracker.trim_departed(4 * S), 1);
        assert_eq!(tracker.process_count(), 0);
        assert_eq!(tracker.container_id(PID), Some(&id));
        // A window holding samples from before its exit is still open.
        tracker.retire_exited(3 * S);
        assert_eq!(tracker.container_id(PID), Some(&id));
        tracker.retire_exited(3 * S + 1);
        assert_eq!(tracker.container_id(PID), None);
    }

    #[test]
    fn a_reused_pid_keeps_the_old_container_for_the_old_samples() {
        const PID: u32 = 4243;
        const S: u64 = 1_000_000_000;
        let mut tracker = ProcessTracker::new();
        tracker.apply_maps(PID, &[]);
        let id: Arc<str> = Arc::from(ID);
        tracker.processes.get_mut(&PID).unwrap().container = Container::Known(Some(id.clone()));
        tracker.process_exited(PID, S);
        // A new process with the pid: read afresh at its first sample.
        tracker.apply_maps(PID, &[]);
        assert!(matches!(
            tracker.processes[&PID].container,
            Container::Unread
        ));
        assert_eq!(tracker.container_id(PID), Some(&id));
        tracker.retire_exited(S + 1);
        assert_eq!(tracker.container_id(PID), None);
    }

    #[test]
    fn a_forked_process_starts_in_its_parents_container() {
        const S: u64 = 1_000_000_000;
        let mut tracker = ProcessTracker::new();
        tracker.apply_maps(10, &[]);
        let id: Arc<str> = Arc::from(ID);
        tracker.processes.get_mut(&10).unwrap().container = Container::Known(Some(id.clone()));
        tracker.process_forked(11, 10, S);
        assert_eq!(tracker.container_id(11), Some(&id));
        // Known already: its first sample reads nothing.
        tracker.learn_container(11);
        assert_eq!(tracker.container_id(11), Some(&id));
    }
}
