//! The users bodies run as (`body.user`): looked up in the system's user database.

#![expect(unsafe_code, reason = "getpwnam_r(3) and geteuid(2)")]

use std::io;

/// A user that bodies cannot run as.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The name cannot be a user name (it holds a NUL byte).
    #[error("{name:?} is not a user name")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// The user database could not be read.
    #[error("cannot look up user {name:?}")]
    Lookup {
        /// The name as given.
        name: String,
        /// The error of getpwnam_r.
        #[source]
        source: io::Error,
    },
    /// There is no such user.
    #[error("there is no user named {name:?} on this machine")]
    NoSuchUser {
        /// The name as given.
        name: String,
    },
    /// The runtime is not root and the user is not the runtime's own.
    #[error(
        "body.user = {name:?} needs the runtime to run as root to switch to it (it runs as uid {euid})"
    )]
    NotRoot {
        /// The name as given.
        name: String,
        /// The runtime's effective uid.
        euid: u32,
    },
}

/// The uid and primary gid of the user `name` (from the system's user database).
pub fn user_ids(name: &str) -> Result<(u32, u32), UserError> {
    let c_name = std::ffi::CString::new(name).map_err(|_| UserError::BadName {
        name: name.to_owned(),
    })?;
    let mut entry: libc::passwd = unsafe_zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, `entry` and
    // `buf` live on this frame with their true sizes, and `found` is written by the call.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(UserError::Lookup {
            name: name.to_owned(),
            source: io::Error::from_raw_os_error(rc),
        });
    }
    if found.is_null() {
        return Err(UserError::NoSuchUser {
            name: name.to_owned(),
        });
    }
    Ok((entry.pw_uid, entry.pw_gid))
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: `passwd` is a C struct of integers and pointers, for which all-zero is valid
    // (null pointers); getpwnam_r fills it before it is read.
    unsafe { std::mem::zeroed() }
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The uid and gid bodies run as for `body.user = name`: the user must exist, and a runtime
/// that is not root can only "switch" to itself.
pub fn body_user(name: &str) -> Result<(u32, u32), UserError> {
    let (uid, gid) = user_ids(name)?;
    let me = euid();
    if me != 0 && me != uid {
        return Err(UserError::NotRoot {
            name: name.to_owned(),
            euid: me,
        });
    }
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message says what failed; the cause is only `source()` (perago_core's renderer
    /// prints `cannot look up user "body": denied`; executor's error_texts pins that).
    #[test]
    fn a_failed_lookup_leaves_its_cause_to_source() {
        let error = UserError::Lookup {
            name: "body".to_owned(),
            source: io::Error::other("denied"),
        };
        assert_eq!(error.to_string(), "cannot look up user \"body\"");
        let cause = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("denied"));
    }

    #[test]
    fn users_are_looked_up_by_name() {
        assert_eq!(user_ids("root").unwrap(), (0, 0));
        let missing = user_ids("no-such-user-perago").unwrap_err();
        assert!(
            matches!(missing, UserError::NoSuchUser { ref name } if name == "no-such-user-perago")
        );
        assert_eq!(
            missing.to_string(),
            "there is no user named \"no-such-user-perago\" on this machine"
        );
        assert!(matches!(user_ids("a\0b"), Err(UserError::BadName { .. })));
        if euid() != 0 {
            assert!(matches!(
                body_user("root"),
                Err(UserError::NotRoot { ref name, .. }) if name == "root"
            ));
        }
    }
}
