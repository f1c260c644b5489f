//! Finding and reaching a quorum queue's leader: the local replica's view,
//! the last leader a forwarded call named, else the members in turn; and
//! sending one write there until it is applied (forwarded over gRPC when
//! the leader is another node, resent after a leader change).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};

use super::forward::{Forwarded, Forwarder};
use super::status::QueueStatus;
use super::types::{GroupCommand, GroupReply, Origin, Raft};
use crate::queue::error::QueueError;
use crate::queue::types::QueueCommand;

/// A proposal still not applied after this long is logged (and again after
/// each further period); it is retried until applied or the queue closes.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// One forwarded call's time limit (a leader seen down is given up at once).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// A write's outcome: the group's reply, or why it failed (as text).
pub type WriteResult = Result<GroupReply, String>;

/// Where a quorum queue's leader is: the local replica's view, else the last
/// leader a forwarded call named, else the members in turn.
pub struct Route {
    group: u64,
    /// The local replica's Raft handle; set and cleared as this node
    /// becomes or stops being a member (`add_member` / `delete_member`).
    raft: RwLock<Option<Raft>>,
    members: RwLock<Vec<u64>>,
    /// Last known leader (0 = none).
    hint: AtomicU64,
    forwarder: Arc<Forwarder>,
}

impl Route {
    /// The route of `group` with these members; `raft` = the local replica.
    pub fn new(
        group: u64,
        raft: Option<Raft>,
        members: Vec<u64>,
        forwarder: Arc<Forwarder>,
    ) -> Arc<Route> {
        Arc::new(Route {
            group,
            raft: RwLock::new(raft),
            members: RwLock::new(members),
            hint: AtomicU64::new(0),
            forwarder,
        })
    }

    /// The group's id.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// This node's id.
    pub fn me(&self) -> u64 {
        self.forwarder.me()
    }

