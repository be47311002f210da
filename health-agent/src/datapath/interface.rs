//! An interface a program attaches to, optionally in another namespace.

use std::{ffi::CString, fmt};

use super::DatapathError;
use crate::sys::netns::Netns;

/// An interface, optionally in another network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub netns: Option<Netns>,
}

impl Interface {
    #[must_use]
    pub fn new(name: impl Into<String>, netns: Option<Netns>) -> Self {
        Self {
            name: name.into(),
            netns,
        }
    }

    pub(super) fn c_name(&self) -> Result<CString, DatapathError> {
        CString::new(self.name.clone()).map_err(|_| DatapathError::BadInterfaceName {
            name: self.name.clone(),
        })
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.netns {
            Some(ns) => write!(f, "{} (netns {})", self.name, ns.path().display()),
            None => f.write_str(&self.name),
        }
    }
}
