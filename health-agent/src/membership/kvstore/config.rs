//! How to reach etcd: its members' client endpoints and the key prefix, TLS (a CA, and a
//! client certificate for etcd's `--client-cert-auth`) and a user with its
//! password, each file checked when it is loaded and named by its flag.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// How to reach etcd, and the node records' place in it.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `host:port` of each member's client URL (`https` when `tls` is
    /// set): the client balances over them and uses those that answer.
    pub endpoints: Vec<String>,
    /// The key prefix under which nodes register.
    pub prefix: String,
    /// TTL of this agent's lease (kept alive while the agent runs).
    pub lease_ttl: Duration,
    /// Talk TLS to etcd.
    pub tls: Option<TlsConfig>,
    /// Authenticate as an etcd user.
    pub credentials: Option<Credentials>,
    /// Where the lease's ID is kept between runs (in the state directory):
    /// an agent restarted after a crash takes its lease over once etcd
    /// confirms it this node's (see [`LeaseFile`]), instead of leaving it
    /// to expire.
    pub lease_file: Option<LeaseFile>,
    /// Where the admin's health allocations are, when a peer's health
    /// addresses must lie in its node's (`--kvstore-allocations`; see
    /// [`crate::membership::allocations`]).
    pub allocations: Option<String>,
}

/// The directory `leaf` beside the node records' prefix, ending in `/`:
/// `/health/nodes/` and `summaries` give `/health/summaries/`; a prefix of
/// one segment, `nodes/`, gives `nodes-summaries/`.
#[must_use]
pub fn beside(node_prefix: &str, leaf: &str) -> String {
    let trimmed = node_prefix.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, _)) => format!("{parent}/{leaf}/"),
        None => format!("{trimmed}-{leaf}/"),
    }
}

/// The file that keeps this agent's lease ID between runs, and the keys
/// that make a lease this node's: a lease it names is taken over only
/// when etcd says it holds keys and nothing but these (a state directory
/// copied with a machine's image names another node's lease).
#[derive(Debug, Clone)]
pub struct LeaseFile {
    /// The file, in the state directory.
    pub path: PathBuf,
    /// Every key this agent writes under its lease.
    pub own_keys: Vec<Vec<u8>>,
}

impl EtcdConfig {
    /// The client URLs: `http://host:port`, or `https://` with TLS.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// The endpoints as one text, comma-separated (as the flag takes them).
    #[must_use]
    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }
}

/// Checks one `--kvstore-endpoint` value: `host:port` (an IPv4 address, a
/// bracketed IPv6 address or a DNS name, and a port from 1 to 65535),
/// without a scheme; the error names the value.
///
/// # Errors
/// The value and what is wrong with it.
pub fn parse_endpoint(s: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("{s:?} is not a HOST:PORT etcd endpoint: {why}"));
    let e = s.trim();
    if e.is_empty() {
        return bad("it is empty (endpoints are separated by single commas)");
    }
    if e.contains("://") {
        return bad("give it without a scheme (https follows --kvstore-ca)");
    }
    let Some((host, port)) = e.rsplit_once(':') else {
        return bad("no port");
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return bad("the port is not a number from 1 to 65535"),
    }
    if let Some(inner) = host.strip_prefix('[') {
        let Some(v6) = inner.strip_suffix(']') else {
            return bad("an IPv6 address needs its closing bracket");
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("not an IPv6 address in the brackets");
        }
    } else if host.contains(':') {
        return bad("an IPv6 address goes in brackets: [2001:2::1]:2379");
    } else if host.parse::<std::net::Ipv4Addr>().is_err() && !is_dns_name(host) {
        return bad("the host is neither an address nor a DNS name");
    }
    Ok(e.to_owned())
}

/// Letters, digits, `-` and `.`, in labels of 1 to 63 characters.
fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// A configuration file that cannot be used, named with its flag (the
/// config file's key is the flag's name without the dashes).
#[derive(Debug, thiserror::Error)]
pub enum KvConfigError {
    #[error("{flag} {}: cannot read it", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {}: {detail}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, KvConfigError> {
    std::fs::read(path).map_err(|source| KvConfigError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// TLS toward etcd: the CA that signed etcd's server certificate and,
/// for etcd's `--client-cert-auth`, this agent's certificate and key (all
/// PEM, checked when loaded; the handshake checks the rest).
#[derive(Clone)]
pub struct TlsConfig(Arc<TlsFiles>);

struct TlsFiles {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    ca_path: PathBuf,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &self.0.ca_path)
            .field("client_certificate", &self.0.identity.is_some())
            .finish()
    }
}

