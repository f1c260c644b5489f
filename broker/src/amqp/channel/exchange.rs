//! The exchange class: declare, delete, bind, unbind (meta group writes).

use amq_protocol::protocol::{exchange, AMQPClass};

use super::{Channel, Result};
use crate::amqp::error::ProtocolError;
use crate::meta::access::Perm;
use crate::meta::command::MetaCommand;

impl Channel {
    pub(super) async fn on_exchange(&mut self, m: exchange::AMQPMethod) -> Result<()> {
        match m {
            exchange::AMQPMethod::Declare(d) => {
                if !d.passive {
                    self.permit("exchange", d.exchange.as_str(), Perm::Configure)?;
                }
                self.meta(MetaCommand::DeclareExchange {
                    vhost: self.session.vhost.clone(),
                    name: d.exchange.as_str().into(),
                    kind: d.kind.as_str().into(),
                    passive: d.passive,
                    durable: d.durable,
                    auto_delete: d.auto_delete,
                    internal: d.internal,
                    arguments: d.arguments,
                })
                .await?;
                self.session.broker.topology_changed();
                if !d.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(
                        exchange::DeclareOk {},
                    )));
                }
            }
            exchange::AMQPMethod::Delete(d) => {
                self.permit("exchange", d.exchange.as_str(), Perm::Configure)?;
                self.meta(MetaCommand::DeleteExchange {
                    vhost: self.session.vhost.clone(),
                    name: d.exchange.as_str().into(),
                    if_unused: d.if_unused,
                })
                .await?;
                if !d.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(
                        exchange::DeleteOk {},
                    )));
                }
            }
            exchange::AMQPMethod::Bind(b) => {
                self.permit("exchange", b.destination.as_str(), Perm::Write)?;
                self.permit("exchange", b.source.as_str(), Perm::Read)?;
                self.meta(MetaCommand::BindExchange {
                    vhost: self.session.vhost.clone(),
                    destination: b.destination.as_str().into(),
                    source: b.source.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                self.session.broker.topology_changed();
                if !b.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::BindOk(
                        exchange::BindOk {},
                    )));
                }
            }
            exchange::AMQPMethod::Unbind(b) => {
                self.permit("exchange", b.destination.as_str(), Perm::Write)?;
                self.permit("exchange", b.source.as_str(), Perm::Read)?;
                self.meta(MetaCommand::UnbindExchange {
                    vhost: self.session.vhost.clone(),
                    destination: b.destination.as_str().into(),
                    source: b.source.as_str().into(),
                    routing_key: b.routing_key.as_str().into(),
                    arguments: b.arguments,
                })
                .await?;
                if !b.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(
                        exchange::UnbindOk {},
                    )));
                }
            }

            _ => return Err(ProtocolError::command_invalid("unexpected exchange method")),
        }
        Ok(())
    }
}
