//! The admin gRPC service quorumqctl talks to (proto `quorumq.v1.Admin`),
//! served on the cluster listener. Queue reads answered by the leader
//! (`peek`, `inspect_dead_letters`, `quorum_status`) live in `inspect`,
//! the message shape of peek in `peek`, the quorum health checks in `health`,
//! moving messages back where they died in `redrive`.

pub mod health;
pub mod inspect;
pub mod peek;
pub mod redrive;

use std::sync::Arc;

use futures::StreamExt;
use quorumq_proto::v1::admin_server::{Admin, AdminServer};
use quorumq_proto::v1::{
    set_memory_watermark_request::Limit, CloseConnectionRequest, JsonReply, LeaderlessRequest,
    QueueReadRequest, QuorumCriticalRequest, RedriveRequest, SetMemoryWatermarkRequest,
    TrackingRequest,
};
use quorumq_proto::v1::{
    AddVhostRequest, AdminReply, CampaignRequest, ClearPolicyRequest, ClusterStatusNode,
    ClusterStatusReply, ClusterStatusRequest, DeleteVhostRequest, DrainReply, DrainRequest,
    ForgetReply, ForgetRequest, GrowRequest, ListPoliciesReply, ListPoliciesRequest,
    ListQueuesReply, ListQueuesRequest, ListVhostLimitsReply, ListVhostLimitsRequest,
    ListVhostsReply, ListVhostsRequest, MemberRequest, MemberResult, MemberResults, NodeLeaders,
    Policy as PbPolicy, QueueInfo, RebalanceReply, RebalanceRequest, ReviveRequest,
    SetPolicyRequest, SetVhostLimitsRequest, ShrinkRequest, StatusReply, StatusRequest, VhostInfo,
    VhostLimits as PbVhostLimits,
};
use quorumq_proto::v1::{
    ListPermissionsReply, ListPermissionsRequest, ListUsersReply, ListUsersRequest,
    PermissionRequest, UserInfo, UserRequest,
};
use tonic::{Request, Response, Status};

use crate::cluster::drain;
use crate::cluster::membership::{self, Change};
use crate::meta::command::MetaCommand;
use crate::meta::policy::Policy;
use crate::meta::QueueKind;
use crate::node::Broker;

/// `list_queues` asks at most this many queues' statuses at once (each may be
/// a gRPC query to the queue's leader on another node).
const QUEUE_STATUS_CONCURRENCY: usize = 32;

/// `cluster_status` waits this long for each running node's own status.
const NODE_STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long `drain` waits for each queue's leadership to move.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Admin API implementation over a running node.
pub struct AdminService {
    broker: Arc<Broker>,
}

impl AdminService {
    /// The tonic server for `broker`.
    pub fn server(broker: Arc<Broker>) -> AdminServer<AdminService> {
        AdminServer::new(AdminService { broker })
    }

    async fn write(&self, cmd: MetaCommand) -> AdminReply {
        match self.broker.operator_write(cmd).await {
            Ok(_) => AdminReply {
                ok: true,
                error: String::new(),
            },
            Err(
                crate::amqp::error::ProtocolError::Channel { text, .. }
                | crate::amqp::error::ProtocolError::Connection { text, .. },
            ) => AdminReply {
                ok: false,
                error: text,
            },
        }
    }
}

impl AdminService {
    /// add_member / delete_member: one queue, one node ([`membership::change_member`]).
    async fn change_member(&self, r: MemberRequest, change: Change) -> MemberResult {
        let vhost = vhost_or_default(&r.vhost);
        membership::change_member(
            self.broker.queues(),
            &vhost,
            &r.queue,
            r.node,
            change,
            r.forwarded,
        )
        .await
    }
}

/// A RabbitMQ-layout password hash of `password` with a fresh random salt; empty (no
/// password: every login refused) for an empty password, as `rabbitmqctl clear_password`.
fn new_hash(password: &str) -> Vec<u8> {
    if password.is_empty() {
        return Vec::new();
    }
    crate::meta::access::hash_password(rand::random(), password.as_bytes())
}

