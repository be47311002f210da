//! The agent's API from synchronous tests: the typed client on a
//! throw-away runtime, so tests read answers through the server's own
//! structs.

use std::path::Path;

use health_agent::api::client::{Client, ClientError};

/// Runs `call` with a client of the API at `socket`.
pub fn call<T, Fut>(socket: &Path, call: impl FnOnce(Client) -> Fut) -> Result<T, ClientError>
where
    Fut: Future<Output = Result<T, ClientError>>,
{
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(call(Client::new(socket)))
}
