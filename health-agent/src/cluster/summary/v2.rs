//! Format versions 2 and 1: the hand-written binary form that agents one
//! version older write (the parent module's documentation describes it).
//! Read during a rolling upgrade; written for the tests and the format's
//! benchmark.

use super::{
    At, MAX_NAME_LEN, MAX_PEERS, MAX_RTT_US, Summary, SummaryError, VERSION_2, peers::PeerReader,
};

/// Version 2 of `s`.
pub(super) fn encode(s: &Summary) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + s.observer.len() + s.peers.len() * 24);
    out.push(VERSION_2);
    // Names are checked at construction: 1 to MAX_NAME_LEN (253) bytes,
    // so every length, prefix and suffix fits a u8.
    out.push(s.observer.len() as u8);
    out.extend_from_slice(s.observer.as_bytes());
    put_varint(&mut out, s.seq);
    put_varint(&mut out, s.at_ms);
    put_varint(&mut out, s.peers.len() as u64);
    let mut previous: &[u8] = &[];
    for p in &s.peers {
        let name = p.name.as_bytes();
        let (prefix, suffix) = super::peers::name_coding(previous, name);
        let middle = &name[prefix..name.len() - suffix];
        out.extend_from_slice(&[prefix as u8, suffix as u8, middle.len() as u8]);
        out.extend_from_slice(middle);
        out.push(p.state_bits());
        for path in &p.paths() {
            if path.code() == 1 {
                put_varint(&mut out, path.rtt_us.map_or(0, |us| u64::from(us) + 1));
            }
        }
        previous = name;
    }
    out
}

/// Reads a value of format `version` (2 or 1, its first byte).
pub(super) fn decode(version: u8, bytes: &[u8]) -> Result<Summary, SummaryError> {
    let mut r = Reader { bytes, at: 1 };
    let observer = r.name()?;
    let seq = r.varint("seq")?;
    let at_ms = r.varint("at_ms")?;
    let count = r.varint("peer count")?;
    if count > MAX_PEERS as u64 {
        return Err(SummaryError::TooManyPeers { count });
    }
    // Each peer takes at least 4 bytes: no allocation beyond the input.
    let count = usize::try_from(count).unwrap_or(MAX_PEERS);
    let mut peers = PeerReader::new(version, count.min(r.remaining() / 4));
    for _ in 0..count {
        let at = At::Byte(r.at);
        let (prefix, suffix, middle) = (
            r.u8("a name prefix")?,
            r.u8("a name suffix")?,
            r.u8("a name length")?,
        );
        let (prefix, suffix, middle) = (
            usize::from(prefix),
            usize::from(suffix),
            usize::from(middle),
        );
        peers.check_coding(at, prefix, suffix, middle)?;
        let middle = r.take(middle, "a name")?;
        let name = peers.name(at, prefix, suffix, middle)?;
        let states_at = At::Byte(r.at);
        let paths = peers.paths(states_at, r.u8("the path states")?)?;
        peers.push(name, paths, || {
            let rtt_at = r.at;
            match r.varint("an RTT")? {
                0 => Ok(None),
                v if v - 1 <= u64::from(MAX_RTT_US) => Ok(u32::try_from(v - 1).ok()),
                value => Err(SummaryError::Rtt { at: rtt_at, value }),
            }
        })?;
    }
    if r.remaining() > 0 {
        return Err(SummaryError::Trailing {
            extra: r.remaining(),
        });
    }
    Ok(Summary {
        observer,
        seq,
        at_ms,
        cadence_ms: 0,
        peers: peers.peers.into_boxed_slice(),
    })
}

/// LEB128: 7 bits a byte, the lowest first.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A cursor over a value's bytes: every read checked, errors naming the
/// byte.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SummaryError> {
        let bytes = self
            .bytes
            .get(self.at..self.at.saturating_add(n))
            .ok_or(SummaryError::Truncated { at: self.at, what })?;
        self.at += n;
        Ok(bytes)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, SummaryError> {
        Ok(self.take(1, what)?[0])
    }

    pub(super) fn varint(&mut self, what: &'static str) -> Result<u64, SummaryError> {
        let start = self.at;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8(what)?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(SummaryError::Varint { at: start, what });
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(SummaryError::Varint { at: start, what })
    }

    fn name(&mut self) -> Result<String, SummaryError> {
        let at = self.at;
        let len = usize::from(self.u8("the observer name's length")?);
        if len == 0 || len > MAX_NAME_LEN {
            return Err(SummaryError::BadNameLength {
                at: At::Byte(at),
                what: "observer",
                len,
            });
        }
        let bytes = self.take(len, "the observer name")?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| SummaryError::NameUtf8 {
                at: At::Byte(at),
                what: "observer",
            })
    }
}