fn vhost_or_default(v: &str) -> String {
    if v.is_empty() {
        "/".into()
    } else {
        v.into()
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(&self, _req: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let queues = self.broker.queue_handles().len() as u64;
        let cluster = self.broker.cluster_status();
        let (leaders, replicas) = self.broker.leaders_and_replicas();
        Ok(Response::new(StatusReply {
            node_id: self.broker.node_id(),
            version: env!("CARGO_PKG_VERSION").into(),
            queues,
            connections: 0,
            members: cluster.nodes.iter().map(|n| n.id).collect(),
            meta_leader: cluster.meta_leader,
            uptime_s: self.broker.detector().uptime().as_secs(),
            leaders,
            replicas,
            draining: self.broker.detector().is_draining(),
        }))
    }

    /// Nodes and liveness as this node sees them, each running node's
    /// version, uptime, leaders and replicas from its own `status`.
    async fn cluster_status(
        &self,
        _req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusReply>, Status> {
        let cluster = self.broker.cluster_status();
        let me = self.broker.node_id();
        let nodes = futures::stream::iter(cluster.nodes)
            .map(|n| async move {
                let own = if !n.running {
                    None
                } else if n.id == me {
                    self.status(Request::new(StatusRequest {}))
                        .await
                        .ok()
                        .map(Response::into_inner)
                } else {
                    match membership::admin_client(self.broker.queues(), n.id) {
                        Ok(mut c) => {
                            tokio::time::timeout(NODE_STATUS_TIMEOUT, c.status(StatusRequest {}))
                                .await
                                .ok()
                                .and_then(Result::ok)
                                .map(Response::into_inner)
                        }
                        Err(_) => None,
                    }
                };
                ClusterStatusNode {
                    id: n.id,
                    cluster_addr: n.cluster_addr,
                    amqp_addr: n.amqp_addr,
                    running: n.running,
                    version: own.as_ref().map(|s| s.version.clone()),
                    uptime_s: own.as_ref().map(|s| s.uptime_s),
                    leaders: own.as_ref().map(|s| s.leaders),
                    replicas: own.as_ref().map(|s| s.replicas),
                    draining: own.as_ref().map(|s| s.draining),
                }
            })
            .buffered(8)
            .collect()
            .await;
        Ok(Response::new(ClusterStatusReply {
            nodes,
            meta_leader: cluster.meta_leader,
            node_id: me,
        }))
    }

    async fn drain(&self, _req: Request<DrainRequest>) -> Result<Response<DrainReply>, Status> {
        let r = drain::drain(self.broker.queues(), DRAIN_FOR).await;
        Ok(Response::new(DrainReply {
            moved: r.moved,
            kept: r.kept,
            failed: r
                .failed
                .into_iter()
                .map(|(q, e)| format!("{q}: {e}"))
                .collect(),
        }))
    }

    async fn set_memory_watermark(
        &self,
        req: Request<SetMemoryWatermarkRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let bytes = match req.into_inner().limit {
            Some(Limit::Bytes(b)) => b,
            Some(Limit::Fraction(f)) if f.is_finite() && f >= 0.0 => {
                crate::alarms::total_memory_bytes()
                    .map_or(u64::MAX, |total| (total as f64 * f) as u64)
            }
            Some(Limit::Fraction(f)) => {
                return Err(Status::invalid_argument(format!(
                    "the watermark fraction must be a number of 0 or more, not {f}"
                )))
            }
            None => return Err(Status::invalid_argument("no watermark given")),
        };
        self.broker.alarms().set_memory_limit(bytes);
        Ok(Response::new(AdminReply {
            ok: true,
            error: String::new(),
        }))
    }

    async fn revive(&self, _req: Request<ReviveRequest>) -> Result<Response<AdminReply>, Status> {
        drain::revive(self.broker.queues());
        Ok(Response::new(AdminReply {
            ok: true,
            error: String::new(),
        }))
    }

    async fn add_member(
        &self,
        req: Request<MemberRequest>,
    ) -> Result<Response<MemberResult>, Status> {
        Ok(Response::new(
            self.change_member(req.into_inner(), Change::Add).await,
        ))
    }

    async fn delete_member(
        &self,
        req: Request<MemberRequest>,
    ) -> Result<Response<MemberResult>, Status> {
        Ok(Response::new(
            self.change_member(req.into_inner(), Change::Remove).await,
        ))
    }

    async fn grow(&self, req: Request<GrowRequest>) -> Result<Response<MemberResults>, Status> {
        let r = req.into_inner();
        let results = membership::grow(
            self.broker.queues(),
            r.node,
            &r.strategy,
            &r.vhost_pattern,
            &r.queue_pattern,
        )
        .await
        .map_err(Status::invalid_argument)?;
        Ok(Response::new(MemberResults { results }))
    }

    async fn shrink(&self, req: Request<ShrinkRequest>) -> Result<Response<MemberResults>, Status> {
        let r = req.into_inner();
        let mut results = membership::shrink(self.broker.queues(), r.node).await;
        if r.errors_only {
            results.retain(|x| !x.ok);
        }
        Ok(Response::new(MemberResults { results }))
    }

    async fn forget_cluster_node(
        &self,
        req: Request<ForgetRequest>,
    ) -> Result<Response<ForgetReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            match membership::forget_node(self.broker.queues(), r.node, r.forwarded).await {
                Ok(queues) => ForgetReply {
                    ok: true,
                    error: String::new(),
                    queues,
                },
                Err(error) => ForgetReply {
                    ok: false,
                    error,
                    queues: Vec::new(),
                },
            },
        ))
    }

    async fn rebalance(
        &self,
        req: Request<RebalanceRequest>,
    ) -> Result<Response<RebalanceReply>, Status> {
        let r = req.into_inner();
        let (nodes, moved) =
            membership::rebalance(self.broker.queues(), &r.vhost_pattern, &r.queue_pattern)
                .await
                .map_err(Status::invalid_argument)?;
        Ok(Response::new(RebalanceReply {
            nodes: nodes
                .into_iter()
                .map(|(node, leaders)| NodeLeaders { node, leaders })
                .collect(),
            moved,
        }))
    }

    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let group = req.into_inner().group_id;
        Ok(Response::new(
            match membership::campaign(self.broker.queues(), group).await {
                Ok(()) => AdminReply {
                    ok: true,
                    error: String::new(),
                },
                Err(error) => AdminReply { ok: false, error },
            },
        ))
    }

    async fn set_policy(
        &self,
        req: Request<SetPolicyRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let Some(p) = req.into_inner().policy else {
            return Err(Status::invalid_argument("policy missing"));
        };
        let definition: serde_json::Value = match serde_json::from_str(&p.definition_json) {
            Ok(v) => v,
            Err(e) => {
                return Ok(Response::new(AdminReply {
                    ok: false,
                    error: format!("invalid JSON definition: {e}"),
                }))
            }
        };
        let policy = Policy {
            vhost: vhost_or_default(&p.vhost),
            name: p.name,
            pattern: p.pattern,
            definition,
            priority: p.priority,
            apply_to: if p.apply_to.is_empty() {
                "all".into()
            } else {
                p.apply_to
            },
        };
        Ok(Response::new(
            self.write(MetaCommand::SetPolicy(policy)).await,
        ))
    }

    async fn clear_policy(
        &self,
        req: Request<ClearPolicyRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::ClearPolicy {
                vhost: vhost_or_default(&r.vhost),
                name: r.name,
            })
            .await,
        ))
    }

    async fn list_policies(
        &self,
        req: Request<ListPoliciesRequest>,
    ) -> Result<Response<ListPoliciesReply>, Status> {
        let vhost = vhost_or_default(&req.into_inner().vhost);
        let policies = self
            .broker
            .with_topology(|t| t.policies(&vhost))
            .unwrap_or_default()
            .into_iter()
            .map(|p| PbPolicy {
                vhost: p.vhost,
                name: p.name,
                pattern: p.pattern,
                definition_json: p.definition.to_string(),
                priority: p.priority,
                apply_to: p.apply_to,
            })
            .collect();
        Ok(Response::new(ListPoliciesReply { policies }))
    }

    async fn set_vhost_limits(
        &self,
        req: Request<SetVhostLimitsRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        let limits = match crate::meta::VhostLimits::parse(&r.definition_json) {
            Ok(l) => l,
            Err(error) => return Ok(Response::new(AdminReply { ok: false, error })),
        };
        Ok(Response::new(
            self.write(MetaCommand::SetVhostLimits {
                vhost: vhost_or_default(&r.vhost),
                limits,
            })
            .await,
        ))
    }

    async fn list_vhost_limits(
        &self,
        req: Request<ListVhostLimitsRequest>,
    ) -> Result<Response<ListVhostLimitsReply>, Status> {
        let r = req.into_inner();
        let vhost = vhost_or_default(&r.vhost);
        let limits = self
            .broker
            .with_topology(|t| {
                t.vhosts()
                    .filter(|v| r.global || *v == vhost)
                    .map(|v| (v.to_string(), t.vhost_limits(v)))
                    .filter(|(_, l)| !l.is_empty())
                    .map(|(vhost, l)| PbVhostLimits {
                        vhost,
                        definition_json: l.to_json(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(ListVhostLimitsReply { limits }))
    }

    async fn add_vhost(
        &self,
        req: Request<AddVhostRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::AddVhost {
                name: r.name,
                default_queue_type: Some(r.default_queue_type).filter(|t| !t.is_empty()),
            })
            .await,
        ))
    }

    async fn delete_vhost(
        &self,
        req: Request<DeleteVhostRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let name = req.into_inner().name;
        Ok(Response::new(
            self.write(MetaCommand::DeleteVhost { name }).await,
        ))
    }

    async fn list_vhosts(
        &self,
        _req: Request<ListVhostsRequest>,
    ) -> Result<Response<ListVhostsReply>, Status> {
        let vhosts = self
            .broker
            .with_topology(|t| {
                t.vhosts()
                    .map(|v| VhostInfo {
                        name: v.to_string(),
                        default_queue_type: t
                            .vhost_settings(v)
                            .default_queue_type
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(ListVhostsReply { vhosts }))
    }

    async fn add_user(&self, req: Request<UserRequest>) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        let user = crate::meta::access::User {
            name: r.name,
            password_hash: new_hash(&r.password),
            tags: r.tags,
        };
        Ok(Response::new(self.write(MetaCommand::AddUser(user)).await))
    }

    async fn delete_user(&self, req: Request<UserRequest>) -> Result<Response<AdminReply>, Status> {
        let name = req.into_inner().name;
        Ok(Response::new(
            self.write(MetaCommand::DeleteUser { name }).await,
        ))
    }

    async fn change_password(
        &self,
        req: Request<UserRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::SetPasswordHash {
                name: r.name,
                hash: new_hash(&r.password),
            })
            .await,
        ))
    }

    async fn set_user_tags(
        &self,
        req: Request<UserRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::SetUserTags {
                name: r.name,
                tags: r.tags,
            })
            .await,
        ))
    }

    async fn list_users(
        &self,
        _req: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersReply>, Status> {
        let users = self
            .broker
            .with_topology(|t| {
                t.access()
                    .users()
                    .map(|u| UserInfo {
                        name: u.name.clone(),
                        tags: u.tags.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(ListUsersReply { users }))
    }

    async fn set_permissions(
        &self,
        req: Request<PermissionRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::SetPermissions {
                user: r.user,
                vhost: vhost_or_default(&r.vhost),
                permission: crate::meta::access::Permission {
                    configure: r.configure,
                    write: r.write,
                    read: r.read,
                },
            })
            .await,
        ))
    }

    async fn clear_permissions(
        &self,
        req: Request<PermissionRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.write(MetaCommand::ClearPermissions {
                user: r.user,
                vhost: vhost_or_default(&r.vhost),
            })
            .await,
        ))
    }

    async fn list_permissions(
        &self,
        req: Request<ListPermissionsRequest>,
    ) -> Result<Response<ListPermissionsReply>, Status> {
        let vhost = vhost_or_default(&req.into_inner().vhost);
        let permissions = self
            .broker
            .with_topology(|t| {
                t.access()
                    .permissions()
                    .filter(|(_, v, _)| *v == vhost)
                    .map(|(u, v, p)| PermissionRequest {
                        vhost: v.to_string(),
                        user: u.to_string(),
                        configure: p.configure.clone(),
                        write: p.write.clone(),
                        read: p.read.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(ListPermissionsReply { permissions }))
    }

    async fn list_queues(
        &self,
        req: Request<ListQueuesRequest>,
    ) -> Result<Response<ListQueuesReply>, Status> {
        let vhost = vhost_or_default(&req.into_inner().vhost);
        // Each queue with its effective policy's name, under one topology lock.
        let records: Vec<_> = self
            .broker
            .with_topology(|t| {
                t.queues()
                    .filter(|q| q.vhost == vhost)
                    .map(|q| {
                        let policy = t.queue_policy(&q.vhost, &q.name).map(|p| p.name.clone());
                        (q.clone(), policy)
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Placement and counts of every queue. A queue led elsewhere costs a
        // round trip to its leader (up to 2 s per unanswering member), so
        // these run concurrently, at most QUEUE_STATUS_CONCURRENCY at a time.
        let asks: Vec<_> = records
            .iter()
            .map(|(rec, _)| self.broker.queue_status(rec))
            .collect();
        let statuses: Vec<_> = futures::stream::iter(asks)
            .buffered(QUEUE_STATUS_CONCURRENCY)
            .collect()
            .await;
        let queues = records
            .into_iter()
            .zip(statuses)
            .map(|((rec, policy), st)| QueueInfo {
                // As clients see it (rabbitmqctl's `type`): a durable queue declared
                // classic is replicated here but behaves as, and lists as, classic.
                queue_type: match rec.kind {
                    QueueKind::Quorum
                        if crate::meta::queue_args::QueueType::of_args(&rec.arguments)
                            == crate::meta::queue_args::QueueType::Quorum =>
                    {
                        "quorum".into()
                    }
                    _ => "classic".into(),
                },
                vhost: rec.vhost,
                name: rec.name,
                messages_ready: st.messages_ready,
                messages_unacknowledged: st.messages_unacknowledged,
                consumers: st.consumers,
                dead_letter_held: st.dead_letter_held,
                unreadable_bodies: st.unreadable_bodies,
                messages_delayed: st.messages_delayed,
                group_id: rec.group_id,
                policy: policy.unwrap_or_default(),
                leader: st.leader,
                members: st.members,
                online: st.online,
            })
            .collect();
        Ok(Response::new(ListQueuesReply { queues }))
    }

    async fn queue_read(
        &self,
        req: Request<QueueReadRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let r = req.into_inner();
        let what = inspect::What::parse(&r.what, r.position).map_err(Status::invalid_argument)?;
        let vhost = vhost_or_default(&r.vhost);
        let result =
            inspect::queue_read(self.broker.queues(), &vhost, &r.queue, what, r.forwarded).await;
        Ok(Response::new(inspect::to_reply(result)))
    }

    type RedriveStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<JsonReply, Status>> + Send>>;

    /// Runs the redrive in a task: progress documents, then the summary or
    /// the error ([`redrive::redrive`]). The caller hanging up stops it after
    /// the batch in flight.
    async fn redrive(
        &self,
        req: Request<RedriveRequest>,
    ) -> Result<Response<Self::RedriveStream>, Status> {
        let r = req.into_inner();
        let opts = redrive::options(&r);
        let vhost = vhost_or_default(&r.vhost);
        let queues = self.broker.queues().clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<JsonReply>(16);
        let (progress_tx, mut progress_rx) = tokio::sync::mpsc::channel::<serde_json::Value>(4);
        tokio::spawn(async move {
            let run = redrive::redrive(
                &queues,
                &vhost,
                &r.queue,
                &opts,
                r.forwarded,
                Some(&progress_tx),
            );
            tokio::pin!(run);
            let mut hung_up = false;
            let result = loop {
                tokio::select! {
                    result = &mut run => break result,
                    Some(doc) = progress_rx.recv() => {
                        // A slow caller misses progress, never the summary.
                        let _ = tx.try_send(redrive::to_reply(Ok(doc)));
                    }
                    _ = tx.closed(), if !hung_up => {
                        // The caller hung up: the redrive sees the closed channel.
                        hung_up = true;
                        progress_rx.close();
                    }
                }
            };
            let _ = tx.send(redrive::to_reply(result)).await;
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|reply| (Ok(reply), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    /// ok with `{"message"}` when no queue is critical; else not ok, `json` = the queues.
    async fn quorum_critical(
        &self,
        req: Request<QuorumCriticalRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let queues = self.broker.queues();
        let node = match req.into_inner().node {
            0 => self.broker.node_id(),
            n => n,
        };
        let nodes = self.broker.cluster_status().nodes.len();
        let message = if nodes <= 1 {
            Some(format!("Node {node} seems to be the only one in a single node cluster, the check does not apply"))
        } else if node == self.broker.node_id() && self.broker.detector().is_draining() {
            Some(format!(
                "Node {node} seems to be in maintenance mode, the check does not apply"
            ))
        } else {
            None
        };
        let critical = if message.is_some() {
            Vec::new()
        } else {
            health::quorum_critical(queues, node)
        };
        Ok(Response::new(if critical.is_empty() {
            let message = message.unwrap_or_else(|| {
                format!("Node {node} reported no quorum queues with minimum quorum")
            });
            JsonReply {
                ok: true,
                error: String::new(),
                status: 0,
                json: serde_json::json!({"result": "ok", "message": message}).to_string(),
            }
        } else {
            JsonReply {
                ok: false,
                error: format!("Node {node} reported local queues with minimum online quorum"),
                status: 503,
                json: serde_json::Value::from(critical).to_string(),
            }
        }))
    }

    /// ok when every matching quorum queue has a leader; else not ok, `json` = the queues.
    async fn queues_without_leader(
        &self,
        req: Request<LeaderlessRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let r = req.into_inner();
        let vhost = vhost_or_default(&r.vhost);
        let vhost = (!r.across_all_vhosts).then_some(vhost.as_str());
        let node = self.broker.node_id();
        let found = health::without_leader(self.broker.queues(), vhost, &r.pattern)
            .map_err(Status::invalid_argument)?;
        Ok(Response::new(if found.is_empty() {
            JsonReply {
                ok: true,
                error: String::new(),
                status: 0,
                json: serde_json::json!({"result": "ok", "message": format!("Node {node} reported all quorum queue as having responsive leader replicas")}).to_string(),
            }
        } else {
            JsonReply {
                ok: false,
                error: format!("Node {node} reported quorum queues with a missing (not elected) or unresponsive leader replica"),
                status: 503,
                json: serde_json::Value::from(found).to_string(),
            }
        }))
    }

    async fn tracking(&self, req: Request<TrackingRequest>) -> Result<Response<JsonReply>, Status> {
        use crate::http::api::connections::{local_items, Kind};
        let kind = req.into_inner().kind;
        let kind = Kind::from_name(&kind)
            .ok_or_else(|| Status::invalid_argument(format!("unknown listing '{kind}'")))?;
        let items = local_items(&self.broker, kind);
        Ok(Response::new(JsonReply {
            ok: true,
            error: String::new(),
            status: 0,
            json: serde_json::Value::Array(items).to_string(),
        }))
    }

    async fn close_connection(
        &self,
        req: Request<CloseConnectionRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let r = req.into_inner();
        let closed = crate::http::api::connections::close_local(&self.broker, &r.name, r.reason);
        Ok(Response::new(JsonReply {
            ok: closed,
            error: if closed {
                String::new()
            } else {
                format!("no connection '{}' on this node", r.name)
            },
            status: if closed { 0 } else { 404 },
            json: String::new(),
        }))
    }
}
