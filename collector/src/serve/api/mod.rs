//! The HTTP API: one handler per route, grouped by resource (`live`, `jobs`, `traces`,
//! `upload`, `analyses`); the request and answer types are `protocol`'s. The OpenAPI document
//! (`docs.rs`) is derived from the handlers' `#[utoipa::path]` attributes.

mod analyses;
mod jobs;
mod live;
mod traces;
mod upload;

pub use analyses::*;
pub use jobs::*;
pub use live::*;
pub use traces::*;
pub use upload::*;

use super::error::ApiError;
use super::fault::blocking;
use super::state::AppState;
use protocol::*;
use std::sync::Arc;

/// Stored trace `id`, read off the runtime (a bucket store asks the bucket); 404 when there is
/// none.
async fn find_stored(state: &Arc<AppState>, id: &str) -> Result<StoredTrace, ApiError> {
    let (st, id) = (state.clone(), id.to_owned());
    blocking(move || st.store.get(&id).map_err(ApiError::from)).await
}

fn field(name: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::unprocessable(format!("field `{name}`: {why}"))
}