    /// The group's members (node ids).
    pub fn members(&self) -> Vec<u64> {
        self.members.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// Takes the member list of the meta record (a no-op when unchanged).
    pub fn update_members(&self, members: &[u64]) {
        if self.members.read().is_ok_and(|m| m[..] == *members) {
            return;
        }
        if let Ok(mut m) = self.members.write() {
            *m = members.to_vec();
        }
    }

    /// The local replica's Raft handle (None: no replica here).
    pub fn raft(&self) -> Option<Raft> {
        self.raft.read().ok().and_then(|r| r.clone())
    }

    /// Installs (Some) or removes (None) the local replica's Raft handle;
    /// returns the one it replaces.
    pub fn set_raft(&self, raft: Option<Raft>) -> Option<Raft> {
        match self.raft.write() {
            Ok(mut r) => std::mem::replace(&mut *r, raft),
            Err(_) => None,
        }
    }

    /// The local replica's Raft handle when this node is its leader.
    /// None while this node drains (its writes go wherever the group
    /// moves, see `cluster::drain`).
    pub fn local_leader(&self) -> Option<Raft> {
        if self.forwarder.detector().is_draining() {
            return None;
        }
        let raft = self.raft()?;
        let leads = raft.metrics().borrow().current_leader == Some(self.me());
        leads.then_some(raft)
    }

    /// The leader as far as this node knows (None = unknown).
    pub fn leader(&self) -> Option<u64> {
        if let Some(raft) = self.raft() {
            if let Some(l) = raft.metrics().borrow().current_leader {
                return Some(l);
            }
        }
        match self.hint.load(Ordering::Relaxed) {
            0 => None,
            l => Some(l),
        }
    }

    fn set_hint(&self, leader: Option<u64>) {
        self.hint.store(leader.unwrap_or(0), Ordering::Relaxed);
    }

    /// The node to send the next attempt to: the known leader if it is up,
    /// else the `attempt`-th live member (never this node while it drains).
    fn target(&self, attempt: usize) -> Option<u64> {
        let detector = self.forwarder.detector();
        if let Some(l) = self.leader().filter(|l| detector.may_lead(*l)) {
            return Some(l);
        }
        let live: Vec<u64> = self
            .members()
            .into_iter()
            .filter(|m| detector.may_lead(*m))
            .collect();
        if live.is_empty() {
            return None;
        }
        Some(live[attempt % live.len()])
    }

    /// Counts from the leader's replica (or any member's), this node's own
    /// when it leads or nothing else answers.
    pub async fn status(&self, local: Option<QueueStatus>) -> QueueStatus {
        let leader = self.leader();
        if leader == Some(self.me()) {
            if let Some(s) = local {
                return s;
            }
        }
        let mut order: Vec<u64> = leader.into_iter().collect();
        order.extend(self.members().into_iter().filter(|m| Some(*m) != leader));
        for node in order {
            if node == self.me() {
                if let Some(s) = &local {
                    return s.clone();
                }
                continue;
            }
            if !self.forwarder.detector().is_alive(node) {
                continue;
            }
            if let Some(s) = self.forwarder.query(node, self.group).await {
                return s;
            }
        }
        local.unwrap_or_default()
    }

    /// Sends `cmd` to whoever leads until it is applied or the queue's group
    /// was shut down (deleted, node stopping); logged every [`RETRY_FOR`]
    /// meanwhile. Never given up otherwise: a proposer's sequence numbers
    /// apply strictly in order, so a skipped one would leave every later
    /// proposal out of sequence (a minority node's publishers wait, as
    /// RabbitMQ's do, until a majority is reachable).
    ///
    /// `origin` tags the write as this node's; `closed` tells when the queue's
    /// group was shut down.
    pub async fn send_until_done(
        &self,
        cmd: &QueueCommand,
        origin: Origin,
        closed: impl Fn() -> bool,
    ) -> WriteResult {
        let mut started = Instant::now();
        let mut attempt = 0usize;
        let me = self.me();
        let bytes = raft_log::codec::encode(cmd).map_err(|e| e.to_string())?;
        let mut last_error = String::from("no leader");
        loop {
            if started.elapsed() >= RETRY_FOR {
                tracing::warn!(group = self.group, error = %last_error, "a write is still not applied; retrying");
                started = Instant::now();
            }
            if closed() {
                return Err(QueueError::Unavailable.to_string());
            }
            match (self.target(attempt), self.raft()) {
                (Some(t), Some(raft)) if t == me => {
                    let write = raft.client_write(GroupCommand::Queue {
                        origin,
                        cmd: cmd.clone(),
                    });
                    match tokio::time::timeout(FORWARD_TIMEOUT, write).await {
                        Ok(Ok(resp)) if resp.data.is_out_of_sequence() => {
                            last_error = "out of sequence".into();
                        }
                        Ok(Ok(resp)) => return Ok(resp.data),
                        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                            self.set_hint(f.leader_id.filter(|l| *l != me));
                            // At once to a leader the detector sees up; one it sees
                            // down would send the next attempt straight back here
                            // (the only live member), and the group would spin
                            // without a pause (a restarted node with 10,000 groups
                            // whose detector had not reached its peers yet: issue 31).
                            match f.leader_id.filter(|l| *l != me) {
                                Some(l) if self.forwarder.detector().may_lead(l) => continue,
                                Some(l) => last_error = format!("leader {l} is down"),
                                None => last_error = "no leader elected".into(),
                            }
                        }
                        // The group is shut down: nothing will ever apply it here.
                        Ok(Err(RaftError::Fatal(e))) => return Err(e.to_string()),
                        Ok(Err(e)) => last_error = e.to_string(),
                        Err(_) => last_error = "local write timed out".into(),
                    }
                }
                (Some(t), _) if t != me => {
                    match self
                        .forwarder
                        .propose(t, self.group, bytes.clone().into(), FORWARD_TIMEOUT)
                        .await
                    {
                        Forwarded::Reply(r, _) if r.is_out_of_sequence() => {
                            self.set_hint(Some(t));
                            last_error = "out of sequence".into();
                        }
                        Forwarded::Reply(r, _) => {
                            self.set_hint(Some(t));
                            return Ok(r);
                        }
                        Forwarded::Leader(l)
                            if l != 0 && l != t && self.forwarder.detector().may_lead(l) =>
                        {
                            self.set_hint(Some(l));
                            continue;
                        }
                        Forwarded::Leader(_) => {
                            self.set_hint(None);
                            last_error = format!("node {t} knows no leader");
                        }
                        Forwarded::NoGroup => {
                            self.set_hint(None);
                            last_error = format!("node {t} does not run the queue yet");
                        }
                        Forwarded::Failed(e) => {
                            self.set_hint(None);
                            last_error = e;
                        }
                    }
                }
                _ => last_error = "no member of the queue is reachable".into(),
            }
            attempt += 1;
            // Poll quickly through an election (about a lease, see
            // cluster::LEADER_LEASE_MS, and a vote), slowly after a second;
            // with a local replica, go again as soon as it sees a new leader
            // (a new queue's first publish no longer waits out a poll).
            let pause = Duration::from_millis(if attempt < 50 { 20 } else { 100 });
            match self.raft() {
                Some(raft) => {
                    let before = raft.metrics().borrow().current_leader;
                    let _ = raft
                        .wait(Some(pause))
                        .metrics(
                            |m| m.current_leader.is_some() && m.current_leader != before,
                            "a new leader",
                        )
                        .await;
                }
                None => tokio::time::sleep(pause).await,
            }
        }
    }
}
