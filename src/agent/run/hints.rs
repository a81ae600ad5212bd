//! Advice a run gives when what it was asked to sample is not where the
//! CPU time went: a `--pids` target that took no samples while its children
//! ran (a wrapper shell, a launcher script), or that exited before it was
//! sampled (a short command: `record` profiles it from its first
//! instruction).

use std::collections::{BTreeMap, HashMap, HashSet};

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcStat {
    comm: String,
    /// State letter (`R`, `S`, `Z` for a zombie: exited, not yet reaped).
    state: char,
    ppid: u32,
    /// User plus system CPU time, clock ticks.
    cpu_ticks: u64,
}

/// Parse `/proc/PID/stat`: `pid (comm) state ppid ... utime stime ...`
/// (comm may hold spaces and parentheses: it ends at the last `)`).
fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // Fields after comm: state(3) ppid(4) ... utime(14) stime(15).
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        comm,
        state: fields.first()?.chars().next()?,
        ppid: u32::try_from(field(4)?).ok()?,
        cpu_ticks: field(14)? + field(15)?,
    })
}

/// `/proc/PID/stat` of `pid`, when it is running.
fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process now running, by pid.
fn processes() -> HashMap<u32, ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        Some((pid, read_stat(pid)?))
    })
    .collect()
}

/// The children of every thread of `pid` (`/proc/PID/task/TID/children`);
/// none when it is gone.
fn children_of(pid: u32) -> impl Iterator<Item = u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks.flat_map(|task| {
        let path = task.map(|t| t.path().join("children"));
        let text = path.and_then(std::fs::read_to_string).unwrap_or_default();
        text.split_whitespace()
            .filter_map(|child| child.parse().ok())
            .collect::<Vec<u32>>()
    })
}

/// The descendants of `root` in `table` that have used CPU time, as
/// `(pid, comm)`, in pid order.
fn busy_descendants(root: u32, table: &HashMap<u32, ProcStat>) -> Vec<(u32, String)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, stat) in table {
        children.entry(stat.ppid).or_default().push(pid);
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    let mut seen = HashSet::from([root]);
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if seen.insert(child) {
                queue.push(child);
                if table[&child].cpu_ticks > 0 {
                    found.push(child);
                }
            }
        }
    }
    found.sort_unstable();
    found
        .into_iter()
        .map(|pid| (pid, table[&pid].comm.clone()))
        .collect()
}

/// Most children remembered per target by [`ChildrenSeen`].
const CHILDREN_SEEN_MAX: usize = 16;

/// The busy descendants of `--pids` targets seen while the run went on
/// ([`ChildrenSeen::look`]): a wrapper that exits before the run ends
/// (`sh -c 'prog; true'`, profiled without `--duration`, ends the run when
/// it exits) has no children left in `/proc` by then, yet they are what the
/// advice must name.
#[derive(Debug, Default)]
pub struct ChildrenSeen {
    by_target: HashMap<u32, BTreeMap<u32, String>>,
}

impl ChildrenSeen {
    /// Note the descendants of each of `targets` still running that have
    /// used CPU time (at most [`CHILDREN_SEEN_MAX`] per target, the first
    /// seen). Reads only the targets' subtrees (`/proc/PID/task/TID/children`,
    /// then each descendant's `/proc/PID/stat`), so that a run profiling a
    /// service for days does not read every process's status once a second.
    pub fn look(&mut self, targets: &[u32]) {
        for &target in targets {
            let mut table = HashMap::new();
            let mut queue = vec![target];
            while let Some(pid) = queue.pop() {
                let Some(stat) = read_stat(pid) else {
                    continue;
                };
                table.insert(pid, stat);
                queue.extend(children_of(pid).filter(|child| !table.contains_key(child)));
            }
            if !table.contains_key(&target) {
                continue;
            }
            let seen = self.by_target.entry(target).or_default();
            for (pid, comm) in busy_descendants(target, &table) {
                if seen.len() < CHILDREN_SEEN_MAX || seen.contains_key(&pid) {
                    seen.insert(pid, comm);
                }
            }
        }
    }

    fn of(&self, target: u32) -> impl Iterator<Item = (u32, &str)> {
        self.by_target
            .get(&target)
            .into_iter()
            .flatten()
            .map(|(&pid, comm)| (pid, comm.as_str()))
    }
}