impl TlsConfig {
    pub const CA_FLAG: &'static str = "--kvstore-ca";
    pub const CERT_FLAG: &'static str = "--kvstore-cert";
    pub const KEY_FLAG: &'static str = "--kvstore-key";

    /// Reads the CA file and, when given, the client certificate and key.
    pub fn load(ca: &Path, cert_and_key: Option<(&Path, &Path)>) -> Result<Self, KvConfigError> {
        let ca_pem = read_file(Self::CA_FLAG, ca)?;
        certificates(Self::CA_FLAG, ca, &ca_pem)?;
        let identity = match cert_and_key {
            None => None,
            Some((cert, key)) => {
                let cert_pem = read_file(Self::CERT_FLAG, cert)?;
                certificates(Self::CERT_FLAG, cert, &cert_pem)?;
                let key_pem = read_file(Self::KEY_FLAG, key)?;
                PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| KvConfigError::Invalid {
                    flag: Self::KEY_FLAG,
                    path: key.to_owned(),
                    detail: match e {
                        rustls_pki_types::pem::Error::NoItemsFound => {
                            "no PEM private key in it (PKCS#8, PKCS#1 or SEC1)".into()
                        }
                        other => format!("not a PEM private key: {other}"),
                    },
                })?;
                Some((cert_pem, key_pem))
            }
        };
        Ok(Self(Arc::new(TlsFiles {
            ca: ca_pem,
            identity,
            ca_path: ca.to_owned(),
        })))
    }

    pub(super) fn options(&self) -> TlsOptions {
        let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.0.ca));
        match &self.0.identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        }
    }
}

/// Checks that `pem` holds at least one certificate and nothing broken.
fn certificates(flag: &'static str, path: &Path, pem: &[u8]) -> Result<(), KvConfigError> {
    let invalid = |detail: String| KvConfigError::Invalid {
        flag,
        path: path.to_owned(),
        detail,
    };
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(invalid("no PEM certificate in it".into()));
    }
    Ok(())
}

/// An etcd user and its password (read from a file, never the command
/// line; never printed).
#[derive(Clone)]
pub struct Credentials(Arc<UserPassword>);

struct UserPassword {
    user: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.0.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    pub const PASSWORD_FLAG: &'static str = "--kvstore-password-file";

    /// `user`, with the password in `password_file`: its content without
    /// the final line break.
    pub fn load(user: &str, password_file: &Path) -> Result<Self, KvConfigError> {
        let bytes = read_file(Self::PASSWORD_FLAG, password_file)?;
        let invalid = |detail: &str| KvConfigError::Invalid {
            flag: Self::PASSWORD_FLAG,
            path: password_file.to_owned(),
            detail: detail.into(),
        };
        let text = String::from_utf8(bytes).map_err(|_| invalid("the password is not UTF-8"))?;
        let password = text
            .strip_suffix('\n')
            .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
        if password.is_empty() {
            return Err(invalid("the file is empty (it holds the password)"));
        }
        Ok(Self(Arc::new(UserPassword {
            user: user.to_owned(),
            password: password.to_owned(),
        })))
    }

    /// The user's name.
    #[must_use]
    pub fn user(&self) -> &str {
        &self.0.user
    }

