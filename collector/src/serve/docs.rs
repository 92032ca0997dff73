//! The OpenAPI document (derived from the handlers' `#[utoipa::path]`) and the interactive
//! docs: Swagger UI at `/api/docs`, ReDoc at `/api/redoc`, both vendored in `static/vendor/`
//! and served from the binary (no network needed).

use super::api;
use super::error::ApiError;
use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use protocol::ErrorBody;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Memory Tracer", description = "Where GPU memory goes when a PyTorch model runs: trace models, store and export traces, follow running traces live. Every route under /api except these docs needs `Authorization: Bearer <token>` when the server was started with --token.", license(name = "MIT OR Apache-2.0")),
    paths(
        api::health,
        api::trace_memory,
        api::trace_export,
        api::download,
        api::list,
        api::delete,
        api::get_trace,
        api::upload,
        api::live_start,
        api::live_event,
        api::events,
        api::leaks,
        api::advice,
        api::overview,
        api::explore,
        api::trace_diff,
        api::jobs,
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "tracing", description = "Run traces and follow them"),
        (name = "traces", description = "The trace store"),
        (name = "server", description = "The server itself"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
        openapi.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

/// The OpenAPI document as JSON.
pub fn openapi_document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    doc.to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

pub async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_document()).into_response()
}

const SWAGGER_JS: &[u8] = include_bytes!("../../../static/vendor/swagger-ui/swagger-ui-bundle.js");
const SWAGGER_CSS: &[u8] = include_bytes!("../../../static/vendor/swagger-ui/swagger-ui.css");
const REDOC_JS: &[u8] = include_bytes!("../../../static/vendor/redoc/redoc.standalone.js");

pub async fn asset(Path(file): Path<String>) -> Response {
    let (ct, body) = match file.as_str() {
        "swagger-ui-bundle.js" => ("text/javascript; charset=utf-8", SWAGGER_JS),
        "swagger-ui.css" => ("text/css; charset=utf-8", SWAGGER_CSS),
        "redoc.standalone.js" => ("text/javascript; charset=utf-8", REDOC_JS),
        _ => return ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response(),
    };
    ([(header::CONTENT_TYPE, ct), (header::CACHE_CONTROL, "public, max-age=86400")], body).into_response()
}

/// Swagger UI; a `?token=` in the page's address is sent as the bearer token.
pub async fn swagger() -> Html<&'static str> {
    Html(
        r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Memory Tracer API</title>
<link rel="stylesheet" href="/api/docs/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/api/docs/assets/swagger-ui-bundle.js"></script>
<script>
const token = new URLSearchParams(location.search).get("token");
window.ui = SwaggerUIBundle({
  url: "/api/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  requestInterceptor: (r) => { if (token) r.headers["Authorization"] = "Bearer " + token; return r; },
});
</script></body></html>"##,
    )
}

/// ReDoc (read-only reference).
pub async fn redoc() -> Html<&'static str> {
    Html(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Memory Tracer API</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><redoc spec-url="/api/openapi.json"></redoc>
<script src="/api/docs/assets/redoc.standalone.js"></script></body></html>"#,
    )
}
