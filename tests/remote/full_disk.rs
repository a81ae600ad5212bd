//! What the collector acknowledged is kept, and a window is acknowledged
//! only once stored: through a full disk (the collector's storage on a
//! small tmpfs that fills during the run and then gets room again) and
//! through `kill -9` of the collector during ingest. Agent and collector
//! counts must agree to the sample.

use super::*;

/// A tmpfs of `size` mounted on a fresh directory; unmounted on drop.
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs failed (needs root)");
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fill the file system with `ballast` until no byte is left.
    pub fn fill(&self, ballast: &Path) {
        let mut file = fs::File::create(ballast).unwrap();
        let chunk = vec![0x5a_u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        let mut byte = [0x5a_u8; 1];
        while file.write_all(&byte).is_ok() {
            byte[0] ^= 1;
        }
        let _ = file.sync_all();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `name`'s value in the collector's `/metrics`.
pub fn metric(collector: &Collector, name: &str) -> u64 {
    let text = http()
        .get(format!("{}/metrics", collector.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .parse()
        .unwrap()
}

/// Samples and windows the collector's store holds.
pub fn stored(collector: &Collector) -> (u64, u64) {
    let r = http()
        .get(format!("{}/merged?format=folded", collector.profiles_url()))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let n = |name: &str| r.headers()[name].to_str().unwrap().parse::<u64>().unwrap();
    (
        n("X-Lightswitch-Samples"),
        n("X-Lightswitch-Merged-Profiles"),
    )
}

/// An agent sending 1 s windows of `workload` with `sender` to `url` for
/// `seconds`.
fn agent(workload: &Workload, sender: &str, url: &str, seconds: u32) -> Lightswitch {
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "499"])
        .args(["--sender", sender, "--server-url", url])
        .args([
            "--profile-interval",
            "1",
            "--duration",
            &seconds.to_string(),
        ])
        .args(["--flush-timeout", "30"]);
    Lightswitch::spawn_command(cmd)
}

#[test]
fn a_full_disk_at_the_collector_is_waited_out_and_no_sample_is_lost() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_fulldisk");
    // One collector per sender, each on its own small file system.
    let disks = [Tmpfs::mount("8m"), Tmpfs::mount("8m")];
    let collectors: Vec<Collector> = (disks.iter())
        .map(|d| Collector::start(0, &d.path().join("store"), &[]))
        .collect();
    let agents = [
        agent(&workload, "otlp", &collectors[0].url, 8),
        agent(&workload, "remote", &collectors[1].profiles_url(), 8),
    ];
    // Full once each collector stored a window, until each said 503 twice.
    let wait_for = |name: &str, at_least: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while collectors.iter().any(|c| metric(c, name) < at_least) {
            assert!(Instant::now() < deadline, "{name} stayed below {at_least}");
            thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("lightswitch_collector_blocks_written_total", 1);
    for d in &disks {
        d.fill(&d.path().join("ballast"));
    }
    wait_for("lightswitch_collector_unavailable_total", 2);
    let unavailable: Vec<u64> = (collectors.iter())
        .map(|c| metric(c, "lightswitch_collector_unavailable_total"))
        .collect();
    for (c, d) in collectors.iter().zip(&disks) {
        assert_eq!(metric(c, "lightswitch_collector_storage_failing"), 1);
        assert_eq!(metric(c, "lightswitch_collector_storage_free_bytes"), 0);
        fs::remove_file(d.path().join("ballast")).unwrap();
    }
    for ((agent, collector), unavailable) in agents.into_iter().zip(&collectors).zip(unavailable) {
        let out = agent.wait(Duration::from_secs(60));
        out.assert_success();
        let summary = Summary::parse(&out);
        assert!(unavailable >= 1, "the collector never said 503: {out}");
        assert!(summary.get("delivery.retried") >= 1, "{out}");
        assert_eq!(summary.get("delivery.dropped"), 0, "{out}");
        assert_eq!(summary.get("delivery.rejected"), 0, "{out}");
        assert_eq!(summary.get("delivery.sent"), summary.windows, "{out}");
        // Every sample the agent took is stored, once.
        assert_eq!(
            stored(collector),
            (summary.samples, summary.windows),
            "{out}"
        );
        assert_eq!(
            metric(collector, "lightswitch_collector_storage_failing"),
            0
        );
        assert!(metric(collector, "lightswitch_collector_failed_writes_total") >= unavailable);
    }
}

#[test]
fn a_collector_killed_twice_during_ingest_keeps_every_sample() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_killcoll");
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("store");
    let port = free_port();
    let mut collector = Collector::start(port, &storage, &[]);
    let started = Instant::now();
    // 20 windows of 0.5 s.
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "499"])
        .args(["--sender", "otlp", "--server-url", &collector.url])
        .args(["--profile-interval", "0.5", "--duration", "10"])
        .args(["--flush-timeout", "30"]);
    let agent = Lightswitch::spawn_command(cmd);
    for at in [3, 7] {
        thread::sleep(Duration::from_secs(at).saturating_sub(started.elapsed()));
        collector.child.kill().unwrap();
        collector.child.wait().unwrap();
        thread::sleep(Duration::from_millis(700));
        collector = Collector::start(port, &storage, &[]);
    }
    let out = agent.wait(Duration::from_secs(60));
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 20, "{out}");
    assert_eq!(summary.get("delivery.sent"), 20, "{out}");
    assert_eq!(stored(&collector), (summary.samples, 20), "{out}");
}
