"""quorumq's own per-panel queries for RabbitMQ's two Grafana dashboards.

RabbitMQ publishes Grafana dashboards for its Prometheus plugin in rabbitmq-server,
`deps/rabbitmq_prometheus/docker/grafana/dashboards/`. This list mirrors the panels of
two of them as of rabbitmq-server commit 5b09e556da53b8473f26843a2493d8460ced8c8e:

- RabbitMQ-Overview (41 panels),
- RabbitMQ-Quorum-Queues-Raft (5 panels).

For each panel it holds the panel's title and a PromQL expression, written for quorumq,
that asks for what the panel charts: the same metric families, each joined to its
node's `rabbitmq_identity_info` by `(instance, job)` with
`group_left(rabbitmq_cluster, rabbitmq_node)` and filtered by the dashboards' three
variables (`$namespace`, `$rabbitmq_cluster`, `$endpoint`), so that a scrape which
serves this list's series serves what the dashboards draw. Where a panel draws several
metric families (the unroutable panel: dropped and returned; the Raft panels: the 3.x
and the 4.2 name of an index) or several fixed buckets (the message size distribution:
one band per `le` spelling RabbitMQ 4.x uses), there is one entry for each, so that
none can go missing unnoticed.

The dashboards' JSON is not kept in this repository: the files are RabbitMQ's work
under their own licence, and this project ships only what it wrote. Grafana users
import them from rabbitmq-server (or grafana.com) themselves. `test_dashboards.py`
evaluates this list by default; with `RABBITMQ_DASHBOARDS_DIR` pointing at a directory
holding `RabbitMQ-Overview.json` and `RabbitMQ-Quorum-Queues-Raft.json` it also
evaluates every expression of those files as they are, and checks that this list has
an entry for each of their titled panels.
"""

RABBITMQ_SERVER_COMMIT = "5b09e556da53b8473f26843a2493d8460ced8c8e"

# Grafana query variables, in dependency order: (name, `label_values(...)` query).
# Grafana picks the first of the sorted values when a dashboard has no `current`.
VARIABLES = [
    ("namespace", "label_values(rabbitmq_identity_info, namespace)"),
    ("rabbitmq_cluster",
     'label_values(rabbitmq_identity_info{namespace="$namespace"}, rabbitmq_cluster)'),
    ("endpoint",
     'label_values(rabbitmq_identity_info{namespace="$namespace", '
     'rabbitmq_cluster="$rabbitmq_cluster", rabbitmq_endpoint!="memory-breakdown"}, '
     "rabbitmq_endpoint)"),
]

# The node identity every series is joined to: one per scraped node and endpoint.
IDENTITY = ('rabbitmq_identity_info{namespace="$namespace", '
            'rabbitmq_cluster="$rabbitmq_cluster", rabbitmq_endpoint="$endpoint"}')


def on_node(expr):
    """`expr` with its node's cluster and node name, keeping only the chosen cluster."""
    return (f"({expr}) * on (instance, job) group_left (rabbitmq_cluster, rabbitmq_node) "
            f"{IDENTITY}")


def per_s(counter):
    """Per-second rate of `counter` over Grafana's rate interval."""
    return f"rate({counter}[$__rate_interval])"


def total(expr):
    """One number for the cluster."""
    return f"sum ({expr})"


def by_node(expr):
    """One line per node."""
    return f"sum by (rabbitmq_node) ({expr})"


def in_range(series):
    """How much `series` grew over the dashboard's time range."""
    return f"increase({series}[$__range])"


def size_bucket(le):
    """Messages published in the range with a body of at most `le` bytes."""
    return total(on_node(in_range(f'rabbitmq_message_size_bytes_bucket{{le="{le}"}}')))


# RabbitMQ 4.x's message size buckets, spelled as its `le` label spells them.
SIZE_BUCKETS = [("100.0", "100 B"), ("1000.0", "1 kB"), ("10000.0", "10 kB"),
                ("100000.0", "100 kB"), ("1e+06", "1 MB"), ("1e+07", "10 MB"),
                ("5e+07", "50 MB"), ("1e+08", "100 MB"), ("+Inf", "more")]


def size_bands():
    """Share of published messages in each size bucket (the distribution panel)."""
    out = []
    lower = None
    for le, name in SIZE_BUCKETS:
        upto = size_bucket(le)
        share = upto if lower is None else f"({upto} - {size_bucket(lower[0])})"
        band = (f"up to {name}" if lower is None else
                f"over {lower[1]}" if le == "+Inf" else f"{lower[1]} to {name}")
        out.append((band, f'{share} / {size_bucket("+Inf")}'))
        lower = (le, name)
    return out


def raft_index_pair(old, new):
    """The 3.x and the 4.2 name of a Raft index; the Raft dashboard queries both."""
    return [(f"3.x {old}", old), (f"4.2 {new}", new)]


