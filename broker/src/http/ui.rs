//! The management web UI: static HTML, JavaScript and CSS compiled into the binary
//! (`include_str!` of `http/ui/`), served at `/` and `/ui/{file}`. Like RabbitMQ's
//! management UI it is a client of the management API (`/api/...`, basic
//! authentication): every button is an API call, nothing is rendered on the server and
//! nothing is fetched from elsewhere at runtime. Pages use RabbitMQ's hash URLs
//! (`#/`, `#/queues`, `#/queues/%2F/NAME`, `#/exchanges`, `#/connections`,
//! `#/channels`, `#/policies`, `#/users`, `#/vhosts`, `#/nodes`).

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{ApiError, Started};

/// The UI's files: name under `/ui/`, `Content-Type`, contents.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("ui/style.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("ui/favicon.svg"),
    ),
];

/// The UI routes: `GET /` (the page), `GET /ui/{file}` (its assets) and
/// `GET /favicon.ico` (the icon, so a browser's own request for it does not 404).
/// None of them overlaps `/api/*`, `/metrics*` or `/health/*`.
pub fn routes() -> Router<Started> {
    Router::new()
        .route("/", get(|| async { file("index.html") }))
        .route("/ui/", get(|| async { file("index.html") }))
        .route("/favicon.ico", get(|| async { file("favicon.svg") }))
        .route(
            "/ui/{file}",
            get(|Path(name): Path<String>| async move { file(&name) }),
        )
}

/// One of [`FILES`] with its content type; 404 `Object Not Found` for any other name.
fn file(name: &str) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                // The assets change with the binary: revalidate rather than cache stale.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => ApiError::not_found().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type_and_others_are_404() {
        for (name, content_type, body) in FILES {
            let r = file(name);
            assert_eq!(r.status(), 200, "{name}");
            assert_eq!(r.headers()[header::CONTENT_TYPE], *content_type);
            assert!(!body.is_empty(), "{name}");
        }
        assert_eq!(file("nope.js").status(), 404);
        assert_eq!(file("../Cargo.toml").status(), 404);
    }

    #[test]
    fn the_page_loads_only_its_own_assets() {
        let html = FILES[0].2;
        for asset in ["/ui/app.js", "/ui/style.css", "/ui/favicon.svg"] {
            assert!(html.contains(asset), "index.html references {asset}");
        }
        assert!(!html.contains("http://") && !html.contains("https://"));
    }
}
