//! Answers made once, gzipped, and shared by every client that asks: sent
//! as they are to a client that takes gzip, decompressed as they are
//! read for one that does not.

use std::io::{self, Read as _};

use axum::{
    http::{
        HeaderMap,
        header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, VARY},
    },
    response::{IntoResponse as _, Response},
};
use bytes::{Buf as _, Bytes, BytesMut};
use flate2::{Compression, write::GzEncoder};

/// The pieces a shared answer is decompressed in for a client that does
/// not take gzip.
pub const PIECE: usize = 64 << 10;

/// How much text is gathered before the compressor: it takes large writes
/// best, and writers of JSON or metrics write a field or a number at a
/// time.
const BUFFER: usize = 64 << 10;

/// What `write` writes, gzipped (the fast level) as it is written, and
/// what `write` returned.
pub fn gzipped<T>(write: impl FnOnce(&mut io::BufWriter<GzEncoder<Vec<u8>>>) -> T) -> (T, Vec<u8>) {
    let mut out =
        io::BufWriter::with_capacity(BUFFER, GzEncoder::new(Vec::new(), Compression::fast()));
    let written = write(&mut out);
    // Writing into a Vec cannot fail.
    let bytes = out
        .into_inner()
        .ok()
        .and_then(|enc| enc.finish().ok())
        .unwrap_or_default();
    (written, bytes)
}

/// An answer of `gz`, text of `content_type` gzipped: sent as it is to a
/// client whose `headers` take gzip, decompressed a [`PIECE`] at a time
/// as it is read for one that does not.
pub fn answer(content_type: &'static str, gz: Bytes, headers: &HeaderMap) -> Response {
    if accepted(headers) {
        with_head(content_type, true, axum::body::Body::from(gz))
    } else {
        let pieces = futures::stream::iter(pieces(gz, PIECE));
        with_head(content_type, false, axum::body::Body::from_stream(pieces))
    }
}

/// The head [`answer`] gives a client whose request had `headers`,
/// without a body: the answer to a `HEAD`, made without the text.
#[must_use]
pub fn head(content_type: &'static str, headers: &HeaderMap) -> Response {
    // Of no stated length (an empty body would say `content-length: 0`,
    // which the text is not).
    let none = axum::body::Body::from_stream(futures::stream::empty::<io::Result<Bytes>>());
    with_head(content_type, accepted(headers), none)
}

/// `body`, text of `content_type`, gzipped or not.
fn with_head(content_type: &'static str, gzipped: bool, body: axum::body::Body) -> Response {
    let kind = (CONTENT_TYPE, content_type);
    let vary = (VARY, "accept-encoding");
    if gzipped {
        ([kind, (CONTENT_ENCODING, "gzip"), vary], body).into_response()
    } else {
        ([kind, vary], body).into_response()
    }
}

/// Whether `Accept-Encoding` takes gzip: named (or `*`) with a weight
/// above 0 (`gzip;q=0` refuses it).
#[must_use]
pub fn accepted(headers: &HeaderMap) -> bool {
    let weighted = headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|item| {
            let mut parts = item.split(';');
            let coding = parts.next()?.trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .or_else(|| p.trim().strip_prefix("Q="))
                })
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            Some((coding, q))
        });
    let (mut gzip, mut any) = (None, None);
    for (coding, q) in weighted {
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q),
            "*" => any = Some(q),
            _ => {}
        }
    }
    gzip.or(any).is_some_and(|q| q > 0.0)
}

/// `gz` decompressed a piece of at most `piece` bytes at a time, as the
/// pieces are taken: a reader that takes them slowly holds the decoder's
/// state and one piece, never the whole text. A failure ends the pieces.
pub fn pieces(gz: Bytes, piece: usize) -> impl Iterator<Item = io::Result<Bytes>> + Send + 'static {
    let mut decoder = Some(flate2::read::GzDecoder::new(gz.reader()));
    std::iter::from_fn(move || {
        let d = decoder.as_mut()?;
        let mut buf = BytesMut::zeroed(piece.max(1));
        let mut filled = 0;
        while filled < buf.len() {
            match d.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    decoder = None;
                    return Some(Err(e));
                }
            }
        }
        if filled == 0 {
            decoder = None;
            return None;
        }
        buf.truncate(filled);
        Some(Ok(buf.freeze()))
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(ACCEPT_ENCODING, v.parse().expect("a header value"));
        }
        h
    }

    #[test]
    fn gzip_is_taken_when_named_or_starred_with_a_weight() {
        for (values, taken) in [
            (&["gzip"][..], true),
            (&["br, GZIP;q=0.5"], true),
            (&["deflate", "x-gzip"], true),
            (&["*"], true),
            (&["gzip;q=0"], false),
            (&["gzip;q=0, *"], false),
            (&["*;q=0"], false),
            (&["identity"], false),
            (&[], false),
        ] {
            assert_eq!(accepted(&headers(values)), taken, "{values:?}");
        }
    }

    #[test]
    fn pieces_give_back_the_text_and_a_broken_stream_ends_them_with_an_error() {
        let text = "health_peer_reachable{peer=\"node-1\"} 1\n".repeat(5_000);
        let (written, gz) = gzipped(|out| out.write_all(text.as_bytes()));
        written.expect("written");
        let gz = Bytes::from(gz);
        let got: Vec<Bytes> = pieces(gz.clone(), 1000)
            .collect::<Result<_, _>>()
            .expect("pieces");
        assert!(got.iter().all(|p| p.len() <= 1000));
        assert_eq!(got.concat(), text.as_bytes());
        // Cut short: the pieces that decompress, then one error, then none.
        let cut = gz.slice(..gz.len() / 2);
        let got: Vec<_> = pieces(cut, 1000).collect();
        assert!(got.last().is_some_and(Result::is_err), "{got:?}");
        assert_eq!(got.iter().filter(|p| p.is_err()).count(), 1);
    }
}
