//! systemd's readiness protocol (`sd_notify(3)`), for `Type=notify` units: `READY=1` once every
//! executor the runtime starts with is attached, `STATUS=` lines as slots go busy and idle,
//! `STOPPING=1` when a drain starts, and `WATCHDOG=1` pings while the broker answers.
//!
//! The protocol is one datagram per message on the Unix socket named by `NOTIFY_SOCKET` (a
//! path, or `@name` in the abstract namespace). Outside systemd the variable is unset and every
//! call does nothing. Children never see the variables: the broker, executors and bodies must
//! not speak for the service (see `children.rs`, which removes [`VARIABLES`]).

use perago_proto::admin::v1 as admin;
use std::{
    io,
    os::unix::net::{SocketAddr, UnixDatagram},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

/// The variables systemd sets for the notify protocol; none reaches a child.
pub(crate) const VARIABLES: [&str; 3] = perago_core::env::SYSTEMD_NOTIFY_VARS;

/// Where systemd listens, and how often it wants a watchdog ping.
#[derive(Debug)]
pub(crate) struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    watchdog: Option<Duration>,
    ready: bool,
    last_status: String,
}

/// The socket address `NOTIFY_SOCKET` names: a path, or `@name` for the abstract namespace.
fn address(value: &str) -> io::Result<SocketAddr> {
    match value.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            SocketAddr::from_abstract_name(name.as_bytes())
        }
        None if value.starts_with('/') => SocketAddr::from_pathname(value),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET must be an absolute path or start with @",
        )),
    }
}

/// Half of `WATCHDOG_USEC` (systemd's advice: ping at least twice per period), when the
/// watchdog is on and meant for this process (`WATCHDOG_PID`, when set, is our pid).
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

/// The `STATUS=` text for a broker status: how many executors are busy and idle.
pub(crate) fn status_text(status: &admin::StatusResponse) -> String {
    let count = |state: admin::SlotState| {
        status
            .slots
            .iter()
            .filter(|s| s.state == state as i32)
            .count()
    };
    let (busy, idle) = (count(admin::SlotState::Busy), count(admin::SlotState::Idle));
    let task = &status.task_name;
    if status.draining {
        format!("{task}: draining, {busy} busy")
    } else if status.paused {
        format!("{task}: paused, {busy} busy, {idle} idle")
    } else {
        format!("{task}: {busy} busy, {idle} idle")
    }
}

/// Whether every one of the first `wanted` slots has an executor attached.
pub(crate) fn all_attached(status: &admin::StatusResponse, wanted: u32) -> bool {
    let attached = status
        .slots
        .iter()
        .filter(|s| {
            s.slot <= wanted
                && [admin::SlotState::Idle, admin::SlotState::Busy]
                    .iter()
                    .any(|state| s.state == *state as i32)
        })
        .count();
    attached >= wanted as usize
}

impl Notifier {
    /// The notifier `lookup` (the process environment) describes; `None` outside systemd or
    /// when the socket cannot be used (logged).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let path = lookup("NOTIFY_SOCKET").filter(|p| !p.is_empty())?;
        let opened = address(&path).and_then(|addr| Ok((UnixDatagram::unbound()?, addr)));
        match opened {
            Ok((socket, addr)) => Some(Self {
                socket,
                addr,
                watchdog: watchdog_interval(
                    lookup("WATCHDOG_USEC").as_deref(),
                    lookup("WATCHDOG_PID").as_deref(),
                    std::process::id(),
                ),
                ready: false,
                last_status: String::new(),
            }),
            Err(e) => {
                tracing::warn!(notify_socket = %path, error = %perago_core::errors::DisplayChain(&e), "cannot use NOTIFY_SOCKET; systemd will not hear of readiness");
                None
            }
        }
    }

    /// How often to send `WATCHDOG=1`, when systemd asked for it.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Whether `READY=1` was sent.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready
    }

    fn send(&self, message: &str) {
        if let Err(e) = self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "cannot notify systemd");
        }
    }

    /// `READY=1` with the status: every executor of the start is attached.
    pub(crate) fn ready(&mut self, status: String) {
        if self.ready {
            return;
        }
        self.ready = true;
        self.send(&format!("READY=1\nSTATUS={status}"));
        self.last_status = status;
    }

    /// A `STATUS=` line, when it says something new.
    pub(crate) fn status(&mut self, status: String) {
        if status != self.last_status {
            self.send(&format!("STATUS={status}"));
            self.last_status = status;
        }
    }

    /// `STOPPING=1`: a drain started.
    pub(crate) fn stopping(&mut self, why: &str) {
        let status = format!("draining ({why})");
        self.send(&format!("STOPPING=1\nSTATUS={status}"));
        self.last_status = status;
    }

    /// `WATCHDOG=1`.
    pub(crate) fn ping(&self) {
        self.send("WATCHDOG=1");
    }
}

