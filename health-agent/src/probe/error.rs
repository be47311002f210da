//! Why a probe failed. Rendered as the text `status` shows (and the API
//! keeps in `last_error`), but kept as a value so callers can tell a
//! timeout from a refusal without reading strings.

use std::{fmt, io, time::Duration};

/// What failed in a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// No answer within the probe timeout.
    Timeout { proto: Proto, after: Duration },
    /// The TCP connection was refused (RST to the SYN).
    Refused { step: &'static str, error: Box<str> },
    /// No route, host or network unreachable (an ICMP error or the local
    /// routing table).
    Unreachable { step: &'static str, error: Box<str> },
    /// The connection was reset after it was established.
    Reset { step: &'static str, error: Box<str> },
    /// The peer answered HTTP with a status that is not 2xx or 3xx.
    HttpStatus(u16),
    /// Any other error of a step of the exchange (`connect`, `send`,
    /// `receive`, `socket`, ...), with the OS error's text.
    Io { step: &'static str, error: Box<str> },
    /// The peer's answer is not HTTP.
    Protocol(Box<str>),
    /// The hello server that answered names another node than the one
    /// the address is of (its name, as the answer gave it, cut short): the
    /// address leads to the wrong node.
    OtherNode(Box<str>),
    /// The probe could not be sent from the probe namespace.
    Namespace(Box<str>),
    /// The agent's own ICMP receiver is gone.
    ReceiverStopped,
    /// The probe was not sent, and why (an MTU probe whose small echo went
    /// unanswered).
    NotSent(&'static str),
}

/// The protocol of a probe, for timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Icmp,
    Http,
}

impl ProbeError {
    /// Classifies an I/O error of `step`.
    #[must_use]
    pub fn io(step: &'static str, e: &io::Error) -> Self {
        let error = e.to_string().into_boxed_str();
        match e.kind() {
            io::ErrorKind::ConnectionRefused => Self::Refused { step, error },
            io::ErrorKind::ConnectionReset => Self::Reset { step, error },
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                Self::Unreachable { step, error }
            }
            _ => Self::Io { step, error },
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout {
                proto: Proto::Icmp,
                after,
            } => write!(f, "no echo reply within {} ms", after.as_millis()),
            Self::Timeout {
                proto: Proto::Http,
                after,
            } => write!(f, "no HTTP answer within {} ms", after.as_millis()),
            Self::HttpStatus(code) => write!(f, "HTTP {code}"),
            Self::Refused { step, error }
            | Self::Reset { step, error }
            | Self::Unreachable { step, error }
            | Self::Io { step, error } => write!(f, "{step}: {error}"),
            Self::Protocol(what) | Self::Namespace(what) => f.write_str(what),
            Self::OtherNode(name) => write!(f, "answered by node {name:?}, not the node probed"),
            Self::ReceiverStopped => f.write_str("ICMP receiver stopped"),
            Self::NotSent(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ProbeError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_texts_status_has_always_shown() {
        let cases = [
            (
                ProbeError::Timeout {
                    proto: Proto::Icmp,
                    after: Duration::from_secs(1),
                },
                "no echo reply within 1000 ms",
            ),
            (
                ProbeError::Timeout {
                    proto: Proto::Http,
                    after: Duration::from_millis(250),
                },
                "no HTTP answer within 250 ms",
            ),
            (ProbeError::HttpStatus(503), "HTTP 503"),
            (
                ProbeError::OtherNode("node-7".into()),
                "answered by node \"node-7\", not the node probed",
            ),
            (
                ProbeError::io("connect", &io::Error::from_raw_os_error(libc::ECONNREFUSED)),
                "connect: Connection refused (os error 111)",
            ),
            (
                ProbeError::io("connect", &io::Error::from_raw_os_error(libc::EHOSTUNREACH)),
                "connect: No route to host (os error 113)",
            ),
            (
                ProbeError::io("send", &io::Error::from_raw_os_error(libc::EPIPE)),
                "send: Broken pipe (os error 32)",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text, "{err:?}");
        }
    }

    #[test]
    fn io_errors_are_classified() {
        let e = io::Error::from_raw_os_error;
        assert!(matches!(
            ProbeError::io("connect", &e(libc::ECONNREFUSED)),
            ProbeError::Refused {
                step: "connect",
                ..
            }
        ));
        assert!(matches!(
            ProbeError::io("receive", &e(libc::ECONNRESET)),
            ProbeError::Reset {
                step: "receive",
                ..
            }
        ));
        assert!(matches!(
            ProbeError::io("connect", &e(libc::ENETUNREACH)),
            ProbeError::Unreachable { .. }
        ));
    }
}
