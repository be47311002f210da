//! The connectivity page: its embedded HTML, CSS and JavaScript, and how they are served.
//! Imported by `web`; imports nothing of the agent.
//!
//! The connectivity page: a read-only view of this node's status, served
//! beside the metrics at `/` (the listener of `--prometheus-serve-addr`).
//!
//! Plain HTML, CSS and JavaScript with no build step, embedded in the
//! binary: the page fetches nothing but the agent's own API (relative
//! URLs: `api/v1/status`, `api/v1/status/history`), which its Content
//! Security Policy enforces. It draws a virtualised list (only the rows in
//! view exist in the DOM), so it stays fluid with thousands of peers.
//!
//! Every response carries an `ETag` (a hash of the embedded bytes) and
//! `Cache-Control: no-cache`: the browser revalidates and gets a 304 until
//! the agent is upgraded, so a new page never runs with an old script.

use axum::{
    Router,
    extract::Path,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    etag: u64,
}

impl Asset {
    const fn new(name: &'static str, content_type: &'static str, body: &'static [u8]) -> Self {
        Self {
            name,
            content_type,
            body,
            etag: fnv1a(body),
        }
    }
}

/// FNV-1a over `bytes`, at compile time: the assets' `ETag`.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

const INDEX: Asset = Asset::new(
    "index.html",
    "text/html; charset=utf-8",
    include_bytes!("assets/index.html"),
);

/// What `/assets/{name}` serves.
const ASSETS: &[Asset] = &[
    Asset::new(
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/app.js"),
    ),
    Asset::new(
        "charts.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/charts.js"),
    ),
    Asset::new(
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/style.css"),
    ),
    Asset::new(
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("assets/favicon.svg"),
    ),
];

/// Only this agent's own origin: no fonts, scripts or data from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// `GET /` (the page) and `GET /assets/{name}`, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/favicon.ico", get(favicon))
        .route("/assets/{name}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(a, &headers),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

/// Browsers ask for `/favicon.ico` whatever the page says.
async fn favicon(headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == "favicon.svg") {
        Some(a) => serve(a, &headers),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let etag = format!("\"{:016x}\"", asset.etag);
    let fresh = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        });
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = asset.body.into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        r
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if asset.content_type.starts_with("text/html") {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

#[cfg(test)]
mod tests;
