//! Finding the program `record` runs, before any process is started:
//! where in `PATH` it is, and why it cannot run when it cannot (with the
//! exit status a shell gives for it).

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::launch::CannotRun;

/// The path `program` would be executed from: itself when it names a path,
/// else the first executable of that name in `PATH`. Errors (before any
/// process is started) with a [`CannotRun`]: an empty name, no such file,
/// a file that is not executable (a directory, no execute permission), or
/// one whose interpreter (`#!` line, ELF `PT_INTERP`) does not exist,
/// named as shells do (`./x.sh: bad interpreter /bin/nope: No such file or
/// directory`) rather than as the `ENOENT` exec would fail with.
pub fn resolve_program(program: &OsStr) -> Result<PathBuf> {
    let path = find_program(program)?;
    if let Some(interpreter) = super::images::missing_interpreter(&path) {
        return Err(CannotRun::not_found(format!(
            "{}: bad interpreter {}: No such file or directory",
            program.to_string_lossy(),
            interpreter.display()
        )));
    }
    Ok(path)
}

/// [`resolve_program`] but for the interpreter check.
fn find_program(program: &OsStr) -> Result<PathBuf> {
    let is_executable = |path: &Path| {
        CString::new(path.as_os_str().as_bytes())
            // SAFETY: a NUL-terminated path.
            .map(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 && path.is_file())
            .unwrap_or(false)
    };
    if program.is_empty() {
        return Err(CannotRun::not_found(
            "the command is an empty string: give a program after `record --`, e.g. \
             `lightswitch record -- ./bench`"
                .into(),
        ));
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        if !path.exists() {
            return Err(CannotRun::not_found(format!(
                "{}: no such file",
                path.display()
            )));
        }
        if path.is_dir() {
            return Err(CannotRun::not_executable(format!(
                "{}: is a directory",
                path.display()
            )));
        }
        if !is_executable(&path) {
            return Err(CannotRun::not_executable(format!(
                "{}: not executable (permission denied)",
                path.display()
            )));
        }
        return Ok(path);
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let candidates: Vec<PathBuf> = std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .collect();
    if let Some(found) = candidates.iter().find(|path| is_executable(path)) {
        return Ok(found.clone());
    }
    // As shells do: a file of that name that cannot be run is not "not found".
    if let Some(file) = candidates.iter().find(|path| path.is_file()) {
        return Err(CannotRun::not_executable(format!(
            "{}: found in PATH as {}, but not executable (permission denied)",
            program.to_string_lossy(),
            file.display()
        )));
    }
    Err(CannotRun::not_found(format!(
        "{}: command not found in PATH",
        program.to_string_lossy()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::record::launch::{NOT_EXECUTABLE_EXIT_STATUS, NOT_FOUND_EXIT_STATUS};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn programs_resolve_or_say_why_not() {
        let status = |program: &str| {
            resolve_program(OsStr::new(program))
                .unwrap_err()
                .downcast::<CannotRun>()
                .unwrap()
                .status
        };
        assert_eq!(status(""), NOT_FOUND_EXIT_STATUS);
        assert_eq!(status("/nonexistent/prog"), NOT_FOUND_EXIT_STATUS);
        assert_eq!(status("/"), NOT_EXECUTABLE_EXIT_STATUS);
        assert_eq!(status("/etc/passwd"), NOT_EXECUTABLE_EXIT_STATUS);
        assert!(resolve_program(OsStr::new("sh")).unwrap().is_absolute());
        // A script whose interpreter is missing: named as shells do.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script.sh");
        std::fs::write(&script, "#!/nonexistent/interp\ntrue\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = resolve_program(script.as_os_str())
            .unwrap_err()
            .downcast::<CannotRun>()
            .unwrap();
        assert_eq!(err.status, NOT_FOUND_EXIT_STATUS);
        assert_eq!(
            err.message,
            format!(
                "{}: bad interpreter /nonexistent/interp: No such file or directory",
                script.display()
            )
        );
    }
}
