//! The text the broker's errors with a cause render to, pinned (see `perago_core::errors`).

use perago_core::errors::chain;
use std::io;

#[test]
fn errors_render_as_before() {
    let socket = crate::BrokerError::Socket {
        path: "/run/b.sock".into(),
        source: io::Error::other("denied"),
    };
    assert_eq!(chain(&socket), "cannot serve on /run/b.sock: denied");
    let metrics = crate::BrokerError::Metrics {
        addr: "127.0.0.1:9".parse().unwrap(),
        source: io::Error::other("in use"),
    };
    assert_eq!(
        chain(&metrics),
        "cannot serve metrics on 127.0.0.1:9: in use"
    );
    let journal = crate::journal::JournalError::Open {
        path: "/j".into(),
        source: io::Error::other("denied"),
    };
    assert_eq!(
        chain(&journal),
        "cannot open the result journal folder /j: denied"
    );
}
