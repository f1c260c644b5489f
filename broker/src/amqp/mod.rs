//! AMQP 0-9-1 front end: framing via amq-protocol, connections, channels.
//! It translates frames into domain calls and back; it owns no queue logic.

pub mod channel;
pub mod channels;
pub mod codec;
pub mod confirms;
pub mod connection;
pub mod error;
pub mod nesting;
pub mod output;
pub mod server;
