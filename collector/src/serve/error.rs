//! Errors as the API answers them: a status code and `{"detail": "..."}`.

use super::fault::Fault;
use super::store::StoreError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;

/// An error answer. Internal faults (500) are also logged with their cause.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: String,
    retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self { status, detail: detail.into(), retry_after_s: None }
    }

    pub fn trace_not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("Trace {id} not found"))
    }

    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, detail)
    }

    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, detail)
    }

    /// A request body that stopped arriving for `--body-timeout-s`.
    pub fn body_timeout() -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "the request body stopped arriving (no byte within --body-timeout-s); nothing was stored")
    }

    /// What reading a request body failed with: 408 when it timed out, else 422.
    pub fn body(e: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if c.is::<tower_http::timeout::TimeoutError>() {
                return Self::body_timeout();
            }
            cause = c.source();
        }
        Self::unprocessable(format!("cannot read the body: {e}"))
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "this server needs a token: send `Authorization: Bearer <token>` (or `?access_token=<token>` where headers cannot be set)",
        )
    }

    /// A full job queue; retry after the given seconds.
    pub fn busy(detail: impl Into<String>, retry_after_s: u64) -> Self {
        Self { retry_after_s: Some(retry_after_s.max(1)), ..Self::new(StatusCode::TOO_MANY_REQUESTS, detail) }
    }

    /// A real internal fault: logged with its cause, answered without the server's paths.
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> Self {
        Fault::internal(context, cause).into()
    }
}

/// The one place a lower layer's failure becomes a status code.
impl From<Fault> for ApiError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Rejected(d) => Self::unprocessable(d),
            Fault::NotFound(d) => Self::new(StatusCode::NOT_FOUND, d),
            Fault::Conflict(d) => Self::new(StatusCode::CONFLICT, d),
            Fault::TooLarge(d) => Self::too_large(d),
            Fault::Unavailable(d) => Self::unavailable(d),
            Fault::Busy { detail, retry_after_s } => Self::busy(detail, retry_after_s),
            f @ Fault::Internal { .. } => Self::new(StatusCode::INTERNAL_SERVER_ERROR, f.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Fault::from(e).into()
    }
}

/// The status code a follower of a failed job is told (`LiveEvent::Failed`), the same as
/// the job's waiting request is answered.
pub fn failed_event(f: &Fault) -> protocol::LiveEvent {
    let e = ApiError::from(f.clone());
    protocol::LiveEvent::Failed { status: e.status.as_u16(), detail: e.detail }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(ErrorBody { detail: self.detail })).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// A JSON body whose rejections answer `{"detail"}`: 422 naming the field and why, 413 when
/// the body is over the limit, 415 without a JSON content type.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::rejection::JsonRejection;
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(JsonRejection::JsonDataError(e)) => Err(ApiError::unprocessable(format!(
                "invalid body: {}",
                e.body_text().trim_start_matches("Failed to deserialize the JSON body into the target type: ")
            ))),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::unprocessable(format!(
                "the body is not valid JSON: {}",
                e.body_text().trim_start_matches("Failed to parse the request body as JSON: ")
            ))),
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "expected a JSON body with `Content-Type: application/json`"))
            }
            Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::too_large(format!("the body is larger than this route's limit of {} bytes", super::state::JSON_BODY_LIMIT)))
            }
            Err(e) => Err(ApiError::new(e.status(), e.body_text())),
        }
    }
}
