//! A connection's table of channels: it routes each channel's frames, the
//! deliveries and cancellations of its consumers and the confirms of its
//! publishes to that channel, runs a channel's inputs as one future beside
//! everything else the connection does, and collects what channels write.
//! Nothing here waits on a channel: a channel busy with a Raft write gets
//! its later inputs at its next run.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use amq_protocol::protocol::{channel, AMQPClass};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use super::channel::{Channel, Completion, Escalation, Event, Input, Session};
use super::codec::{self, InFrame};
use super::error::ProtocolError;
use super::output::Output;
use crate::consumers::ConnEvent;

/// Frame bytes held for busy channels above which the socket is not read until
/// they catch up (bytes): a client pipelining behind a channel that waits on
/// Raft cannot grow the broker's memory without bound.
const HELD_INPUT_MAX: usize = 8 << 20;

/// A channel's run: the channel back, and a connection-level error it raised.
type Run = BoxFuture<'static, (Box<Channel>, Option<Escalation>)>;

/// One channel as the connection sees it: the channel itself while it is
/// idle (None while a run holds it), and the inputs waiting for its next
/// run, in arrival order.
struct Slot {
    channel: Option<Box<Channel>>,
    inputs: VecDeque<Input>,
    /// Frame bytes among `inputs` (counted in `Channels::held_bytes`).
    held: usize,
}

/// The channels of one connection.
#[derive(Default)]
pub struct Channels {
    /// What the channels share, once the connection is open.
    session: Option<Arc<Session>>,
    /// The channels by [`Channel::key`]: the open ones, and closed ones
    /// still finishing their close.
    slots: HashMap<u64, Slot>,
    /// Open channel numbers and their keys. A channel the client closed
    /// (channel.close or close-ok routed to it) leaves this table at once,
    /// so the client may open the number again straight away.
    numbers: HashMap<u16, u64>,
    /// The key of the next channel opened.
    next_key: u64,
    /// Channel runs in progress; the connection polls them.
    pub runs: FuturesUnordered<Run>,
    /// Confirm waits of confirm-mode publishes; the connection polls them
    /// and hands what completes to [`Channels::on_completions`].
    pub confirms: FuturesUnordered<BoxFuture<'static, Completion>>,
    /// Frame bytes waiting for busy channels (see [`HELD_INPUT_MAX`]).
    held_bytes: usize,
}

impl Channels {
    /// The connection is open: channels may be opened in `session`.
    pub fn open(&mut self, session: Arc<Session>) {
        self.session = Some(session);
    }

    /// True while busy channels hold more than [`HELD_INPUT_MAX`] bytes of
    /// frames: the socket is not read meanwhile.
    pub fn holding_too_much(&self) -> bool {
        self.held_bytes > HELD_INPUT_MAX
    }

    /// Hands a frame to channel `ch`, opening it on channel.open (open-ok,
    /// and close-ok for a channel.close on a channel not open, go to `out`).
    ///
    /// Errors: 504 CHANNEL_ERROR for a frame on a channel that is not open,
    /// 530 NOT_ALLOWED past `channel_max` (connection errors).
    pub fn route(
        &mut self,
        ch: u16,
        frame: InFrame,
        channel_max: u16,
        out: &mut Output,
    ) -> Result<(), ProtocolError> {
        if !self.numbers.contains_key(&ch) {
            return self.route_unopened(ch, &frame, channel_max, out);
        }
        let closes = matches!(
            &frame,
            InFrame::Method(
                _,
                AMQPClass::Channel(channel::AMQPMethod::Close(_) | channel::AMQPMethod::CloseOk(_))
            )
        );
        let key = if closes {
            self.numbers.remove(&ch)
        } else {
            self.numbers.get(&ch).copied()
        };
        let Some(slot) = key.and_then(|k| self.slots.get_mut(&k)) else {
            return Ok(());
        };
        let size = match &frame {
            InFrame::Body(_, b) => b.len() + 64,
            _ => 64,
        };
        slot.held += size;
        self.held_bytes += size;
        slot.inputs.push_back(Input::Frame(frame));
        Ok(())
    }

    /// A frame on a channel number that is not open: channel.open opens it,
    /// channel.close is answered with close-ok, close-ok is ignored.
    fn route_unopened(
        &mut self,
        ch: u16,
        frame: &InFrame,
        channel_max: u16,
        out: &mut Output,
    ) -> Result<(), ProtocolError> {
        let InFrame::Method(_, AMQPClass::Channel(m)) = frame else {
            return Err(not_open(ch));
        };
        match m {
            channel::AMQPMethod::Open(_) => {
                if ch > channel_max {
                    return Err(ProtocolError::connection(
                        530,
                        format!("NOT_ALLOWED - channel number {ch} exceeds channel_max"),
                    ));
                }
                let Some(session) = self.session.clone() else {
                    return Err(ProtocolError::command_invalid("connection is not open"));
                };
                let key = self.next_key;
                self.next_key += 1;
                self.numbers.insert(ch, key);
                self.slots.insert(
                    key,
                    Slot {
                        channel: Some(Channel::new(ch, key, session)),
                        inputs: VecDeque::new(),
                        held: 0,
                    },
                );
                codec::write_method(
                    out,
                    ch,
                    AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
                );
                Ok(())
            }
            channel::AMQPMethod::Close(_) => {
                codec::write_method(
                    out,
                    ch,
                    AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                );
                Ok(())
            }
            channel::AMQPMethod::CloseOk(_) => Ok(()),
            _ => Err(not_open(ch)),
        }
    }

