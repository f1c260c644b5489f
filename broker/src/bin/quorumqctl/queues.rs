//! `list_queues`: every queue of the vhost with its counts and placement.

use quorumq_proto::v1::{ListQueuesRequest, QueueInfo};
use serde_json::json;

use crate::output::{emit, listing, Formatter, Row};
use crate::Client;

/// `list_queues` in `vhost`: one row per queue ([`QUEUE_COLUMNS`] in a table).
///
/// Errors: the call fails (node unreachable, secret refused).
pub async fn list(c: &mut Client, f: Formatter, vhost: String) -> anyhow::Result<()> {
    let r = c.list_queues(ListQueuesRequest { vhost }).await?;
    let rows: Vec<Row> = r.into_inner().queues.iter().map(queue_row).collect();
    emit(&listing(f, QUEUE_COLUMNS, &rows));
    Ok(())
}

/// `list_queues` table columns. The first seven keep their historical order
/// (test harnesses read them by position); the placement comes last.
pub const QUEUE_COLUMNS: &[&str] = &[
    "name",
    "type",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
    "dead_letter_held",
    "policy",
    "leader",
    "members",
    "online",
    "unreadable_bodies",
    "below_quorum",
    "messages_delayed",
];

/// One queue of `list_queues`: `name`, `vhost`, `type` ("quorum" |
/// "classic"), `leader` (node id, null while unknown), `members` (node ids
/// holding a replica), `online` (those the answering node sees running),
/// `messages_ready`, `messages_unacknowledged`, `consumers`,
/// `dead_letter_held`, `messages_delayed` (counts), `policy` (effective policy name, "" for none),
/// `unreadable_bodies` (bodies the leader could not read back intact; > 0 =
/// unhealthy), `below_quorum` (fewer members online than a majority of
/// `members`: the queue takes no publishes, acks or deliveries until enough
/// return; RabbitMQ lists such queues in `rabbitmq-queues
/// check_if_node_is_quorum_critical`).
pub fn queue_row(q: &QueueInfo) -> Row {
    let below_quorum = !q.members.is_empty() && q.online.len() < q.members.len() / 2 + 1;
    Row(vec![
        ("name", json!(q.name)),
        ("vhost", json!(q.vhost)),
        ("type", json!(q.queue_type)),
        ("leader", json!(q.leader)),
        ("members", json!(q.members)),
        ("online", json!(q.online)),
        ("messages_ready", json!(q.messages_ready)),
        ("messages_unacknowledged", json!(q.messages_unacknowledged)),
        ("consumers", json!(q.consumers)),
        ("dead_letter_held", json!(q.dead_letter_held)),
        ("policy", json!(q.policy)),
        ("unreadable_bodies", json!(q.unreadable_bodies)),
        ("below_quorum", json!(below_quorum)),
        ("messages_delayed", json!(q.messages_delayed)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{cells, parse};

    fn queue(name: &str, leader: Option<u64>, members: &[u64], online: &[u64]) -> QueueInfo {
        QueueInfo {
            vhost: "/".into(),
            name: name.into(),
            queue_type: "quorum".into(),
            messages_ready: 3,
            messages_unacknowledged: 2,
            consumers: 1,
            dead_letter_held: 4,
            group_id: 7,
            policy: "DLX".into(),
            leader,
            members: members.to_vec(),
            online: online.to_vec(),
            unreadable_bodies: 0,
            messages_delayed: 0,
        }
    }

    fn queues_text(f: Formatter, queues: &[QueueInfo]) -> String {
        let rows: Vec<Row> = queues.iter().map(queue_row).collect();
        listing(f, QUEUE_COLUMNS, &rows)
    }

    #[test]
    fn list_queues_json_is_an_array_of_one_object_per_queue_with_placement() {
        let text = queues_text(
            Formatter::Json,
            &[
                queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
                queue("q2", None, &[1], &[]),
            ],
        );
        assert_eq!(text.lines().count(), 4, "[, two rows, ]: {text}");
        assert_eq!(
            parse(&text),
            json!([
                {
                    "name": "q1", "vhost": "/", "type": "quorum", "leader": 2,
                    "members": [1, 2, 3], "online": [2, 3],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX", "unreadable_bodies": 0,
                    "below_quorum": false, "messages_delayed": 0,
                },
                {
                    "name": "q2", "vhost": "/", "type": "quorum", "leader": null,
                    "members": [1], "online": [],
                    "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1,
                    "dead_letter_held": 4, "policy": "DLX", "unreadable_bodies": 0,
                    "below_quorum": true, "messages_delayed": 0,
                },
            ])
        );
        // Keys in a reader's order, not alphabetical.
        assert!(
            text.starts_with(
                "[\n{\"name\":\"q1\",\"vhost\":\"/\",\"type\":\"quorum\",\"leader\":2,"
            ),
            "{text}"
        );
        assert_eq!(queues_text(Formatter::Json, &[]), "[]\n");
    }

    #[test]
    fn list_queues_table_keeps_the_old_columns_and_appends_placement() {
        let t = queues_text(
            Formatter::Table,
            &[
                queue("q1", Some(2), &[1, 2, 3], &[2, 3]),
                queue("q2", None, &[], &[]),
            ],
        );
        let lines = cells(&t);
        assert_eq!(
            lines[0],
            [
                "name",
                "type",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
                "dead_letter_held",
                "policy",
                "leader",
                "members",
                "online",
                "unreadable_bodies",
                "below_quorum",
                "messages_delayed"
            ]
        );
        assert_eq!(
            lines[1],
            ["q1", "quorum", "3", "2", "1", "4", "DLX", "2", "1,2,3", "2,3", "0", "false", "0"]
        );
        assert_eq!(
            lines[2],
            ["q2", "quorum", "3", "2", "1", "4", "DLX", "", "", "", "0", "false", "0"]
        );
        assert_eq!(lines.len(), 3, "{t}");
        // Every table column is a key of the row (a typo would print "").
        let keys: Vec<&str> = queue_row(&queue("q", None, &[], &[]))
            .0
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert!(QUEUE_COLUMNS.iter().all(|c| keys.contains(c)), "{keys:?}");
        assert_eq!(
            queues_text(Formatter::Table, &[]).lines().count(),
            1,
            "header only"
        );
    }
}
