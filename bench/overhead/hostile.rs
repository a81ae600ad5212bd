//! Hostile neighbours of the churn soak (`--hostile N`, decision 0013): beside
//! the churn, N unprivileged processes (user nobody) of every selected kind
//! ([`HostileKind`], the program `hostile.c`) make the JIT symbol files the
//! profiler reads as hard to read as they can, and a root bystander spins
//! in a known call chain (`by_outer;by_burn`). The agents write folded
//! stacks next to their pprof files; [`Tally`] counts the bystander's
//! samples in them (and any frame named from the root-only file a perf map
//! symlink points to), to be set against its CPU time x the frequency.
//!
//! Everything started here is killed, and every file removed, when
//! [`Neighbours`] is dropped, and by [`cleanup`] (the harness's Ctrl-C
//! handler calls it).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

/// One kind of hostile neighbour (a mode of `hostile.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostileKind {
    /// Its perf map `/tmp/perf-PID.map` is a FIFO that never gets a writer.
    Fifo,
    /// A jitdump (mapped executable, `jit-PID.dump`) in a 1 GiB sparse file
    /// whose first record claims 0xfffffff0 bytes.
    JitHuge,
    /// A jitdump that grows by valid code-load records at about 10 MB/s
    /// (each process stops at 128 MiB, removes its file and is replaced).
    JitGrow,
    /// A perf map line whose name is 100 MB.
    MapName,
    /// A perf map of 256 MiB of tiny lines.
    MapLines,
    /// Its perf map is a symlink to a root-only file (which names the code
    /// the process runs): the profiler must not follow it.
    MapSymlink,
}

impl HostileKind {
    /// `hostile.c`'s name of the mode.
    fn mode(self) -> &'static str {
        match self {
            HostileKind::Fifo => "fifo",
            HostileKind::JitHuge => "jit-huge",
            HostileKind::JitGrow => "jit-grow",
            HostileKind::MapName => "map-name",
            HostileKind::MapLines => "map-lines",
            HostileKind::MapSymlink => "map-symlink",
        }
    }

    /// Every kind.
    pub fn all() -> Vec<HostileKind> {
        HostileKind::value_variants().to_vec()
    }
}

/// Settings of the hostile neighbours.
#[derive(Debug, Clone)]
pub struct HostileConfig {
    /// Instances of each kind (0: the bystander alone).
    pub instances: usize,
    /// The kinds to run.
    pub kinds: Vec<HostileKind>,
    /// The `hostile.c` program (built by run.sh).
    pub program: PathBuf,
}