    /// The user and password, for etcd's authentication.
    pub(super) fn user_password(&self) -> (String, String) {
        (self.0.user.clone(), self.0.password.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of files for one test, removed after it.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("kvstore-test-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }

        fn file(&self, name: &str, content: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, content).expect("write");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn passwords_lose_their_final_line_break_only() {
        let dir = Scratch::new("passwords");
        for (content, want) in [
            (&b"s3cret\n"[..], "s3cret"),
            (b"s3cret\r\n", "s3cret"),
            (b"s3cret", "s3cret"),
            (b" two words \n\n", " two words \n"),
        ] {
            let c = Credentials::load("root", &dir.file("pw", content)).expect("loads");
            assert_eq!(c.0.password, want);
            assert!(!format!("{c:?}").contains("s3cret"), "never printed");
        }
        let err = Credentials::load("root", &dir.file("empty", b"\n")).expect_err("empty");
        assert!(
            err.to_string().starts_with("--kvstore-password-file /")
                && err
                    .to_string()
                    .ends_with("the file is empty (it holds the password)"),
            "{err}"
        );
        let err = Credentials::load("root", Path::new("/nonexistent/pw")).expect_err("missing");
        assert_eq!(
            err.to_string(),
            "--kvstore-password-file /nonexistent/pw: cannot read it"
        );
    }

    #[test]
    fn tls_files_are_checked_naming_the_flag() {
        let dir = Scratch::new("tls");
        let missing = TlsConfig::load(Path::new("/nonexistent/ca.pem"), None).expect_err("missing");
        assert_eq!(
            missing.to_string(),
            "--kvstore-ca /nonexistent/ca.pem: cannot read it"
        );
        let junk = dir.file("junk.pem", b"hello\n");
        let err = TlsConfig::load(&junk, None).expect_err("junk");
        assert!(
            err.to_string()
                .ends_with("junk.pem: no PEM certificate in it"),
            "{err}"
        );
        let broken = dir.file(
            "broken.pem",
            b"-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
        );
        let err = TlsConfig::load(&broken, None).expect_err("broken");
        assert!(err.to_string().contains("not a PEM certificate"), "{err}");
        // A syntactically fine PEM certificate; the key file is not a key.
        let cert = dir.file(
            "cert.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let err = TlsConfig::load(&cert, Some((&cert, &cert))).expect_err("no key");
        assert!(
            err.to_string().starts_with("--kvstore-key ")
                && err.to_string().contains("no PEM private key in it"),
            "{err}"
        );
        let key = dir.file(
            "key.pem",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        );
        let tls = TlsConfig::load(&cert, Some((&cert, &key))).expect("loads");
        assert!(format!("{tls:?}").contains("client_certificate: true"));
    }

    #[test]
    fn the_url_scheme_follows_tls() {
        let dir = Scratch::new("url");
        let mut cfg = EtcdConfig {
            endpoints: vec!["198.18.0.1:2379".into(), "198.18.0.2:2379".into()],
            prefix: "/h/".into(),
            lease_ttl: Duration::from_secs(10),
            allocations: None,
            tls: None,
            credentials: None,
            lease_file: None,
        };
        assert_eq!(
            cfg.urls(),
            ["http://198.18.0.1:2379", "http://198.18.0.2:2379"]
        );
        assert_eq!(cfg.endpoints_text(), "198.18.0.1:2379,198.18.0.2:2379");
        let cert = dir.file(
            "url-ca.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        cfg.tls = Some(TlsConfig::load(&cert, None).expect("loads"));
        assert_eq!(cfg.urls()[1], "https://198.18.0.2:2379");
    }

    #[test]
    fn endpoints_are_host_and_port_and_a_bad_one_is_named() {
        for good in [
            "198.18.0.1:2379",
            "[2001:2::1]:2379",
            "etcd-0.etcd.example:2379",
            "localhost:1",
        ] {
            assert_eq!(parse_endpoint(good).as_deref(), Ok(good));
        }
        for (bad, why) in [
            ("", "empty"),
            ("http://198.18.0.1:2379", "without a scheme"),
            ("198.18.0.1", "no port"),
            ("198.18.0.1:0", "the port"),
            ("198.18.0.1:70000", "the port"),
            ("198.18.0.1:x", "the port"),
            ("2001:2::1:2379", "in brackets"),
            ("[2001:2::1:2379", "closing bracket"),
            ("[not-v6]:2379", "IPv6 address in the brackets"),
            ("bad_host:2379", "neither an address nor a DNS name"),
            (":2379", "neither"),
        ] {
            let err = parse_endpoint(bad).expect_err(bad);
            assert!(
                err.starts_with(&format!("{bad:?} is not a HOST:PORT etcd endpoint"))
                    && err.contains(why),
                "{bad}: {err}"
            );
        }
    }
}
