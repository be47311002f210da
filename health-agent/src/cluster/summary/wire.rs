//! Format version 3: the protobuf message of `proto/summary.proto` (the
//! parent module's documentation describes the value around it).

use prost::Message as _;

use crate::probe::path::ProbeResult;

use super::{
    At, MAX_NAME_LEN, MAX_PEER_BYTES, MAX_PEERS, Summary, SummaryError, VERSION, peers::PeerReader,
    v2::Reader,
};

/// The code prost generates from `proto/summary.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    unused_qualifications,
    reason = "generated"
)]
pub(super) mod proto {
    include!(concat!(env!("OUT_DIR"), "/health.summary.v3.rs"));
}

/// The longest message a summary takes: the observer, seq and `at_ms`,
/// the columns' tags and lengths, and [`MAX_PEERS`] of the largest peers.
/// A longer one is refused before it is decoded.
pub(super) const MAX_MESSAGE_BYTES: usize = 512 + MAX_PEERS * MAX_PEER_BYTES;

/// Version 3 of `s`: its version byte, the message's length, the message.
pub(super) fn encode(s: &Summary) -> Vec<u8> {
    let n = s.peers.len();
    let mut m = proto::Summary {
        observer: s.observer.clone(),
        seq: s.seq,
        at_ms: s.at_ms,
        prefix: Vec::with_capacity(n),
        suffix: Vec::with_capacity(n),
        middle_len: Vec::with_capacity(n),
        middles: Vec::with_capacity(n * 4),
        states: Vec::with_capacity(n),
        rtt: Vec::with_capacity(n * 4),
        lossy_peer: Vec::new(),
        lossy_paths: Vec::new(),
        cadence_ms: s.cadence_ms,
        plaintext_peer: Vec::new(),
        plaintext_paths: Vec::new(),
        split_peer: Vec::new(),
        split_paths: Vec::new(),
    };
    let mut previous: &[u8] = &[];
    for p in &s.peers {
        let name = p.name.as_bytes();
        let (prefix, suffix) = super::peers::name_coding(previous, name);
        let middle = &name[prefix..name.len() - suffix];
        // Names are checked at construction: at most MAX_NAME_LEN bytes.
        m.prefix.push(prefix as u32);
        m.suffix.push(suffix as u32);
        m.middle_len.push(middle.len() as u32);
        m.middles.extend_from_slice(middle);
        m.states.push(u32::from(p.state_bits()));
        let lossy = p.lossy_bits();
        if lossy != 0 {
            m.lossy_peer.push(m.states.len() as u32 - 1);
            m.lossy_paths.push(u32::from(lossy));
        }
        let plaintext = p.plaintext_bits();
        if plaintext != 0 {
            m.plaintext_peer.push(m.states.len() as u32 - 1);
            m.plaintext_paths.push(u32::from(plaintext));
        }
        let split = p.split_bits();
        if split != 0 {
            m.split_peer.push(m.states.len() as u32 - 1);
            m.split_paths.push(u32::from(split));
        }
        for path in &p.paths() {
            if path.code() == 1 {
                m.rtt.push(path.rtt_us.map_or(0, |us| us + 1));
            }
        }
        previous = name;
    }
    let len = m.encoded_len();
    let mut out = Vec::with_capacity(1 + prost::length_delimiter_len(len) + len);
    out.push(VERSION);
    m.encode_length_delimited(&mut out)
        .expect("a Vec takes any length");
    out
}

