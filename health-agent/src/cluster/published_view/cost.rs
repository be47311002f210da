//! What a view costs in memory once decoded, counted alike by the
//! assembler, which lists nodes only within [`LISTED_DECODED_BYTES`], and
//! by a reader, which walks the wire's tags and lengths before decoding
//! anything and refuses a value past [`MAX_DECODED_BYTES`] (three times
//! as much). A view's bytes on the wire say little about its decoded size:
//! an empty node is 2 bytes of protobuf and a few hundred decoded, so 1
//! MiB of them would otherwise be over 100 MB.
//!
//! The cost is [`NODE_COST`] a node listed, and [`STRING_COST`] and its
//! length a name (the node's, its zone's, each name in its evidence, each
//! node named as reached in plain text, the assembler's). A name repeated
//! on the wire is counted each time, so a reader counts at least what the
//! value holds; the vectors' spare capacity while decoding is left out.

use prost::{
    bytes::Buf as _,
    encoding::{WireType, decode_key, decode_varint},
};

use super::{ViewError, proto};
use crate::cluster::view::NodeView;

/// The most a view may cost decoded, by this module's count: a reader
/// refuses a view past it.
pub const MAX_DECODED_BYTES: usize = 24 * 1024 * 1024;

/// What an assembler lists nodes within, by the same count: a third of
/// what readers take, so that a reader whose count of the same view is
/// larger (another version of the agent) still takes it, and so does one
/// reading an assembler that lists by bytes on the wire alone (1 MiB of
/// nodes not healthy with names of 10 bytes or more and no evidence).
pub const LISTED_DECODED_BYTES: usize = MAX_DECODED_BYTES / 3;

/// A node listed: the message decoded and the view made of it, both held
/// while the view is checked. A number of the format, not of this build:
/// readers and assemblers of every version count alike.
pub(super) const NODE_COST: usize = 320;

/// A name beside its bytes: its header and the allocator's overhead.
pub(super) const STRING_COST: usize = 40;

const _: () = {
    assert!(size_of::<proto::Node>() + size_of::<NodeView>() <= NODE_COST);
    assert!(size_of::<String>() + 16 <= STRING_COST);
};

/// The view message's fields that hold names (the assembler, the nodes
/// reached in plain text) and nodes.
const ASSEMBLER: u32 = 1;
const NODES: u32 = 12;
const PLAINTEXT_NODES: u32 = 16;

/// A node message's fields that hold names: its name, zone, failing
/// observers and unreached nodes.
const NODE_NAMES: [u32; 4] = [1, 2, 9, 11];

/// The most one listed node costs: its name, its zone and
/// [`MAX_NAMED`](crate::cluster::view::MAX_NAMED) names of each list, all
/// of the longest.
pub(super) const LARGEST_NODE_COST: usize = NODE_COST
    + (2 * crate::cluster::view::MAX_NAMED + 2)
        * name_cost(crate::membership::record::MAX_NAME_LEN);

/// The cost of a name of `len` bytes.
const fn name_cost(len: usize) -> usize {
    STRING_COST.saturating_add(len)
}

/// What `n` costs listed in a view, as a reader counts it from the wire.
pub(super) fn node_cost(n: &NodeView) -> usize {
    let names = n
        .failing_observers
        .iter()
        .chain(&n.unreached_nodes)
        .chain(std::iter::once(&n.name))
        .chain(&n.zone);
    NODE_COST + names.map(|s| name_cost(s.len())).sum::<usize>()
}

/// What the view's parts beside its nodes cost: its assembler and the
/// nodes named as reached in plain text.
pub(super) fn head_cost<'a>(
    assembler: &str,
    plaintext: impl IntoIterator<Item = &'a String>,
) -> usize {
    name_cost(assembler.len())
        + plaintext
            .into_iter()
            .map(|s| name_cost(s.len()))
            .sum::<usize>()
}

fn malformed(e: impl std::fmt::Display) -> ViewError {
    ViewError::Decode(e.to_string())
}

/// Calls `field` with each field of the message in `wire`: its number, and
/// its bytes when length-delimited. Fails on a malformed field or a group
/// (no view holds one).
fn each_field(
    mut wire: &[u8],
    mut field: impl FnMut(u32, Option<&[u8]>) -> Result<(), ViewError>,
) -> Result<(), ViewError> {
    while wire.has_remaining() {
        let (tag, kind) = decode_key(&mut wire).map_err(malformed)?;
        let bytes = match kind {
            WireType::Varint => {
                decode_varint(&mut wire).map_err(malformed)?;
                None
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if kind == WireType::SixtyFourBit { 8 } else { 4 };
                if wire.len() < n {
                    return Err(malformed("a fixed-width field runs past the end"));
                }
                wire.advance(n);
                None
            }
            WireType::LengthDelimited => {
                let len = decode_varint(&mut wire).map_err(malformed)?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > wire.len() {
                    return Err(malformed("a field's length runs past the end"));
                }
                let (bytes, rest) = wire.split_at(len);
                wire = rest;
                Some(bytes)
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(malformed("a group: no view holds one"));
            }
        };
        field(tag, bytes)?;
    }
    Ok(())
}

/// The cost of the view message `wire` once decoded, walking its tags and
/// lengths only; a value past [`MAX_DECODED_BYTES`] is refused as soon as
/// the walk reaches it.
pub(super) fn check(wire: &[u8]) -> Result<usize, ViewError> {
    let mut cost = 0usize;
    let mut add = |c: usize| {
        cost = cost.saturating_add(c);
        if cost > MAX_DECODED_BYTES {
            return Err(ViewError::TooCostly);
        }
        Ok(())
    };
    each_field(wire, |tag, bytes| match (tag, bytes) {
        (ASSEMBLER | PLAINTEXT_NODES, Some(b)) => add(name_cost(b.len())),
        (NODES, Some(node)) => {
            add(NODE_COST)?;
            each_field(node, |tag, bytes| match bytes {
                Some(b) if NODE_NAMES.contains(&tag) => add(name_cost(b.len())),
                _ => Ok(()),
            })
        }
        _ => Ok(()),
    })?;
    Ok(cost)
}
