//! A JSON object whose one large list is written a chunk of items at a
//! time, as the pieces are taken: an answer's reader that reads slowly
//! holds one chunk's JSON, never the whole answer, and the answer is the
//! same bytes `serde_json` writes for the whole object.

use bytes::Bytes;

/// The pieces of `empty`'s JSON (the object, serialised with the list of
/// its field `field` empty) with the list's items written by `chunks`:
/// each chunk its items' JSON, comma-separated, an empty chunk allowed.
/// `None` when `empty` has no such list.
pub fn pieces(
    empty: Vec<u8>,
    field: &str,
    chunks: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> Option<impl Iterator<Item = Bytes> + Send + 'static> {
    // A quote inside a JSON string is escaped, so the field's name,
    // quoted and followed by its colon, is found only as a key.
    let key = format!("\"{field}\":[]");
    let at = empty.windows(key.len()).position(|w| w == key.as_bytes())? + key.len() - 1;
    let mut open = empty;
    let close = open.split_off(at);
    let mut listed = false;
    let items = chunks.filter(|c| !c.is_empty()).map(move |mut c| {
        if listed {
            c.insert(0, b',');
        }
        listed = true;
        Bytes::from(c)
    });
    Some(
        std::iter::once(Bytes::from(open))
            .chain(items)
            .chain(std::iter::once(Bytes::from(close))),
    )
}

/// `items`' JSON, comma-separated: a chunk for [`pieces`].
pub fn chunk<T: serde::Serialize>(items: impl IntoIterator<Item = T>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Serialising into a Vec fails only for a map with keys that are
        // not strings, which no answer holds.
        let written = serde_json::to_writer(&mut out, &item);
        debug_assert!(written.is_ok(), "{written:?}");
    }
    out
}

/// The ranges of `len` items `size` at a time (at least one a range).
pub fn ranges(
    len: usize,
    size: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> + Send + 'static {
    let size = size.max(1);
    (0..len)
        .step_by(size)
        .map(move |s| s..s.saturating_add(size).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Answer {
        before: String,
        items: Vec<u32>,
        after: Vec<String>,
    }

    fn joined(p: impl Iterator<Item = Bytes>) -> Vec<u8> {
        p.flat_map(|b| b.to_vec()).collect()
    }

    #[test]
    fn the_pieces_are_the_whole_objects_json() {
        let whole = Answer {
            // Inside strings the key's text does not count.
            before: r#""items":[] and more"#.into(),
            items: (0..10).collect(),
            after: vec!["x".into()],
        };
        let empty = serde_json::to_vec(&Answer {
            items: Vec::new(),
            ..whole
        })
        .expect("json");
        let whole_json = serde_json::to_vec(&Answer {
            before: r#""items":[] and more"#.into(),
            items: (0..10).collect(),
            after: vec!["x".into()],
        })
        .expect("json");
        // Chunks of 4, an empty one among them (none of a chunk kept).
        let chunks = vec![chunk(0..4), Vec::new(), chunk(4..8), chunk(8..10)];
        let p: Vec<Bytes> = pieces(empty.clone(), "items", chunks.into_iter())
            .expect("the list")
            .collect();
        assert_eq!(p.len(), 5, "open, three chunks, close");
        assert_eq!(joined(p.into_iter()), whole_json);
        // No item at all: the empty list.
        let none = pieces(empty.clone(), "items", std::iter::empty()).expect("the list");
        assert_eq!(joined(none), empty);
        assert!(pieces(empty, "missing", std::iter::empty()).is_none());
        let r: Vec<_> = ranges(10, 4).collect();
        assert_eq!(r, [0..4, 4..8, 8..10]);
        assert_eq!(ranges(0, 4).count(), 0);
    }
}
