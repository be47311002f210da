//! What every version's reader checks of each peer as it comes (the name's
//! coding against the previous name, its length, UTF-8, the order, the
//! state codes), and how a name is written against the previous one.

use super::{
    At, MAX_NAME_LEN, PathSample, PeerName, PeerSummary, ProbeResult, SummaryError, VERSION_1,
};

/// How a name is written against the previous one: the bytes it shares
/// with it at the start (`prefix`) and, of the rest, at the end
/// (`suffix`). Its middle is `name[prefix..name.len() - suffix]`.
pub(super) fn name_coding(previous: &[u8], name: &[u8]) -> (usize, usize) {
    let prefix = previous
        .iter()
        .zip(name)
        .take_while(|(x, y)| x == y)
        .count();
    let room = previous.len().min(name.len()) - prefix;
    let suffix = previous
        .iter()
        .rev()
        .zip(name.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
        .min(room);
    (prefix, suffix)
}

/// The peers of a summary being read, checked one by one as they come:
/// the same checks for every format version.
pub(super) struct PeerReader {
    version: u8,
    pub(super) peers: Vec<PeerSummary>,
    buf: Vec<u8>,
}

impl PeerReader {
    pub(super) fn new(version: u8, capacity: usize) -> Self {
        Self {
            version,
            peers: Vec::with_capacity(capacity),
            buf: Vec::with_capacity(MAX_NAME_LEN),
        }
    }

    /// Whether a name of `prefix` + `middle` + `suffix` bytes can follow
    /// the previous one: checked before the middle is read.
    pub(super) fn check_coding(
        &self,
        at: At,
        prefix: usize,
        suffix: usize,
        middle: usize,
    ) -> Result<(), SummaryError> {
        let previous = self.peers.last().map_or(0, |p| p.name.len());
        if prefix.saturating_add(suffix) > previous {
            return Err(SummaryError::NameCoding {
                at,
                prefix,
                suffix,
                previous,
            });
        }
        let len = prefix.saturating_add(middle).saturating_add(suffix);
        if len == 0 || len > MAX_NAME_LEN {
            return Err(SummaryError::BadNameLength {
                at,
                what: "peer",
                len,
            });
        }
        Ok(())
    }

    /// The next peer's name (its coding checked): UTF-8, after the
    /// previous one.
    pub(super) fn name(
        &mut self,
        at: At,
        prefix: usize,
        suffix: usize,
        middle: &[u8],
    ) -> Result<PeerName, SummaryError> {
        let previous: &[u8] = self.peers.last().map_or(&[], |p| p.name.as_bytes());
        self.buf.clear();
        self.buf.extend_from_slice(&previous[..prefix]);
        self.buf.extend_from_slice(middle);
        self.buf
            .extend_from_slice(&previous[previous.len() - suffix..]);
        let text = std::str::from_utf8(&self.buf)
            .map_err(|_| SummaryError::NameUtf8 { at, what: "peer" })?;
        if let Some(last) = self.peers.last()
            && text <= &*last.name
        {
            return Err(SummaryError::Order {
                at,
                name: crate::util::text::clip(text, 64),
                previous: last.name.to_string(),
            });
        }
        Ok(PeerName::from(text))
    }

    /// The four paths of a states byte, without their RTTs (version 1 has
    /// no code 3).
    pub(super) fn paths(&self, at: At, states: u8) -> Result<[PathSample; 4], SummaryError> {
        let mut paths = [PathSample::UNKNOWN; 4];
        for (i, path) in paths.iter_mut().enumerate() {
            *path = match (states >> (2 * i)) & 3 {
                0 => PathSample::UNKNOWN,
                1 => PathSample::new(ProbeResult::Success, None),
                2 => PathSample::new(ProbeResult::Failure, None),
                _ if self.version == VERSION_1 => return Err(SummaryError::State { at }),
                _ => PathSample::FAILING,
            };
        }
        Ok(paths)
    }

    /// Fills the RTT of each path in Success, not failing, from `next` (the
    /// RTT in µs + 1, 0 for none); then keeps the peer.
    pub(super) fn push(
        &mut self,
        name: PeerName,
        mut paths: [PathSample; 4],
        mut next: impl FnMut() -> Result<Option<u32>, SummaryError>,
    ) -> Result<(), SummaryError> {
        for path in &mut paths {
            if path.code() == 1 {
                path.rtt_us = next()?;
            }
        }
        self.peers.push(PeerSummary::new(name, paths));
        Ok(())
    }
}