impl HostileConfig {
    /// The neighbours, per kind, as `kind xN`.
    pub fn describe(&self) -> String {
        if self.instances == 0 || self.kinds.is_empty() {
            return "none (the bystander alone)".to_string();
        }
        self.kinds
            .iter()
            .map(|k| format!("{} x{}", k.mode(), self.instances))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The call chain of the bystander's samples in folded stacks.
pub const BYSTANDER_CHAIN: &str = "by_outer;by_burn";
/// The name the root-only file behind the symlinked perf maps gives their
/// code: in a profile, it means the profiler followed the symlink.
pub const SECRET_NAME: &str = "hostile_secret_read_through_a_symlink";
/// Where `hostile map-symlink` runs its code (`SYMLINK_PAGE` in hostile.c).
const SYMLINK_PAGE: u64 = 0x1000_0000;
/// Size at which a `jit-grow` process removes its jitdump and exits, MiB.
const JIT_GROW_MIB: u32 = 128;
/// User and group ids of nobody.
const NOBODY: &str = "65534";

/// Process groups and paths to kill and remove at the end.
#[derive(Default)]
struct Left {
    groups: Vec<i32>,
    paths: Vec<PathBuf>,
}

static LEFT: Mutex<Left> = Mutex::new(Left {
    groups: Vec::new(),
    paths: Vec::new(),
});

fn left() -> std::sync::MutexGuard<'static, Left> {
    LEFT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kill (SIGKILL) every process group started here and remove every file
/// and directory created here (perf maps in /tmp, the scratch directory).
/// Safe to call more than once and from a signal handler thread.
pub fn cleanup() {
    let left = std::mem::take(&mut *left());
    for &group in &left.groups {
        // SAFETY: kill has no memory-safety preconditions; the group is one
        // this harness started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    // A killed loop's children are reaped by init: wait (5 s at most) until
    // no process of the groups is left, so that none outlives the harness.
    let until = Instant::now() + Duration::from_secs(5);
    // SAFETY: as above; signal 0 only checks that the group has a process.
    while left
        .groups
        .iter()
        .any(|&g| unsafe { libc::kill(-g, 0) } == 0)
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for path in left.paths {
        let removed = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(_) => Ok(()),
        };
        if let Err(err) = removed {
            eprintln!("hostile: cannot remove {}: {err}", path.display());
        }
    }
}

/// Start the hostile neighbours and the bystander once `sampling()` says
/// every agent has taken samples (so that the bystander's whole CPU time is
/// sampled), or after a minute. The perf-map symlink is then up to the
/// profiler to refuse: `fs.protected_symlinks` is 0 for the rest of the run.
pub fn start(config: &HostileConfig, sampling: impl Fn() -> bool) -> Result<Neighbours> {
    crate::measure::set_sysctl_for_run("fs.protected_symlinks", "0")?;
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until && !sampling() {
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("churn: hostile neighbours: {}", config.describe());
    Neighbours::start(config)
}

/// The `--hostile` settings: `instances` of each of `kinds` (all when
/// empty), run from `program`; `None` without `--hostile`.
pub fn config(
    instances: Option<usize>,
    kinds: &[HostileKind],
    program: Option<&Path>,
) -> Result<Option<HostileConfig>> {
    let Some(instances) = instances else {
        return Ok(None);
    };
    let program = program.filter(|p| p.is_file()).context(
        "--hostile needs --hostile-program, the program run.sh builds from bench/overhead/hostile.c",
    )?;
    if crate::profiler::which("setpriv").is_none() {
        bail!("--hostile needs setpriv (util-linux) to start processes as user nobody");
    }
    Ok(Some(HostileConfig {
        instances,
        kinds: if kinds.is_empty() {
            HostileKind::all()
        } else {
            kinds.to_vec()
        },
        program: fs::canonicalize(program)?,
    }))
}

/// The hostile neighbours and the bystander, running.
pub struct Neighbours {
    children: Vec<(HostileKind, Child)>,
    bystander: Option<Child>,
}

impl Neighbours {
    /// Start the bystander (root) and `config.instances` of each kind (user
    /// nobody, each in a process group of its own) in a scratch directory
    /// under /tmp. Errors if one cannot start or exits within a second.
    pub fn start(config: &HostileConfig) -> Result<Self> {
        let dir = PathBuf::from(format!("/tmp/lightswitch-hostile-{}", std::process::id()));
        left().paths.push(dir.clone());
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let jd = dir.join("jd");
        fs::create_dir(&jd)?;
        fs::set_permissions(&jd, fs::Permissions::from_mode(0o777))?;
        let program = dir.join("hostile");
        fs::copy(&config.program, &program)
            .with_context(|| format!("copying {}", config.program.display()))?;
        let bystander_program = dir.join("bystander");
        fs::copy(&config.program, &bystander_program)?;
        let secret = dir.join("secret");
        fs::write(&secret, format!("{SYMLINK_PAGE:x} 1000 {SECRET_NAME}\n"))?;
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600))?;
        let mut neighbours = Neighbours {
            children: Vec::new(),
            bystander: None,
        };
        let bystander = spawn(
            Command::new(&bystander_program).arg("bystander"),
            &dir.join("bystander.log"),
        )?;
        neighbours.bystander = Some(bystander);
        for &kind in &config.kinds {
            for i in 0..config.instances {
                let mut command = Command::new("setpriv");
                command.args([
                    &format!("--reuid={NOBODY}"),
                    &format!("--regid={NOBODY}"),
                    "--clear-groups",
                ]);
                match kind {
                    // A loop: each process stops at JIT_GROW_MIB.
                    HostileKind::JitGrow => {
                        command.args(["sh", "-c", "while :; do \"$0\" \"$@\" || sleep 1; done"])
                    }
                    _ => &mut command,
                }
                .arg(&program)
                .arg(kind.mode());
                match kind {
                    HostileKind::JitHuge => command.arg(&jd),
                    HostileKind::JitGrow => command.arg(&jd).arg(JIT_GROW_MIB.to_string()),
                    HostileKind::MapSymlink => command.arg(&secret),
                    _ => &mut command,
                };
                let log = dir.join(format!("{}-{i}.log", kind.mode()));
                let child = spawn(&mut command, &log)?;
                // setpriv execs the program: its pid names the perf map.
                left()
                    .paths
                    .push(PathBuf::from(format!("/tmp/perf-{}.map", child.id())));
                neighbours.children.push((kind, child));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        for (kind, child) in &mut neighbours.children {
            if let Some(status) = child.try_wait()? {
                let log = dir.join(format!("{}-*.log", kind.mode()));
                bail!(
                    "hostile neighbour {} exited at once ({status}; see {})",
                    kind.mode(),
                    log.display()
                );
            }
        }
        Ok(neighbours)
    }

    /// Stop the bystander (SIGSTOP), read its CPU time (user + system,
    /// `/proc/PID/stat`), then kill it. Returns the CPU time, s.
    pub fn stop_bystander(&mut self) -> Result<f64> {
        let mut child = self.bystander.take().context("no bystander")?;
        let pid = child.id();
        // SAFETY: kill has no memory-safety preconditions; the child is not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let cpu_s = crate::measure::cpu_time(pid)?.process_ns as f64 / 1e9;
        let _ = child.kill();
        let _ = child.wait();
        Ok(cpu_s)
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        // Reaped first: cleanup waits until no process of their groups is
        // left, zombies included.
        let bystander = self.bystander.as_mut();
        for child in self.children.iter_mut().map(|(_, c)| c).chain(bystander) {
            let _ = child.kill();
            let _ = child.wait();
        }
        cleanup();
    }
}

/// Spawn `command` in a process group of its own (registered for
/// [`cleanup`]), stdin and stdout to /dev/null, stderr to `log`.
fn spawn(command: &mut Command, log: &Path) -> Result<Child> {
    let log_file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    left().groups.push(child.id() as i32);
    Ok(child)
}

/// What the folded files of one agent said so far.
#[derive(Debug, Default)]
pub struct Tally {
    seen: HashSet<OsString>,
    /// Samples of the bystander's chain ([`BYSTANDER_CHAIN`]).
    pub bystander: u64,
    /// Samples under a frame named [`SECRET_NAME`].
    pub secret: u64,
    /// Folded files read.
    pub files: usize,
    /// Lines skipped for being longer than [`MAX_LINE`].
    pub long_lines: u64,
}

/// Longest folded line read whole, bytes (the bystander's are short; a
/// perf map's 100 MB name makes some lines that long).
const MAX_LINE: usize = 1 << 16;

impl Tally {
    /// Read the window files `folded-*.txt` in `dir` not read before.
    /// A file that cannot be read (pruned meanwhile) is skipped.
    pub fn scan(&mut self, dir: &Path) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if !(text.starts_with("folded-") && text.ends_with(".txt")) || self.seen.contains(&name)
            {
                continue;
            }
            if let Ok(file) = File::open(entry.path()) {
                if self.read(BufReader::with_capacity(1 << 16, file)).is_ok() {
                    self.files += 1;
                    self.seen.insert(name);
                }
            }
        }
    }

    /// Count the bystander's and the secret's samples in folded stacks,
    /// skipping lines longer than [`MAX_LINE`] without holding them.
    fn read(&mut self, mut reader: impl BufRead) -> std::io::Result<()> {
        let mut line = Vec::new();
        let mut long = false;
        loop {
            let buf = reader.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            let end = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..end.unwrap_or(buf.len())];
            if !long && line.len() + chunk.len() > MAX_LINE {
                long = true;
                line.clear();
            } else if !long {
                line.extend_from_slice(chunk);
            }
            let used = end.map_or(buf.len(), |e| e + 1);
            reader.consume(used);
            if end.is_some() {
                self.line(&line, long);
                line.clear();
                long = false;
            }
        }
        self.line(&line, long);
        Ok(())
    }

    fn line(&mut self, line: &[u8], long: bool) {
        if long {
            self.long_lines += 1;
            return;
        }
        let text = String::from_utf8_lossy(line);
        let Some((stack, count)) = text.rsplit_once(' ') else {
            return;
        };
        let count: u64 = count.trim().parse().unwrap_or(0);
        if stack.contains(BYSTANDER_CHAIN) {
            self.bystander += count;
        }
        if stack.contains(SECRET_NAME) {
            self.secret += count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_the_bystander_and_the_secret_and_skips_long_lines() {
        let long = "A".repeat(MAX_LINE + 10);
        let text = format!(
            "bystander;main;by_outer;by_burn 40\nbystander;main;by_outer 2\n\
             hostile;{long};by_outer;by_burn 1000\nhostile;{SECRET_NAME} 7\n\
             bystander;main;by_outer;by_burn;asm_sysvec_apic_timer_interrupt_[k] 3"
        );
        let mut tally = Tally::default();
        // A small buffer: lines cross many refills.
        tally
            .read(BufReader::with_capacity(7, text.as_bytes()))
            .unwrap();
        assert_eq!(
            (tally.bystander, tally.secret, tally.long_lines),
            (43, 7, 1)
        );
    }
}