/// Reads a value of version 3 (its first byte).
pub(super) fn decode(bytes: &[u8]) -> Result<Summary, SummaryError> {
    let mut r = Reader { bytes, at: 1 };
    let len = r.varint("the message length")?;
    if len > MAX_MESSAGE_BYTES as u64 {
        return Err(SummaryError::TooLong { len });
    }
    let message = r.take(usize::try_from(len).unwrap_or(usize::MAX), "the message")?;
    if r.remaining() > 0 {
        return Err(SummaryError::Trailing {
            extra: r.remaining(),
        });
    }
    let m = proto::Summary::decode(message).map_err(SummaryError::Protobuf)?;
    if m.observer.is_empty() || m.observer.len() > MAX_NAME_LEN {
        return Err(SummaryError::BadNameLength {
            at: At::Observer,
            what: "observer",
            len: m.observer.len(),
        });
    }
    let count = m.states.len();
    if count > MAX_PEERS {
        return Err(SummaryError::TooManyPeers {
            count: count as u64,
        });
    }
    for (what, column) in [
        ("name prefixes", &m.prefix),
        ("name suffixes", &m.suffix),
        ("name middle lengths", &m.middle_len),
    ] {
        if column.len() != count {
            return Err(SummaryError::Columns {
                what,
                len: column.len(),
                expected: count,
            });
        }
    }
    let middles: u64 = m.middle_len.iter().copied().map(u64::from).sum();
    if middles != m.middles.len() as u64 {
        return Err(SummaryError::Columns {
            what: "middle bytes",
            len: m.middles.len(),
            expected: usize::try_from(middles).unwrap_or(usize::MAX),
        });
    }
    let wide = |v: u32| usize::try_from(v).unwrap_or(usize::MAX);
    let mut peers = PeerReader::new(VERSION, count);
    let (mut offset, mut rtts) = (0, m.rtt.iter());
    for i in 0..count {
        let at = At::Peer(i);
        let (prefix, suffix, middle) =
            (wide(m.prefix[i]), wide(m.suffix[i]), wide(m.middle_len[i]));
        peers.check_coding(at, prefix, suffix, middle)?;
        // In bounds: the middle lengths add up to the middles' bytes.
        let name = peers.name(at, prefix, suffix, &m.middles[offset..offset + middle])?;
        offset += middle;
        let states = u8::try_from(m.states[i]).map_err(|_| SummaryError::States {
            at,
            value: m.states[i],
        })?;
        let paths = peers.paths(at, states)?;
        peers.push(name, paths, || match rtts.next() {
            Some(&v) => Ok(v.checked_sub(1)),
            None => Err(missing_rtts(&m)),
        })?;
    }
    if rtts.len() > 0 {
        return Err(missing_rtts(&m));
    }
    let mut peers = peers.peers;
    mark(&m.lossy_peer, &m.lossy_paths, Mark::Lossy, &mut peers)?;
    mark(
        &m.plaintext_peer,
        &m.plaintext_paths,
        Mark::Plaintext,
        &mut peers,
    )?;
    mark(&m.split_peer, &m.split_paths, Mark::Split, &mut peers)?;
    Ok(Summary {
        observer: m.observer,
        seq: m.seq,
        at_ms: m.at_ms,
        cadence_ms: m.cadence_ms,
        peers: peers.into_boxed_slice(),
    })
}

/// A sparse column of path masks.
#[derive(Clone, Copy)]
enum Mark {
    Lossy,
    Plaintext,
    Split,
}

/// Marks the paths a sparse column lists (`peer`: indices, `masks`: each
/// one's paths): peers in order, each mask naming paths in Success only
/// (paths failed in one family: in Failure or failing only).
fn mark(
    peer: &[u32],
    masks: &[u32],
    what: Mark,
    peers: &mut [super::PeerSummary],
) -> Result<(), SummaryError> {
    if peer.len() != masks.len() {
        return Err(SummaryError::Columns {
            what: match what {
                Mark::Lossy => "lossy path masks",
                Mark::Plaintext => "plain-text path masks",
                Mark::Split => "masks of paths failed in one family",
            },
            len: masks.len(),
            expected: peer.len(),
        });
    }
    let mut next = 0;
    for (&i, &mask) in peer.iter().zip(masks) {
        let index = usize::try_from(i).unwrap_or(usize::MAX);
        let refused = || {
            let at = At::Peer(index);
            match what {
                Mark::Lossy => SummaryError::Lossy { at, mask },
                Mark::Plaintext => SummaryError::Plaintext { at, mask },
                Mark::Split => SummaryError::Split { at, mask },
            }
        };
        if index < next || mask == 0 || mask > 0b1111 {
            return Err(refused());
        }
        let p = peers.get_mut(index).ok_or_else(refused)?;
        let mut paths = p.paths();
        for (bit, path) in paths.iter_mut().enumerate() {
            if mask & (1 << bit) != 0 {
                let fits = match what {
                    Mark::Split => matches!(path.code(), 2 | 3),
                    Mark::Lossy | Mark::Plaintext => path.state == ProbeResult::Success,
                };
                if !fits {
                    return Err(refused());
                }
                match what {
                    Mark::Lossy => path.lossy = true,
                    Mark::Plaintext => path.plaintext = true,
                    Mark::Split => path.split = true,
                }
            }
        }
        p.set_paths(paths);
        next = index + 1;
    }
    Ok(())
}

/// The RTT column does not have one entry per path of state 1.
fn missing_rtts(m: &proto::Summary) -> SummaryError {
    let expected = m
        .states
        .iter()
        .map(|&s| (0..4).filter(|i| (s >> (2 * i)) & 3 == 1).count())
        .sum();
    SummaryError::Columns {
        what: "RTTs",
        len: m.rtt.len(),
        expected,
    }
}
