//! What a failed probe is kept as in the history: its error's class
//! (`timeout`, `connect: refused`, `HTTP 503`, ...) without the per-address
//! details, numbered in a small bounded table of the prober's.

use std::{collections::HashMap, fmt};

use super::error::ProbeError;

/// Error classes a prober tells apart; past them, failures are `other`.
pub(super) const MAX_CLASSES: usize = 256;

/// What failed, without the per-address details: few enough values to be
/// kept as an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ErrorClass {
    Other,
    Timeout,
    Refused(&'static str),
    Unreachable(&'static str),
    Reset(&'static str),
    HttpStatus(u16),
    Io(&'static str),
    Protocol,
    OtherNode,
    Namespace,
    ReceiverStopped,
    NotSent,
}

impl From<&ProbeError> for ErrorClass {
    fn from(e: &ProbeError) -> Self {
        match e {
            ProbeError::Timeout { .. } => Self::Timeout,
            ProbeError::Refused { step, .. } => Self::Refused(step),
            ProbeError::Unreachable { step, .. } => Self::Unreachable(step),
            ProbeError::Reset { step, .. } => Self::Reset(step),
            ProbeError::HttpStatus(code) => Self::HttpStatus(*code),
            ProbeError::Io { step, .. } => Self::Io(step),
            ProbeError::Protocol(_) => Self::Protocol,
            ProbeError::OtherNode(_) => Self::OtherNode,
            ProbeError::Namespace(_) => Self::Namespace,
            ProbeError::ReceiverStopped => Self::ReceiverStopped,
            ProbeError::NotSent(_) => Self::NotSent,
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other => f.write_str("other"),
            Self::Timeout => f.write_str("timeout"),
            Self::Refused(step) => write!(f, "{step}: refused"),
            Self::Unreachable(step) => write!(f, "{step}: unreachable"),
            Self::Reset(step) => write!(f, "{step}: reset"),
            Self::HttpStatus(code) => write!(f, "HTTP {code}"),
            Self::Io(step) => write!(f, "{step}: error"),
            Self::Protocol => f.write_str("not HTTP"),
            Self::OtherNode => f.write_str("another node answered"),
            Self::Namespace => f.write_str("probe namespace"),
            Self::ReceiverStopped => f.write_str("ICMP receiver stopped"),
            Self::NotSent => f.write_str("not sent"),
        }
    }
}

/// The error classes seen, numbered in order of appearance (0: `other`).
#[derive(Debug, Clone)]
pub(super) struct ErrorClasses {
    pub(super) list: Vec<ErrorClass>,
    pub(super) index: HashMap<ErrorClass, u16>,
}

impl ErrorClasses {
    pub(super) fn new() -> Self {
        Self {
            list: vec![ErrorClass::Other],
            index: HashMap::from([(ErrorClass::Other, 0)]),
        }
    }

    pub(super) fn intern(&mut self, class: ErrorClass) -> u16 {
        if let Some(&i) = self.index.get(&class) {
            return i;
        }
        if self.list.len() >= MAX_CLASSES {
            return 0;
        }
        let i = u16::try_from(self.list.len()).unwrap_or(0);
        self.list.push(class);
        self.index.insert(class, i);
        i
    }

    pub(super) fn get(&self, i: u16) -> ErrorClass {
        self.list
            .get(usize::from(i))
            .copied()
            .unwrap_or(ErrorClass::Other)
    }
}