/// For the `targets` (`--pids`) that took no samples (not in `sampled`)
/// but whose children (or their children) have used CPU, now or when the
/// run looked (`seen`), or that exited (gone from `/proc`, or a zombie)
/// before any sample: one sentence each, naming them and their children,
/// and the advice to name the children or use `record`. `None` when there
/// is nothing to say.
pub fn unsampled_parents(
    targets: &[u32],
    sampled: &HashSet<u32>,
    seen: &ChildrenSeen,
) -> Option<String> {
    let silent: Vec<u32> = targets
        .iter()
        .copied()
        .filter(|pid| !sampled.contains(pid))
        .collect();
    if silent.is_empty() {
        return None;
    }
    let table = processes();
    let sentences: Vec<String> = silent
        .into_iter()
        .filter_map(|pid| {
            let stat = table.get(&pid);
            let exited = stat.is_none_or(|s| s.state == 'Z');
            let mut busy: BTreeMap<u32, String> = seen
                .of(pid)
                .map(|(child, comm)| (child, comm.to_string()))
                .collect();
            if !exited {
                busy.extend(busy_descendants(pid, &table));
            }
            let children = busy
                .iter()
                .map(|(child, comm)| format!("{child} ({comm})"))
                .collect::<Vec<_>>()
                .join(", ");
            let comm = stat.map_or(String::new(), |s| format!(" ({})", s.comm));
            match (exited, busy.is_empty()) {
                (true, true) => Some(format!(
                    "pid {pid}{comm} took no samples and exited during the run"
                )),
                (true, false) => Some(format!(
                    "pid {pid}{comm} took no samples and exited during the run; its children ran: {children}"
                )),
                (false, false) => Some(format!(
                    "pid {pid}{comm} took no samples, but its children ran: {children}"
                )),
                (false, true) => None,
            }
        })
        .collect();
    (!sentences.is_empty()).then(|| {
        format!(
            "{}; --pids does not follow children and cannot see a process before it \
             is named: name the children with --pids, or profile the command and \
             everything it starts from its first instruction with `lightswitch record -- CMD`",
            sentences.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_names() {
        let text = "42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 15 4 0 0 20 0 1 0 5 0 0";
        let stat = parse_stat(text).unwrap();
        assert_eq!(stat.comm, "a) b (c)");
        assert_eq!(stat.state, 'S');
        assert_eq!((stat.ppid, stat.cpu_ticks), (7, 19));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn busy_grandchildren_are_found_idle_ones_are_not() {
        let stat = |comm: &str, ppid, cpu_ticks| ProcStat {
            comm: comm.into(),
            state: 'S',
            ppid,
            cpu_ticks,
        };
        let table = HashMap::from([
            (10, stat("sh", 1, 0)),
            (11, stat("sleep", 10, 0)),
            (12, stat("sh", 10, 0)),
            (13, stat("prog", 12, 250)),
            (20, stat("other", 1, 900)),
        ]);
        assert_eq!(busy_descendants(10, &table), [(13, "prog".to_string())]);
        assert!(busy_descendants(13, &table).is_empty());
    }

    /// A target that exited unsampled (here: a reaped child, and a zombie)
    /// is named, with the advice to use `record`.
    #[test]
    fn a_target_that_exited_unsampled_is_named() {
        let mut reaped = std::process::Command::new("true").spawn().unwrap();
        let reaped_pid = reaped.id();
        reaped.wait().unwrap();
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let zombie_pid = zombie.id();
        // Not waited for until the advice is written: a zombie meanwhile.
        while !std::fs::read_to_string(format!("/proc/{zombie_pid}/stat"))
            .is_ok_and(|t| parse_stat(&t).is_some_and(|s| s.state == 'Z'))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let advice = unsampled_parents(
            &[reaped_pid, zombie_pid],
            &HashSet::new(),
            &ChildrenSeen::default(),
        )
        .unwrap();
        zombie.wait().unwrap();
        assert!(
            advice.contains(&format!("pid {reaped_pid} took no samples and exited")),
            "{advice}"
        );
        assert!(
            advice.contains(&format!(
                "pid {zombie_pid} (true) took no samples and exited"
            )),
            "{advice}"
        );
        assert!(advice.contains("lightswitch record -- CMD"), "{advice}");
    }

    /// A wrapper whose busy child ran, both gone by the end of the run: the
    /// advice names the child seen while it ran.
    #[test]
    fn children_seen_while_running_are_named_after_the_target_exits() {
        let mut wrapper = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done' & wait",
            ])
            .spawn()
            .unwrap();
        let pid = wrapper.id();
        let mut seen = ChildrenSeen::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while seen.of(pid).next().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            seen.look(&[pid]);
        }
        wrapper.wait().unwrap();
        let advice = unsampled_parents(&[pid], &HashSet::new(), &seen).unwrap();
        assert!(
            advice.contains(&format!(
                "pid {pid} took no samples and exited during the run; its children ran: "
            )),
            "{advice}"
        );
        assert!(advice.contains(" (sh)"), "{advice}");
    }

    #[test]
    fn a_sampled_target_needs_no_advice() {
        let me = std::process::id();
        assert_eq!(
            unsampled_parents(&[me], &HashSet::from([me]), &ChildrenSeen::default()),
            None
        );
    }
}