/// One supervisor's [`Notifier`], shared by its runtimes (one per task type): systemd hears
/// `READY=1` once every runtime is ready, one `STATUS=` line joining theirs, `STOPPING=1` at
/// the first drain, and `WATCHDOG=1` only once every runtime still running has vouched for
/// its broker since the last ping. A runtime that ended no longer holds the others back.
#[derive(Debug)]
pub(crate) struct NotifyHandle {
    hub: Arc<Mutex<Hub>>,
    index: usize,
}

#[derive(Debug)]
struct Hub {
    notifier: Notifier,
    parts: Vec<Part>,
    stopping: bool,
}

#[derive(Debug, Default)]
struct Part {
    ready: bool,
    status: String,
    pinged: bool,
    done: bool,
}

impl Hub {
    fn combined_status(&self) -> String {
        self.parts
            .iter()
            .filter(|p| !p.status.is_empty())
            .map(|p| p.status.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn check_ready(&mut self) {
        if !self.notifier.is_ready() && self.parts.iter().all(|p| p.ready || p.done) {
            let status = self.combined_status();
            self.notifier.ready(status);
        }
    }

    fn check_ping(&mut self) {
        if self.parts.iter().all(|p| p.pinged || p.done) {
            self.notifier.ping();
            for part in &mut self.parts {
                part.pinged = false;
            }
        }
    }
}

/// A handle per runtime on the notifier systemd gave (`None` outside systemd).
pub(crate) fn shared(notifier: Option<Notifier>, runtimes: usize) -> Vec<Option<NotifyHandle>> {
    match notifier {
        None => (0..runtimes).map(|_| None).collect(),
        Some(notifier) => {
            let hub = Arc::new(Mutex::new(Hub {
                notifier,
                parts: (0..runtimes).map(|_| Part::default()).collect(),
                stopping: false,
            }));
            (0..runtimes)
                .map(|index| {
                    Some(NotifyHandle {
                        hub: Arc::clone(&hub),
                        index,
                    })
                })
                .collect()
        }
    }
}

impl NotifyHandle {
    fn with<T>(&self, f: impl FnOnce(&mut Hub) -> T) -> T {
        let mut hub = self.hub.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut hub)
    }

    /// How often to vouch for this runtime, when systemd asked for a watchdog.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.with(|hub| hub.notifier.watchdog_interval())
    }

    /// Whether this runtime said it is ready.
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        self.with(|hub| hub.parts[self.index].ready)
    }

    /// This runtime is ready (every executor of its start attached), with its status.
    pub(crate) fn ready(&self, status: String) {
        self.with(|hub| {
            let part = &mut hub.parts[self.index];
            part.ready = true;
            part.status = status;
            hub.check_ready();
        });
    }

    /// This runtime's status line changed.
    pub(crate) fn status(&self, status: String) {
        self.with(|hub| {
            hub.parts[self.index].status = status;
            if hub.notifier.is_ready() {
                let status = hub.combined_status();
                hub.notifier.status(status);
            }
        });
    }

    /// A drain started here: `STOPPING=1`, the first time any runtime says so.
    pub(crate) fn stopping(&self, why: &str) {
        self.with(|hub| {
            if !hub.stopping {
                hub.stopping = true;
                hub.notifier.stopping(why);
            }
        });
    }

    /// This runtime's broker answers: `WATCHDOG=1` once every runtime still running said so.
    pub(crate) fn ping(&self) {
        self.with(|hub| {
            hub.parts[self.index].pinged = true;
            hub.check_ping();
        });
    }
}

