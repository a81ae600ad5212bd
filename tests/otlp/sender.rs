//! `--sender otlp` against `receiver.py`, a receiver that decodes every
//! request with the `opentelemetry-proto` package and answers the first
//! with 503 and `Retry-After: 1`, the second with a `partial_success`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use super::*;

/// `receiver.py` writing into `out`, killed on drop; its port.
struct Receiver {
    child: std::process::Child,
    port: u16,
}

impl Receiver {
    fn start(out: &Path) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp/receiver.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(out)
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting receiver.py (scripts/setup.sh makes its Python)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("receiver.py said {line:?}"));
        Receiver { child, port }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name=value` fields of the summary line that starts with `prefix`.
fn summary_field(stdout: &str, prefix: &str, name: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in\n{stdout}"));
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

#[test]
fn the_otlp_sender_waits_as_told_counts_partial_success_and_loses_nothing() {
    let _serial = serial();
    let program = compile("otlp_sender", &chain_source(), NO_FP_FLAGS);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let receiver = Receiver::start(dir.path());
    let mut cmd = Command::new(BIN);
    cmd.env("NO_PROXY", "127.0.0.1")
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=s%20ecret,x-scope-orgid=env",
        )
        .args(["--pids", &workload.pid_arg(), "--sample-freq", "499"])
        .args(["--duration", "3", "--profile-interval", "1"])
        .args(["--sender", "otlp", "--server-url"])
        .arg(format!("http://127.0.0.1:{}/otlp/", receiver.port))
        .args(["--otlp-header", "X-Scope-OrgID=tenant-7"]);
    let out = run_command(cmd, Duration::from_secs(60));
    out.assert_success();
    drop(receiver);

    // Every window sent once; the 503 retried; the partial success counted.
    assert_eq!(summary_field(&out.stdout, "delivery:", "sent"), 3, "{out}");
    assert_eq!(
        summary_field(&out.stdout, "delivery:", "retried"),
        1,
        "{out}"
    );
    assert_eq!(
        summary_field(&out.stdout, "delivery:", "partial"),
        1,
        "{out}"
    );
    assert_eq!(
        summary_field(&out.stdout, "delivery:", "dropped"),
        0,
        "{out}"
    );
    assert!(out.stderr.contains("kept all, but slowly"), "{out}");

    let log: Value = serde_json::from_slice(&fs::read(dir.path().join("log.json")).unwrap())
        .expect("receiver.py's log");
    let log = log.as_array().unwrap();
    let statuses: Vec<u64> = log.iter().map(|e| e["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [503, 200, 200, 200], "{log:?}");
    let waited = log[1]["time"].as_f64().unwrap() - log[0]["time"].as_f64().unwrap();
    assert!(
        waited >= 1.0,
        "retried {waited:.3} s after a Retry-After of 1 s"
    );
    for entry in log {
        assert_eq!(entry["path"], "/otlp/v1development/profiles");
        assert_eq!(entry["profiles"], 1);
        let headers = &entry["headers"];
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["content-encoding"], "gzip");
        assert_eq!(headers["x-api-key"], "s ecret");
        assert_eq!(headers["x-scope-orgid"], "tenant-7");
    }

    // Each request passes the independent check; together they hold every
    // sample of the run, each with its own time, mostly in the chain.
    let total_line = out
        .stdout
        .lines()
        .find(|l| l.contains("windows queued for"))
        .unwrap_or_else(|| panic!("no windows line\n{out}"));
    let run_samples: u64 = total_line
        .rsplit_once(": ")
        .and_then(|(_, counts)| counts.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sample count in {total_line:?}"));
    let (mut samples, mut in_chain, mut stamps) = (0, 0, 0);
    for n in 1..=3 {
        let summary = check(&dir.path().join(format!("request-{n}.pb")));
        samples += summary["samples"].as_u64().unwrap();
        stamps += summary["timestamps"].as_u64().unwrap();
        in_chain += folded_of(&summary)
            .iter()
            .filter(|(line, _)| line.contains(";main;alpha;beta;burn"))
            .map(|(_, n)| n)
            .sum::<u64>();
    }
    assert_eq!(samples, run_samples, "{out}");
    assert_eq!(stamps, samples, "every sample keeps its own timestamp");
    assert!(
        in_chain * 10 >= samples * 9,
        "{in_chain} of {samples} in the chain"
    );
}
