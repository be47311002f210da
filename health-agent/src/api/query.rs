//! A request's query: `name=value` pairs, each name one the endpoint
//! takes and given at most once, each value not empty, its `%XX` escapes
//! decoded. What is wrong is named in the error, beside the names the
//! endpoint takes.

use std::borrow::Cow;

/// The parameters of one request.
#[derive(Debug, Default)]
pub(super) struct Query<'a> {
    pairs: Vec<(&'a str, Cow<'a, str>)>,
}

impl<'a> Query<'a> {
    /// `query` (the URI's, after `?`), taking only the names in `known`;
    /// `usage` lists them for an error.
    pub(super) fn parse(
        query: Option<&'a str>,
        known: &[&str],
        usage: &str,
    ) -> Result<Self, String> {
        let mut pairs: Vec<(&'a str, Cow<'a, str>)> = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let Some((name, raw)) = pair.split_once('=') else {
                return Err(format!("query parameter {pair:?} has no value ({usage})"));
            };
            if !known.contains(&name) {
                return Err(format!("unknown query parameter {pair:?} ({usage})"));
            }
            if raw.is_empty() {
                return Err(format!("{name}= is empty ({usage})"));
            }
            let Some(value) = decode(raw) else {
                return Err(format!(
                    "{name}={raw:?}: a % not followed by two hex digits, or not UTF-8"
                ));
            };
            if let Some((_, first)) = pairs.iter().find(|(n, _)| *n == name) {
                return Err(format!("{name} given twice: {first:?} and {value:?}"));
            }
            pairs.push((name, value));
        }
        Ok(Self { pairs })
    }

    /// Whether the flag `name` is on (`true`); off when `false` or not
    /// given, an error naming any other value.
    pub(super) fn flag(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(v) => Err(format!("{name} {v:?}: expected true or false")),
        }
    }

    /// The value of `name`, when given.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// `raw` with its escapes decoded; `None` when a `%` is not followed by
/// two hex digits or the bytes are not UTF-8.
fn decode(raw: &str) -> Option<Cow<'_, str>> {
    let escapes_ok = raw.split('%').skip(1).all(|s| {
        s.as_bytes()
            .get(..2)
            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    escapes_ok
        .then(|| percent_encoding::percent_decode_str(raw).decode_utf8().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [&str; 2] = ["node", "state"];

    fn parse(q: &str) -> Result<Query<'_>, String> {
        Query::parse(Some(q), &KNOWN, "node=NAME, state=STATE")
    }

    #[test]
    fn values_are_decoded_and_found_by_name() {
        let q = parse("node=peer%2D1&&state=failure").expect("good");
        assert_eq!(q.get("node"), Some("peer-1"));
        assert_eq!(q.get("state"), Some("failure"));
        assert_eq!(q.get("summary"), None);
        assert_eq!(q.flag("summary"), Ok(false));
        assert_eq!(Query::parse(None, &KNOWN, "").expect("none").pairs, []);
    }

    #[test]
    fn each_bad_query_is_refused_naming_what_is_wrong() {
        for (bad, says) in [
            ("node=a&node=b", "node given twice: \"a\" and \"b\""),
            ("node=", "node= is empty"),
            ("node", "\"node\" has no value"),
            ("nodes=a", "unknown query parameter \"nodes=a\""),
            ("node=%ZZ", "node=\"%ZZ\": a % not followed"),
            ("node=a%2", "node=\"a%2\": a % not followed"),
            (
                "node=%FF",
                "node=\"%FF\": a % not followed by two hex digits, or not UTF-8",
            ),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        // The endpoint's names are listed beside an unknown one.
        assert!(
            parse("x=1")
                .expect_err("x")
                .ends_with("(node=NAME, state=STATE)")
        );
    }
}
