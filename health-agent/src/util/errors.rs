//! Formatting errors for logs: the message and every cause, as anyhow's
//! `{:#}` does at the binary edge.

use std::{error::Error, fmt::Write as _};

/// `outer: cause: root cause`.
#[must_use]
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let _ = write!(out, ": {e}");
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn joins_every_cause() {
        let e = Outer(std::io::Error::other("root"));
        assert_eq!(chain(&e), "outer: root");
    }
}
