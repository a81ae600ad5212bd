//! The user who started lightswitch through sudo (`SUDO_UID`, `SUDO_GID`,
//! `SUDO_USER`): `record` runs its command as them, and the profiles a
//! profiling run or `record` writes are given to them, so that
//! `sudo lightswitch` leaves files its user can open without sudo (still
//! private: the mode stays `--profile-mode`, by default 0600).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use anyhow::{anyhow, Result};

/// The user who started lightswitch through sudo, from `SUDO_UID`/`SUDO_GID`:
/// `record`'s command runs as them, and the files a run writes become theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (the user's groups from the group database;
    /// just `gid` when they cannot be read).
    pub groups: Vec<u32>,
    /// The user's name (`SUDO_USER`), for `USER` and `LOGNAME`.
    pub name: Option<OsString>,
    /// The user's home directory (password database), for `HOME`.
    pub home: Option<PathBuf>,
}

impl Identity {
    /// Who started lightswitch through sudo: `SUDO_UID` and `SUDO_GID`
    /// (both set by sudo), with `SUDO_USER`'s supplementary groups. `None`
    /// when not started by sudo or when running as root already.
    pub fn from_sudo() -> Result<Option<Self>> {
        let (Some(uid), Some(gid)) = (std::env::var_os("SUDO_UID"), std::env::var_os("SUDO_GID"))
        else {
            return Ok(None);
        };
        let parse = |name: &str, value: &OsStr| -> Result<u32> {
            value
                .to_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("{name}={value:?} is not a numeric id"))
        };
        let uid = parse("SUDO_UID", &uid)?;
        let gid = parse("SUDO_GID", &gid)?;
        if uid == 0 {
            return Ok(None);
        }
        let name = std::env::var_os("SUDO_USER");
        let groups = name
            .as_deref()
            .and_then(|user| user_groups(user, gid))
            .unwrap_or_else(|| vec![gid]);
        Ok(Some(Identity {
            uid,
            gid,
            groups,
            name,
            home: home_directory(uid),
        }))
    }
}

/// `uid`'s home directory from the password database (getpwuid_r).
fn home_directory(uid: u32) -> Option<PathBuf> {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buffer` outlives `entry`'s use.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() || entry.pw_dir.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r filled pw_dir with a NUL-terminated string in `buffer`.
    let dir = unsafe { std::ffi::CStr::from_ptr(entry.pw_dir) };
    Some(PathBuf::from(OsStr::from_bytes(dir.to_bytes())))
}

/// `user`'s groups from the group database (getgrouplist), `gid` included.
fn user_groups(user: &OsStr, gid: u32) -> Option<Vec<u32>> {
    let name = CString::new(user.as_bytes()).ok()?;
    let mut count: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; count as usize];
        let before = count;
        // SAFETY: `groups` has room for `count` entries; `name` is NUL-terminated.
        let n = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if n >= 0 {
            groups.truncate(count as usize);
            return Some(groups);
        }
        if count <= before || count > 65_536 {
            return None;
        }
    }
}

/// The files a run wrote (`outputs`: profiles, window files) and the
/// directories it created (`created`, from
/// [`crate::agent::run::RunPlan::directories_to_create`] before
/// the run) become `id`'s (its uid and primary gid), so that the user who
/// ran sudo can read and remove them. A symbolic link is given away, not
/// what it points to (`lchown`). A file that cannot be given away is left
/// as it is, with a warning; one already gone (pruned by `--max-profiles`
/// since it was written; a directory the run did not create after all) is
/// skipped.
pub fn give_outputs_to(id: &Identity, outputs: &[PathBuf], created: &[PathBuf]) {
    for path in outputs.iter().chain(created) {
        match std::os::unix::fs::lchown(path, Some(id.uid), Some(id.gid)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => tracing::warn!(
                "could not give {} to uid {} gid {}: {err}",
                path.display(),
                id.uid,
                id.gid
            ),
        }
    }
}
