//! The router, over a real loopback listener.

use std::net::SocketAddr;

use axum::Router;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;

use super::{ASSETS, INDEX, routes};

struct Got {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Bytes,
}

async fn serve() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    // The page's routes mounted as the agent mounts them: merged into a
    // router with a state of its own.
    let app: Router = Router::new().merge(routes::<()>());
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::get(path).header(header::HOST, "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Empty::<Bytes>::new()).expect("request"))
        .await
        .expect("response");
    let (parts, body) = resp.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

fn header_of<'a>(got: &'a Got, name: &header::HeaderName) -> &'a str {
    got.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} in {:?}", got.headers))
}

#[tokio::test]
async fn serves_the_page_and_every_asset_with_its_type() {
    let addr = serve().await;
    let page = get(addr, "/", &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        header_of(&page, &header::CONTENT_TYPE),
        "text/html; charset=utf-8"
    );
    assert_eq!(header_of(&page, &header::CACHE_CONTROL), "no-cache");
    let csp = header_of(&page, &header::CONTENT_SECURITY_POLICY);
    // No inline script or style, no eval; never framed.
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(!csp.contains("unsafe-"), "{csp}");
    assert_eq!(header_of(&page, &header::X_FRAME_OPTIONS), "DENY");
    assert_eq!(&page.body[..], INDEX.body);
    let html = std::str::from_utf8(&page.body).expect("UTF-8");
    for (path, ty) in [
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/style.css", "text/css; charset=utf-8"),
        ("/assets/favicon.svg", "image/svg+xml"),
        ("/favicon.ico", "image/svg+xml"),
    ] {
        let got = get(addr, path, &[]).await;
        assert_eq!(got.status, StatusCode::OK, "{path}");
        assert_eq!(header_of(&got, &header::CONTENT_TYPE), ty, "{path}");
        assert_eq!(
            header_of(&got, &header::X_CONTENT_TYPE_OPTIONS),
            "nosniff",
            "{path}"
        );
        assert!(!got.body.is_empty(), "{path}");
        if path.starts_with("/assets/") {
            // Relative, so that the page works behind a path prefix too.
            assert!(html.contains(&format!("\"{}\"", &path[1..])), "{path}");
        }
    }
}

#[tokio::test]
async fn unknown_assets_are_404() {
    let addr = serve().await;
    for path in ["/assets/nope.js", "/assets/../Cargo.toml", "/assets/", "/x"] {
        assert_eq!(
            get(addr, path, &[]).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_matching_etag_gets_304() {
    let addr = serve().await;
    let first = get(addr, "/assets/app.js", &[]).await;
    let etag = header_of(&first, &header::ETAG).to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let again = get(addr, "/assets/app.js", &[("if-none-match", &etag)]).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());
    assert_eq!(header_of(&again, &header::ETAG), etag);
    let weak = format!("\"other\", W/{etag}");
    let weak = get(addr, "/assets/app.js", &[("if-none-match", &weak)]).await;
    assert_eq!(weak.status, StatusCode::NOT_MODIFIED);
    let stale = get(addr, "/assets/app.js", &[("if-none-match", "\"0\"")]).await;
    assert_eq!(stale.status, StatusCode::OK);
    // Another file has another tag.
    let css = get(addr, "/assets/style.css", &[]).await;
    assert_ne!(header_of(&css, &header::ETAG), etag);
}

#[test]
fn the_assets_fetch_nothing_from_the_network() {
    for a in ASSETS.iter().chain([&INDEX]) {
        let text = std::str::from_utf8(a.body).expect("UTF-8");
        for bad in ["http://", "https://", "//fonts.", "@import", "cdn"] {
            // The SVG's XML namespace is an identifier, never fetched.
            let hits = text
                .match_indices(bad)
                .filter(|(i, _)| !text[*i..].starts_with("http://www.w3.org/2000/svg"))
                .count();
            assert_eq!(hits, 0, "{} contains {bad:?}", a.name);
        }
    }
}

#[test]
fn the_page_fetches_the_api_paths_the_listener_serves() {
    use crate::api::types::paths;
    let js = ASSETS
        .iter()
        .find(|a| a.name == "app.js")
        .map(|a| std::str::from_utf8(a.body).expect("UTF-8"))
        .expect("app.js");
    for path in [
        paths::STATUS,
        paths::STATUS_HISTORY,
        paths::CLUSTER,
        paths::CLUSTER_MATRIX,
    ] {
        // Relative to the page, under the listener's `/api`.
        let url = format!("\"api{path}\"");
        assert!(js.contains(&url), "app.js does not fetch {url}");
    }
    // The cluster section shows only once the agent has a cluster view.
    let html = std::str::from_utf8(INDEX.body).expect("UTF-8");
    assert!(html.contains(r#"<details id="cluster" open hidden>"#));
}
