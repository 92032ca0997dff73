//! Why a request's work failed, as the layers below the API say it: the store, the isolated
//! imports and the trace jobs return a [`Fault`] and know nothing of HTTP; the API layer
//! (`error.rs`) alone turns each kind into a status code.

/// A failure of the server's work, by what the client can do about it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Fault {
    /// The request asked for something that cannot be done (a shape, a file, the model ran
    /// out of memory): the client must change the request.
    #[error("{0}")]
    Rejected(String),
    /// What the request names does not exist (a trace, a file).
    #[error("{0}")]
    NotFound(String),
    /// What the request would create exists already.
    #[error("{0}")]
    Conflict(String),
    /// The request's file is over a limit.
    #[error("{0}")]
    TooLarge(String),
    /// The server cannot do it at all (no CUDA, built without tracing, stopping).
    #[error("{0}")]
    Unavailable(String),
    /// The server is full right now; retry after `retry_after_s`.
    #[error("{detail}")]
    Busy { detail: String, retry_after_s: u64 },
    /// The server itself failed (`context`: what it was doing). The cause went to the log
    /// when the fault was made; answers name only the context, not the server's paths.
    #[error("internal error: {context} (see the server's log)")]
    Internal { context: String },
}

impl Fault {
    /// An internal fault, logged with its cause.
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> Self {
        eprintln!("collector serve: internal error: {context}: {cause:#}");
        Self::Internal { context: context.to_owned() }
    }
}

impl Fault {
    /// Storing a finished trace failed: too large for the store is the job's failure (it is
    /// rejected, not the server's), the bucket failing is the bucket's, anything else is the
    /// server's own (`context`: what it stored).
    pub fn storing(e: super::store::StoreError, context: &str) -> Self {
        use super::store::StoreError;
        match e {
            StoreError::TooLarge { .. } => Fault::Rejected(e.to_string()),
            e @ StoreError::Backend(_) => Fault::from(e),
            e => Fault::internal(context, e),
        }
    }
}

impl From<super::store::StoreError> for Fault {
    fn from(e: super::store::StoreError) -> Self {
        use super::store::StoreError;
        match e {
            StoreError::NotFound(id) => Self::NotFound(format!("Trace {id} not found")),
            StoreError::TooLarge { .. } => Self::TooLarge(e.to_string()),
            StoreError::Exists(_) => Self::Conflict(e.to_string()),
            StoreError::Io { .. } | StoreError::Locked { .. } => Self::internal("the trace store", e),
            StoreError::Backend(why) => {
                eprintln!("collector serve: the trace store's bucket failed: {why}");
                Self::Unavailable(format!("the trace store's bucket did not answer as expected ({why}); retry"))
            }
        }
    }
}

/// Runs blocking work (file I/O, imports) off the async runtime.
pub async fn blocking<T: Send + 'static, E: From<Fault> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
    tokio::task::spawn_blocking(f).await.map_err(|e| E::from(Fault::internal("a worker thread failed", e)))?
}