    /// Starts a run for every idle channel that has inputs.
    pub fn launch_ready(&mut self) {
        for slot in self.slots.values_mut() {
            if slot.inputs.is_empty() {
                continue;
            }
            let Some(channel) = slot.channel.take() else {
                continue;
            };
            let inputs = std::mem::take(&mut slot.inputs);
            self.held_bytes -= std::mem::take(&mut slot.held);
            self.runs.push(Box::pin(channel.run(inputs)));
        }
    }

    /// A channel's run ended: its frames go to `out`, deliveries already
    /// queued in the mailbox `mrx` go out before its deferred frames (a
    /// basic.cancel-ok follows the consumer's last delivery), a closed
    /// channel is forgotten, and inputs that arrived meanwhile start its
    /// next run.
    pub fn on_run_done(
        &mut self,
        mut channel: Box<Channel>,
        out: &mut Output,
        mrx: &mut mpsc::UnboundedReceiver<ConnEvent>,
    ) {
        take_output(out, &mut channel);
        self.confirms.extend(channel.take_confirm_waits());
        let key = channel.key();
        let ended = channel.ended();
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.channel = Some(channel);
        }
        while let Ok(e) = mrx.try_recv() {
            self.on_event(e, out);
        }
        if let Some(c) = self.slots.get_mut(&key).and_then(|s| s.channel.as_mut()) {
            c.flush_deferred();
            take_output(out, c);
        }
        if ended {
            if let Some(slot) = self.slots.remove(&key) {
                self.held_bytes -= slot.held;
            }
            self.numbers.retain(|_, k| *k != key);
        } else {
            self.launch_ready();
        }
    }

    /// A delivery or cancellation for one of the connection's consumers: to
    /// its channel, at once when the channel is idle (its frames to `out`),
    /// else after the inputs it already has.
    pub fn on_event(&mut self, e: ConnEvent, out: &mut Output) {
        let (key, event) = match e {
            ConnEvent::Delivery { channel, delivery } => (channel, Event::Delivery(delivery)),
            ConnEvent::Cancelled { channel, consumer } => (channel, Event::Cancelled(consumer)),
            ConnEvent::TimedOut {
                channel,
                consumer,
                timeout_ms,
            } => (
                channel,
                Event::TimedOut {
                    consumer,
                    timeout_ms,
                },
            ),
        };
        let Some(slot) = self.slots.get_mut(&key) else {
            tracing::debug!(target: "deliveries", channel = key, "dropped: the channel is closed");
            return;
        };
        match slot.channel.as_mut() {
            Some(c) => {
                // An idle channel's output is empty: it writes straight into `out`.
                std::mem::swap(out, c.output());
                c.on_event(event);
                std::mem::swap(out, c.output());
            }
            None => slot.inputs.push_back(Input::Event(event)),
        }
    }

    /// Confirm-mode publishes completed: `first`, and every other completion
    /// already ready, are recorded before confirms are written to `out`, so a
    /// burst goes out as one `multiple` ack rather than one frame per wake-up.
    /// (The futures complete in any order — `FuturesUnordered` yields a woken
    /// earlier publish after newer, never-polled ones — and the tracker puts
    /// them back in publish order.) A busy channel gets them as inputs.
    pub fn on_completions(&mut self, first: Completion, out: &mut Output) {
        let mut touched: Vec<u64> = Vec::new();
        let mut next = Some(first);
        while let Some(Completion::Confirm { channel, seq, ok }) = next {
            if let Some(slot) = self.slots.get_mut(&channel) {
                match slot.channel.as_mut() {
                    Some(c) => {
                        c.confirmed(seq, ok);
                        if !touched.contains(&channel) {
                            touched.push(channel);
                        }
                    }
                    None => slot
                        .inputs
                        .push_back(Input::Event(Event::Confirmed { seq, ok })),
                }
            }
            next = self.confirms.next().now_or_never().flatten();
        }
        for key in touched {
            if let Some(c) = self.slots.get_mut(&key).and_then(|s| s.channel.as_mut()) {
                c.send_confirms();
                take_output(out, c);
            }
        }
    }

    /// The connection is ending: frames already read are served (an ack
    /// before connection.close still settles), runs in progress finish (they
    /// hold their channels' consumers), then every channel is released (its
    /// consumers' unacked messages return to their queues). Frames go to `out`.
    pub async fn close_all(&mut self, out: &mut Output) {
        loop {
            self.launch_ready();
            let Some((mut channel, escalation)) = self.runs.next().await else {
                break;
            };
            take_output(out, &mut channel);
            let key = channel.key();
            if channel.ended() {
                self.slots.remove(&key);
            } else if let Some(slot) = self.slots.get_mut(&key) {
                if escalation.is_some() {
                    slot.inputs.clear();
                }
                slot.channel = Some(channel);
            }
        }
        for (_, slot) in self.slots.drain() {
            if let Some(mut c) = slot.channel {
                c.release().await;
            }
        }
        self.numbers.clear();
        self.held_bytes = 0;
    }
}

/// 504 CHANNEL_ERROR for a frame on channel `ch`, which is not open.
fn not_open(ch: u16) -> ProtocolError {
    ProtocolError::connection(
        504,
        format!("CHANNEL_ERROR - expected 'channel.open' for channel {ch}"),
    )
}

/// Appends channel `c`'s output to `out`.
fn take_output(out: &mut Output, c: &mut Channel) {
    let o = c.output();
    if out.is_empty() {
        std::mem::swap(out, o);
    } else if !o.is_empty() {
        out.append(o);
    }
}
