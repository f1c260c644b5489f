//! The AMQP listener: accepts sockets and serves each on its own task.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::node::Broker;

/// Accepts AMQPS connections until the task is dropped: each socket's TLS handshake (and
/// client certificate check) runs on its own task, then the AMQP connection.
pub async fn run_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    broker: Arc<Broker>,
) {
    loop {
        match listener.accept().await {
            Ok((socket, _)) => {
                let id = broker.next_connection_id();
                tokio::spawn(super::connection::serve_tls(
                    socket,
                    acceptor.clone(),
                    broker.clone(),
                    id,
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Accepts connections until the listener fails or the task is dropped.
pub async fn run(listener: TcpListener, broker: Arc<Broker>) {
    loop {
        match listener.accept().await {
            Ok((socket, _)) => {
                let id = broker.next_connection_id();
                tokio::spawn(super::connection::serve(socket, broker.clone(), id));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
