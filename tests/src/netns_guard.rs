//! A namespace removed when its guard is dropped (a panic included) until
//! it is handed to what removes it from then on ([`NetnsGuard::keep`]):
//! the steps between making a namespace and storing it in its owner can
//! fail without leaving it behind.

use health_agent::sys::netns::Netns;

/// Removes its namespace when dropped, unless kept.
#[derive(Debug)]
pub struct NetnsGuard(Option<Netns>);

impl NetnsGuard {
    /// Makes the namespace `name`.
    ///
    /// # Panics
    /// When it cannot be made, naming `what`.
    #[must_use]
    pub fn create(name: &str, what: &str) -> Self {
        Self(Some(
            Netns::create(name).unwrap_or_else(|e| panic!("{what} namespace {name}: {e}")),
        ))
    }

    /// Makes the namespace `name`, or says why it could not.
    ///
    /// # Errors
    /// The namespace could not be made.
    pub fn try_create(name: &str) -> Result<Self, health_agent::sys::netns::NetnsError> {
        Netns::create(name).map(|ns| Self(Some(ns)))
    }

    /// Guards the namespace `name`, made by someone else.
    #[must_use]
    pub fn named(name: &str) -> Self {
        Self(Netns::named(name).ok())
    }

    /// The namespace.
    #[must_use]
    pub fn ns(&self) -> &Netns {
        self.0.as_ref().expect("a namespace until kept")
    }

    /// The namespace, now its new owner's to remove.
    #[must_use]
    pub fn keep(mut self) -> Netns {
        self.0.take().expect("a namespace until kept")
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Some(ns) = self.0.take() {
            let _ = ns.delete();
        }
    }
}
