//! The client side of a broker's Unix socket: one gRPC channel over it, for the executors'
//! slots and for the supervisor's control, status and metrics calls.

use hyper_util::rt::TokioIo;
use std::path::Path;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the broker over its Unix socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    // The URI is required by the API but unused: every connection goes to the socket.
    // A whole slot message fits the receive windows: an assignment carrying megabytes is
    // not held up waiting for window updates on the way.
    let window = u32::try_from(perago_proto::MAX_SLOT_MESSAGE_BYTES).unwrap_or(u32::MAX);
    Endpoint::from_static("http://perago.broker")
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}
