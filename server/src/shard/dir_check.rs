//! The data-directory check: before the store opens, the directory must exist or be
//! creatable, be writable, and have room, and each failure says which and why.

use std::path::Path;

use crate::error::{Error, Result};

/// Checks the data directory can be used: it exists or can be created, is writable, and
/// its file system has at least `min_free` bytes free. Errors say which and why.
pub fn check_data_dir(path: &Path, min_free: u64) -> Result<()> {
    let fail = |reason: String| Error::DataDir { path: path.display().to_string(), reason };
    if path.exists() && !path.is_dir() {
        return Err(fail("exists and is not a directory".into()));
    }
    std::fs::create_dir_all(path).map_err(|e| fail(format!("cannot be created: {e}")))?;
    let probe = path.join(".write-probe");
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&probe)?;
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| fail(format!("is not writable: {e}")))?;
    let free = free_bytes(path).map_err(|e| fail(format!("cannot read free space: {e}")))?;
    if free < min_free {
        return Err(fail(format!(
            "its file system is full: {free} bytes free, at least {min_free} needed \
             (set min_free_bytes to change the limit)"
        )));
    }
    Ok(())
}

/// Bytes available to unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path contains a NUL byte"))?;
    // SAFETY: `statvfs` is a C struct of integers (and padding), for which all-zero bytes
    // are a valid value; the call below overwrites it.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call, and `s` a writable
    // statvfs the call may fill; neither is kept by libc after it returns.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}
