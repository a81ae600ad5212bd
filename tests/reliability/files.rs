//! Files and exit status: profiles' and the collector's storage modes under
//! a lax umask, and a run whose windows could not be written.

use super::*;

/// Mode bits of `path`.
fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn profiles_and_collector_storage_are_private_under_a_lax_umask() {
    let _serial = common::serial();
    let dir = common::tempdir();
    let mut cmd = Command::new(BIN);
    cmd.args(["--duration", "0.5", "--profile-format", "pprof,folded"])
        .args(["--unwind-cache-dir", "none", "--profile-path"])
        .arg(dir.path());
    // SAFETY: umask only swaps the child's file-mode mask.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    common::run_command(cmd, Duration::from_secs(60)).assert_success();
    assert_eq!(mode(&dir.path().join("profile.pb")), 0o600);
    assert_eq!(mode(&dir.path().join("folded.txt")), 0o600);
    // Loosened on purpose.
    let loose = dir.path().join("loose");
    let out = common::run(
        &[
            "--duration",
            "0.5",
            "--profile-format",
            "folded",
            "--profile-mode",
            "640",
            "--unwind-cache-dir",
            "none",
            "--profile-path",
            common::s(&loose),
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    assert_eq!(mode(&loose.join("folded.txt")) & 0o770, 0o640 & 0o770);

    let store = dir.path().join("store");
    let mut cmd = Command::new(BIN);
    cmd.args(["collector", "--listen", "127.0.0.1:0", "--storage"])
        .arg(&store);
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let (child, url, _) = common::spawn_listening(cmd, BANNER_TIMEOUT);
    let collector = Collector { child, url };
    let r = http()
        .post(collector.profiles_url())
        .header("X-Lightswitch-Host", "web-1")
        .body(known_profile(T0, 1, 1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let day = store.join("web-1/2024-05-01");
    let file: PathBuf = fs::read_dir(&day).unwrap().next().unwrap().unwrap().path();
    assert_eq!(mode(&file), 0o600);
    for d in [&store, &store.join("web-1"), &day] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
}

/// `sudo lightswitch` (SUDO_UID/SUDO_GID set) leaves profiles the user who
/// ran sudo can open without sudo: they and a `--profile-path` the run
/// created become that user's, still mode 0600. Before, they stayed
/// root's, and the README's first command left a flame graph its user
/// could not open; only `record` gave its files away.
#[test]
fn a_run_through_sudo_gives_its_profiles_to_the_invoking_user() {
    use std::os::unix::fs::MetadataExt;
    let _serial = common::serial();
    let dir = common::tempdir();
    let created = dir.path().join("made/by/the-run");
    let owner = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        (meta.uid(), meta.gid(), meta.mode() & 0o777)
    };
    let through_sudo = |path: &Path, uid: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--duration", "0.5", "--profile-format", "pprof,folded"])
            .args(["--unwind-cache-dir", "none", "--profile-path"])
            .arg(path)
            .env("SUDO_UID", uid)
            .env("SUDO_GID", "65534")
            .env("SUDO_USER", "nobody");
        common::run_command(cmd, Duration::from_secs(60)).assert_success();
    };
    through_sudo(dir.path(), "65534");
    for name in ["profile.pb", "folded.txt"] {
        assert_eq!(
            owner(&dir.path().join(name)),
            (65534, 65534, 0o600),
            "{name}"
        );
    }
    // The directory existed before the run: it stays root's.
    assert_eq!(owner(dir.path()).0, 0);
    through_sudo(&created, "65534");
    // Every directory the run made on the way, so the user can remove
    // them (before, only the innermost was given away).
    for made in [
        "made",
        "made/by",
        "made/by/the-run",
        "made/by/the-run/folded.txt",
    ] {
        assert_eq!(owner(&dir.path().join(made)).0, 65534, "{made}");
    }
    // A profile path that is a symbolic link: the link is given away, not
    // the file it points to.
    let links = common::tempdir();
    let victim = dir.path().join("victim");
    fs::write(&victim, "root's").unwrap();
    std::os::unix::fs::symlink(&victim, links.path().join("profile.pb")).unwrap();
    through_sudo(links.path(), "65534");
    assert_eq!(owner(&victim).0, 0);
    // sudo from root (SUDO_UID=0): root's files.
    through_sudo(dir.path(), "0");
    assert_eq!(owner(&dir.path().join("folded.txt")).0, 0);
}

#[test]
fn windows_that_cannot_be_written_fail_the_run_and_are_not_counted_written() {
    let _serial = common::serial();
    let dir = common::tempdir();
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--duration", "3", "--profile-interval", "1"])
        .args(["--profile-format", "folded", "--unwind-cache-dir", "none"])
        .arg("--profile-path")
        .arg(&out_dir);
    let mut run = Lightswitch::spawn_command(cmd);
    run.expect_sampling();
    // The output directory becomes a file: no window can be written now.
    fs::remove_dir_all(&out_dir).unwrap();
    fs::write(&out_dir, b"in the way").unwrap();
    let out = run.wait(Duration::from_secs(60));
    out.assert_error(&["windows failed", "first: window"]);
    let count = |prefix: &str, key: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|l| {
                l.split(' ')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .unwrap_or_else(|| panic!("no {prefix}{key} in the summary:\n{out}"))
    };
    // `1 window written to` or `N windows written to`.
    let written: u64 = out
        .stdout
        .split(" written to ")
        .next()
        .and_then(|head| head.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no 'N windows written to' headline:\n{out}"));
    let (closed, failed) = (count("windows: ", "closed="), count("windows: ", "failed="));
    // The window closed before the directory went may have been written.
    assert!(failed >= 2, "{out}");
    assert_eq!(written, count("windows: ", "handed_over="), "{out}");
    assert_eq!(written + failed, closed, "{out}");
}
