//! The tx class: AMQP 0-9-1 transactions as RabbitMQ runs them (publishes
//! and settlements of the channel take effect at tx.commit, in order).

use amq_protocol::protocol::{tx, AMQPClass};

use super::{Channel, Result};
use crate::amqp::error::ProtocolError;

impl Channel {
    /// tx class (AMQP 0-9-1 transactions as RabbitMQ: publishes and
    /// settlements of the channel take effect at tx.commit, in order).
    pub(super) async fn on_tx(&mut self, m: tx::AMQPMethod) -> Result<()> {
        match m {
            tx::AMQPMethod::Select(_) => {
                if self.confirms.is_some() {
                    return Err(ProtocolError::precondition(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                self.tx.get_or_insert_with(Vec::new);
                self.send(AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})));
            }
            tx::AMQPMethod::Commit(_) => {
                let Some(actions) = self.tx.as_mut().map(std::mem::take) else {
                    return Err(ProtocolError::precondition("channel is not transactional"));
                };
                let mut waits = Vec::with_capacity(actions.len());
                for (q, cmd) in actions {
                    waits.push(q.propose(cmd).await);
                }
                for w in waits {
                    if let Ok(Err(e)) = w.await {
                        return Err(ProtocolError::internal(e));
                    }
                }
                self.send(AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})));
            }
            tx::AMQPMethod::Rollback(_) => {
                let Some(actions) = self.tx.as_mut() else {
                    return Err(ProtocolError::precondition("channel is not transactional"));
                };
                actions.clear();
                self.send(AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})));
            }
            _ => return Err(ProtocolError::command_invalid("unexpected tx method")),
        }
        Ok(())
    }
}