# (panel title, which series of the panel, PromQL); titles as the dashboards spell them.
OVERVIEW = [
    # The stat panels across the top: one number for the cluster.
    ("Ready messages", "", total(on_node("rabbitmq_queue_messages_ready"))),
    ("Outgoing messages / s", "",
     total(on_node(per_s("rabbitmq_global_messages_delivered_total")))),
    ("Publishers", "", total(on_node("rabbitmq_global_publishers"))),
    ("Connections", "", total(on_node("rabbitmq_connections"))),
    ("Queues", "", total(on_node("rabbitmq_queues"))),
    ("Unacknowledged messages", "", total(on_node("rabbitmq_queue_messages_unacked"))),
    ("Incoming messages / s", "",
     total(on_node(per_s("rabbitmq_global_messages_received_total")))),
    ("Consumers", "", total(on_node("rabbitmq_global_consumers"))),
    ("Channels", "", total(on_node("rabbitmq_channels"))),
    ("Nodes", "", f"count ({IDENTITY})"),
    # NODES row: the (untitled) table of nodes with versions and uptime, then limits.
    ("", "node table",
     on_node("rabbitmq_erlang_uptime_seconds * on (instance, job) "
             "group_left (rabbitmq_version, erlang_version) rabbitmq_build_info")),
    ("Memory available before publishers blocked", "",
     on_node("rabbitmq_resident_memory_limit_bytes - rabbitmq_process_resident_memory_bytes")),
    ("Disk space available before publishers blocked", "",
     on_node("rabbitmq_disk_space_available_bytes - rabbitmq_disk_space_available_limit_bytes")),
    ("File descriptors available", "",
     on_node("rabbitmq_process_max_fds - rabbitmq_process_open_fds")),
    # QUEUED MESSAGES row.
    ("Messages ready to be delivered to consumers", "",
     by_node(on_node("rabbitmq_queue_messages_ready"))),
    ("Messages pending consumer acknowledgement", "",
     by_node(on_node("rabbitmq_queue_messages_unacked"))),
    # INCOMING MESSAGES row.
    ("Messages published / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_received_total")))),
    ("Avg Size", "",
     f'{total(on_node(in_range("rabbitmq_message_size_bytes_sum")))} / '
     f'{total(on_node(in_range("rabbitmq_message_size_bytes_count")))}'),
    *[("Message Size Distribution", band, expr) for band, expr in size_bands()],
    ("Messages routed to queues / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_routed_total")))),
    ("Messages confirmed to publishers / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_confirmed_total")))),
    ("Unroutable messages dropped & returned / s", "dropped",
     by_node(on_node(per_s("rabbitmq_global_messages_unroutable_dropped_total")))),
    ("Unroutable messages dropped & returned / s", "returned",
     by_node(on_node(per_s("rabbitmq_global_messages_unroutable_returned_total")))),
    ("Messages unconfirmed to publishers / s", "",
     by_node(f'{on_node(per_s("rabbitmq_global_messages_received_confirm_total"))} - '
             f'{on_node(per_s("rabbitmq_global_messages_confirmed_total"))}')),
    # OUTGOING MESSAGES row.
    ("Messages delivered / s", "",
     by_node(f'{on_node(per_s("rabbitmq_global_messages_delivered_consume_auto_ack_total"))} + '
             f'{on_node(per_s("rabbitmq_global_messages_delivered_consume_manual_ack_total"))}')),
    ("Messages redelivered / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_redelivered_total")))),
    ("Messages delivered with manual ack / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_delivered_consume_manual_ack_total")))),
    ("Messages delivered auto ack / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_delivered_consume_auto_ack_total")))),
    ("Messages acknowledged / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_acknowledged_total")))),
    ("Polling operations with auto ack / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_delivered_get_auto_ack_total")))),
    ("Polling operations that yield no result / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_get_empty_total")))),
    ("Polling operations with manual ack / s", "",
     by_node(on_node(per_s("rabbitmq_global_messages_delivered_get_manual_ack_total")))),
    # QUEUES, CHANNELS and CONNECTIONS rows: the gauge per node, then its churn.
    *[entry for kind in ("queues", "channels", "connections") for entry in [
        (f"Total {kind}", "", on_node(f"rabbitmq_{kind}")),
        *[(f"{kind.capitalize()} {what} / s", "",
           by_node(on_node(per_s(f"rabbitmq_{kind}_{what}_total"))))
          for what in (("declared", "created", "deleted") if kind == "queues"
                       else ("opened", "closed"))],
    ]],
]

QUORUM_QUEUES_RAFT = [
    *[("Log entries committed / s", name, by_node(on_node(per_s(metric))))
      for name, metric in raft_index_pair("rabbitmq_raft_log_commit_index",
                                          "rabbitmq_raft_commit_index")],
    ("Log entry commit latency", "", on_node("rabbitmq_raft_commit_latency_seconds")),
    *[("Uncommitted log entries", name,
       by_node(f"{on_node(written)} - {on_node(committed)}"))
      for (name, written), (_, committed) in zip(
          raft_index_pair("rabbitmq_raft_log_last_written_index",
                          "rabbitmq_raft_last_written_index"),
          raft_index_pair("rabbitmq_raft_log_commit_index", "rabbitmq_raft_commit_index"))],
    ("Leader elections / s", "", by_node(on_node(per_s("rabbitmq_raft_term")))),
    # The panel colours members over 5,000 entries; the query is every member's count.
    *[("Raft members with >5k entries in the log", name,
       f"sum by (queue, rabbitmq_node) ({on_node(written)} - {on_node(snapshot)})")
      for (name, written), (_, snapshot) in zip(
          raft_index_pair("rabbitmq_raft_log_last_written_index",
                          "rabbitmq_raft_last_written_index"),
          raft_index_pair("rabbitmq_raft_log_snapshot_index", "rabbitmq_raft_snapshot_index"))],
]

# Dashboard name (as its JSON file is named, without `.json`) -> its panels' queries.
DASHBOARDS = {
    "RabbitMQ-Overview": OVERVIEW,
    "RabbitMQ-Quorum-Queues-Raft": QUORUM_QUEUES_RAFT,
}