impl Drop for NotifyHandle {
    /// The runtime ended: it holds neither readiness nor the watchdog back any more.
    fn drop(&mut self) {
        self.with(|hub| {
            hub.parts[self.index].done = true;
            if !hub.stopping {
                hub.check_ready();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(n: u32, state: admin::SlotState) -> admin::SlotStatus {
        admin::SlotStatus {
            slot: n,
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn the_watchdog_is_half_the_period_and_only_for_this_process() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    }

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert!(address("/run/systemd/notify").is_ok());
        assert!(address("@perago-test").is_ok());
        assert!(address("relative/notify").is_err());
    }

    #[test]
    fn ready_means_every_starting_slot_attached() {
        use admin::SlotState::{Busy, Idle, Retired, Waiting};
        let status = |slots| admin::StatusResponse {
            slots,
            ..Default::default()
        };
        assert!(all_attached(&status(vec![slot(1, Idle), slot(2, Busy)]), 2));
        assert!(!all_attached(
            &status(vec![slot(1, Idle), slot(2, Waiting)]),
            2
        ));
        // `-j 1..3`: only the minimum starts; the others are not waited for.
        assert!(all_attached(
            &status(vec![slot(1, Busy), slot(2, Retired), slot(3, Retired)]),
            1
        ));
    }

    #[test]
    fn status_counts_busy_and_idle_slots() {
        use admin::SlotState::{Busy, Idle};
        let mut status = admin::StatusResponse {
            task_name: "t".into(),
            slots: vec![slot(1, Busy), slot(2, Idle), slot(3, Idle)],
            ..Default::default()
        };
        assert_eq!(status_text(&status), "t: 1 busy, 2 idle");
        status.draining = true;
        assert_eq!(status_text(&status), "t: draining, 1 busy");
    }

    #[test]
    fn status_says_paused() {
        use admin::SlotState::{Busy, Idle};
        let status = admin::StatusResponse {
            task_name: "t".into(),
            slots: vec![slot(1, Busy), slot(2, Idle)],
            paused: true,
            ..Default::default()
        };
        assert_eq!(status_text(&status), "t: paused, 1 busy, 1 idle");
    }

    #[test]
    fn messages_reach_the_socket_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let path_text = path.display().to_string();
        let mut notifier = Notifier::from_lookup(|name| match name {
            "NOTIFY_SOCKET" => Some(path_text.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!(notifier.watchdog_interval(), None);
        notifier.ready("t: 0 busy, 1 idle".into());
        notifier.ready("again".into());
        notifier.status("t: 0 busy, 1 idle".into());
        notifier.status("t: 1 busy, 0 idle".into());
        notifier.stopping("SIGTERM");
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = listener.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(
            got,
            [
                "READY=1\nSTATUS=t: 0 busy, 1 idle",
                "STATUS=t: 1 busy, 0 idle",
                "STOPPING=1\nSTATUS=draining (SIGTERM)",
            ]
        );
        assert!(Notifier::from_lookup(|_| None).is_none());
    }

    #[test]
    fn several_runtimes_are_ready_together_and_the_watchdog_waits_for_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let path_text = path.display().to_string();
        let notifier = Notifier::from_lookup(|name| match name {
            "NOTIFY_SOCKET" => Some(path_text.clone()),
            "WATCHDOG_USEC" => Some("2000000".to_owned()),
            _ => None,
        });
        let mut handles = shared(notifier, 3).into_iter().map(Option::unwrap);
        let (a, b, c) = (
            handles.next().unwrap(),
            handles.next().unwrap(),
            handles.next().unwrap(),
        );
        let received = || {
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while let Ok(n) = listener.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            got
        };
        a.ready("a: 0 busy, 2 idle".into());
        b.ready("b: 0 busy, 1 idle".into());
        a.status("a: 1 busy, 1 idle".into());
        assert!(a.is_ready() && !c.is_ready());
        assert_eq!(received(), Vec::<String>::new(), "c is not ready yet");
        c.ready("c: 0 busy, 1 idle".into());
        a.status("a: 0 busy, 2 idle".into());
        // Pings: only once every runtime vouched; one that ended does not hold it back.
        a.ping();
        b.ping();
        c.ping();
        a.ping();
        drop(b);
        c.ping();
        a.stopping("SIGTERM");
        c.stopping("SIGTERM");
        assert_eq!(
            received(),
            [
                "READY=1\nSTATUS=a: 1 busy, 1 idle; b: 0 busy, 1 idle; c: 0 busy, 1 idle",
                "STATUS=a: 0 busy, 2 idle; b: 0 busy, 1 idle; c: 0 busy, 1 idle",
                "WATCHDOG=1",
                "WATCHDOG=1",
                "STOPPING=1\nSTATUS=draining (SIGTERM)",
            ]
        );
        assert!(shared(None, 2).iter().all(Option::is_none));
    }
}
