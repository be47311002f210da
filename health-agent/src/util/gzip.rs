//! Answers made once, gzipped, and shared by every client that asks: sent
//! as they are to a client that takes gzip, decompressed as they are
//! read for one that does not.

use std::io::{self, Read as _};

use axum::http::{HeaderMap, header::ACCEPT_ENCODING};
use bytes::{Buf as _, Bytes, BytesMut};

/// The pieces a shared answer is decompressed in for a client that does
/// not take gzip.
pub const PIECE: usize = 64 << 10;

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
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).expect("written");
        let gz = Bytes::from(enc.finish().expect("finished"));
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
