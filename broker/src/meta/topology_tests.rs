//! Topology-level tests: declare flows, bindings, routing, policies,
//! effective config, serialization. Expected texts observed on RabbitMQ 3.10.8.

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};
use serde_json::json;

use super::test_helpers::{s, t};
use super::*;
use crate::queue::types::{DeadLetterStrategy, DeadLetterTarget, Overflow};

fn none() -> FieldTable {
    FieldTable::default()
}

fn decl(
    name: &str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    args: FieldTable,
) -> QueueDeclare {
    QueueDeclare {
        vhost: "/".into(),
        name: name.into(),
        passive: false,
        durable,
        exclusive,
        auto_delete,
        arguments: args,
        node: 7,
        connection: 100,
        server_named: false,
        members: Vec::new(),
    }
}

fn create(topo: &mut Topology, d: &QueueDeclare) -> QueueRecord {
    match topo.check_queue_declare(d) {
        Ok(QueueDeclared::Create(rec)) => {
            topo.add_queue(rec.clone());
            rec
        }
        other => panic!("expected Create, got {other:?}"),
    }
}

fn err_text(r: Result<QueueDeclared, AmqpError>) -> String {
    r.unwrap_err().text
}

#[test]
fn predeclared_exchanges() {
    let topo = Topology::new();
    let names: Vec<&str> = topo.exchanges("/").map(|x| x.name.as_str()).collect();
    for n in [
        "",
        "amq.direct",
        "amq.fanout",
        "amq.topic",
        "amq.headers",
        "amq.match",
    ] {
        assert!(names.contains(&n), "{n}");
        assert!(topo.exchange("/", n).unwrap().durable);
    }
    assert_eq!(
        topo.exchange("/", "amq.match").unwrap().kind,
        ExchangeKind::Headers
    );
}

#[test]
fn exchange_declare_texts() {
    let mut topo = Topology::new();
    let d = |topo: &mut Topology,
             name: &str,
             kind: &str,
             passive,
             durable,
             ad,
             internal,
             args: &FieldTable| {
        topo.declare_exchange("/", name, kind, passive, durable, ad, internal, args)
    };
    let e = d(&mut topo, "x", "zzqqx", false, false, false, false, &none()).unwrap_err();
    assert_eq!(
        (e.code, e.hard, e.text.as_str()),
        (503, true, "COMMAND_INVALID - unknown exchange type 'zzqqx'")
    );
    let e = d(&mut topo, "", "direct", false, true, false, false, &none()).unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange"
        )
    );
    let e = d(&mut topo, "", "direct", true, true, false, false, &none()).unwrap_err();
    assert_eq!(e.code, 403);
    let e = d(
        &mut topo,
        "nope",
        "direct",
        true,
        false,
        false,
        false,
        &none(),
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    );
    let e = d(
        &mut topo,
        "amq.foo",
        "direct",
        false,
        false,
        false,
        false,
        &none(),
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            403,
            "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'"
        )
    );
    assert!(d(
        &mut topo,
        "amq.direct",
        "direct",
        false,
        true,
        false,
        false,
        &none()
    )
    .is_ok());
    assert_eq!(
        d(&mut topo, "amq.direct", "fanout", false, true, false, false, &none()).unwrap_err().text,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': received 'fanout' but current is 'direct'"
    );
    assert_eq!(
        d(&mut topo, "amq.direct", "direct", false, false, false, false, &none()).unwrap_err().text,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': received 'false' but current is 'true'"
    );
    d(
        &mut topo,
        "p_x",
        "direct",
        false,
        false,
        false,
        false,
        &none(),
    )
    .unwrap();
    assert_eq!(
        d(&mut topo, "p_x", "direct", false, false, true, false, &none()).unwrap_err().text,
        "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange 'p_x' in vhost '/': received 'true' but current is 'false'"
    );
    assert_eq!(
        d(&mut topo, "p_x", "direct", false, false, false, true, &none()).unwrap_err().text,
        "PRECONDITION_FAILED - inequivalent arg 'internal' for exchange 'p_x' in vhost '/': received 'true' but current is 'false'"
    );
    assert_eq!(
        d(&mut topo, "p_x", "direct", false, false, false, false, &t(&[("alternate-exchange", s("foo"))])).unwrap_err().text,
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'p_x' in vhost '/': received the value 'foo' of type 'longstr' but current is none"
    );
    assert_eq!(
        d(&mut topo, "p_x2", "direct", false, false, false, false, &t(&[("alternate-exchange", AMQPValue::LongInt(5))])).unwrap_err().text,
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' in exchange 'p_x2' in vhost '/'"
    );
    // Passive hit ignores the other fields.
    assert!(d(&mut topo, "p_x", "fanout", true, true, true, true, &none()).is_ok());
}

#[test]
fn exchange_delete_texts() {
    let mut topo = Topology::new();
    assert_eq!(
        topo.delete_exchange("/", "amq.direct", false)
            .unwrap_err()
            .text,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"
    );
    assert_eq!(
        topo.delete_exchange("/", "amq.nope", false)
            .unwrap_err()
            .text,
        "ACCESS_REFUSED - deletion of system exchange 'amq.nope' in vhost '/' not allowed"
    );
    assert_eq!(
        topo.delete_exchange("/", "", false).unwrap_err().text,
        "ACCESS_REFUSED - operation not permitted on the default exchange"
    );
    assert!(topo.delete_exchange("/", "missing", true).is_ok());
    topo.declare_exchange("/", "x", "direct", false, false, false, false, &none())
        .unwrap();
    create(&mut topo, &decl("q", true, false, false, none()));
    topo.bind("/", "q", "x", "k", &none()).unwrap();
    assert_eq!(
        topo.delete_exchange("/", "x", true).unwrap_err().text,
        "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use"
    );
    topo.delete_exchange("/", "x", false).unwrap();
    assert!(topo.exchange("/", "x").is_none());
    assert!(topo.bindings("/", "x").is_empty());
}

#[test]
fn queue_declare_kinds_and_group_ids() {
    let mut topo = Topology::new();
    let q1 = create(&mut topo, &decl("dur", true, false, false, none()));
    assert_eq!((q1.kind, q1.group_id), (QueueKind::Quorum, 1));
    assert_eq!(
        QueueType::of_args(&q1.arguments),
        QueueType::Quorum,
        "default type injected"
    );
    let q2 = create(&mut topo, &decl("excl", true, true, false, none()));
    assert_eq!(
        (q2.kind, q2.durable, q2.exclusive_owner),
        (QueueKind::Local { node: 7 }, false, Some(100))
    );
    assert_eq!(q2.group_id, 2);
    let q3 = create(&mut topo, &decl("ad", true, false, true, none()));
    assert_eq!(q3.kind, QueueKind::Local { node: 7 });
    let q4 = create(
        &mut topo,
        &decl(
            "nd",
            false,
            false,
            false,
            t(&[("x-max-priority", AMQPValue::LongInt(5))]),
        ),
    );
    assert_eq!(q4.kind, QueueKind::Local { node: 7 });
    // Durable classic: quorum-backed, type kept as declared.
    let q5 = create(
        &mut topo,
        &decl(
            "cl",
            true,
            false,
            false,
            t(&[("x-queue-type", s("classic"))]),
        ),
    );
    assert_eq!(q5.kind, QueueKind::Quorum);
    assert_eq!(QueueType::of_args(&q5.arguments), QueueType::Classic);
    assert_eq!(q5.group_id, 5);
    // Deleting never reuses ids.
    topo.delete_queue("/", "cl");
    let q6 = create(&mut topo, &decl("cl2", true, false, false, none()));
    assert_eq!(q6.group_id, 6);
    assert_eq!(topo.queues().count(), 5);
}

#[test]
fn queue_declare_errors() {
    let mut topo = Topology::new();
    let qq = |extra: &[(&str, AMQPValue)]| {
        let mut v = vec![("x-queue-type", s("quorum"))];
        v.extend_from_slice(extra);
        t(&v)
    };
    let e = topo
        .check_queue_declare(&decl("amq.foo", true, false, false, none()))
        .unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            403,
            "ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'"
        )
    );
    let mut passive = decl("amq.foo", true, false, false, none());
    passive.passive = true;
    assert_eq!(
        err_text(topo.check_queue_declare(&passive)),
        "NOT_FOUND - no queue 'amq.foo' in vhost '/'"
    );
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", true, false, true, qq(&[])))),
        "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'q' in vhost '/'"
    );
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", true, true, false, qq(&[])))),
        "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'q' in vhost '/'"
    );
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", false, false, false, qq(&[])))),
        "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'q' in vhost '/'"
    );
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", false, true, true, qq(&[])))),
        "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'q' in vhost '/'"
    );
    // Argument errors come before property errors (observed).
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", false, false, false, qq(&[("x-queue-mode", s("lazy"))])))),
        "PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"
    );
    // DLX type check runs before the validators.
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", true, false, false, qq(&[("x-dead-letter-exchange", AMQPValue::LongInt(5)), ("x-max-length", AMQPValue::LongInt(-1))])))),
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
    );
    // Without x-queue-type, a durable queue is quorum (default type).
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("q", true, false, false, t(&[("x-queue-mode", s("lazy"))])))),
        "PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"
    );
    // Server-named quorum queue.
    let e = Topology::check_server_named(&decl("", true, false, false, qq(&[]))).unwrap_err();
    assert_eq!(
        e.text,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    );
    assert!(Topology::check_server_named(&decl("", false, true, true, none())).is_ok());
    // Missing vhost.
    let mut d = decl("q", true, false, false, none());
    d.vhost = "nope".into();
    let e = topo.check_queue_declare(&d).unwrap_err();
    assert_eq!(
        (e.code, e.hard, e.text.as_str()),
        (530, true, "NOT_ALLOWED - vhost nope not found")
    );
    // Unknown x- arguments accepted.
    create(
        &mut topo,
        &decl(
            "ok",
            true,
            false,
            false,
            qq(&[
                ("x-foo", s("bar")),
                ("x-delivery-limit", AMQPValue::LongInt(-1)),
            ]),
        ),
    );
}

#[test]
fn queue_redeclare_equivalence() {
    let mut topo = Topology::new();
    let args = t(&[
        ("x-queue-type", s("quorum")),
        ("x-max-length", AMQPValue::LongInt(5)),
        ("x-foo", s("bar")),
    ]);
    let rec = create(&mut topo, &decl("p_qq", true, false, false, args));
    let same = |a: FieldTable| topo.check_queue_declare(&decl("p_qq", true, false, false, a));
    // Absent x-queue-type is equivalent (default type quorum); integer types by value; x-foo ignored.
    assert_eq!(
        same(t(&[("x-max-length", AMQPValue::ShortShortUInt(5))])).unwrap(),
        QueueDeclared::Existing(rec.clone())
    );
    assert!(same(t(&[
        ("x-max-length", AMQPValue::LongLongInt(5)),
        ("x-foo", s("baz")),
        ("x-queue-mode", s("lazy"))
    ]))
    .is_ok());
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("p_qq", false, false, false, t(&[("x-max-length", AMQPValue::LongInt(5))])))),
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'p_qq' in vhost '/': received 'false' but current is 'true'"
    );
    assert_eq!(
        err_text(topo.check_queue_declare(&decl("p_qq", true, false, true, t(&[("x-max-length", AMQPValue::LongInt(5))])))),
        "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue 'p_qq' in vhost '/': received 'true' but current is 'false'"
    );
    let e = topo
        .check_queue_declare(&decl("p_qq", true, true, false, none()))
        .unwrap_err();
    assert_eq!(e.code, 405);
    assert_eq!(e.text, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'p_qq' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.");
    assert_eq!(
        err_text(same(t(&[("x-queue-type", s("classic")), ("x-max-length", AMQPValue::LongInt(5))]))),
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'p_qq' in vhost '/': received 'classic' but current is 'quorum'"
    );
    assert_eq!(
        err_text(same(t(&[("x-max-length", AMQPValue::LongInt(6))]))),
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'p_qq' in vhost '/': received '6' but current is '5'"
    );
    assert_eq!(
        err_text(same(none())),
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'p_qq' in vhost '/': received none but current is the value '5' of type 'signedint'"
    );
}

#[test]
fn exclusive_queues() {
    let mut topo = Topology::new();
    create(&mut topo, &decl("ex", false, true, false, none()));
    // Same connection: exclusive redeclare ok, durable flag ignored (stored non-durable).
    assert!(topo
        .check_queue_declare(&decl("ex", true, true, false, none()))
        .is_ok());
    assert!(topo
        .check_queue_declare(&decl("ex", false, true, false, none()))
        .is_ok());
    // Same connection, non-exclusive redeclare → 405.
    assert_eq!(
        topo.check_queue_declare(&decl("ex", false, false, false, none()))
            .unwrap_err()
            .code,
        405
    );
    // Other connection: declare, passive declare, bind/delete checks → 405.
    let mut other = decl("ex", false, true, false, none());
    other.connection = 200;
    assert_eq!(topo.check_queue_declare(&other).unwrap_err().code, 405);
    other.passive = true;
    assert_eq!(topo.check_queue_declare(&other).unwrap_err().code, 405);
    assert_eq!(
        topo.check_exclusive_access("/", "ex", 200)
            .unwrap_err()
            .code,
        405
    );
    assert!(topo.check_exclusive_access("/", "ex", 100).is_ok());
    assert_eq!(topo.queues_owned_by(100).len(), 1);
}

#[test]
fn bind_unbind_texts_and_auto_delete() {
    let mut topo = Topology::new();
    assert_eq!(
        topo.bind("/", "nq", "nx", "k", &none()).unwrap_err().text,
        "NOT_FOUND - no exchange 'nx' in vhost '/'"
    );
    assert_eq!(
        topo.bind("/", "nq", "amq.direct", "k", &none())
            .unwrap_err()
            .text,
        "NOT_FOUND - no queue 'nq' in vhost '/'"
    );
    create(&mut topo, &decl("q", true, false, false, none()));
    assert_eq!(
        topo.bind("/", "q", "", "k", &none()).unwrap_err().text,
        "ACCESS_REFUSED - operation not permitted on the default exchange"
    );
    assert_eq!(
        topo.unbind("/", "q", "", "k", &none()).unwrap_err().code,
        403
    );
    assert!(topo
        .unbind("/", "q", "amq.direct", "nokey", &none())
        .is_ok());
    assert!(topo.unbind("/", "q", "nx", "nokey", &none()).is_ok());
    assert!(topo
        .unbind("/", "nq", "amq.direct", "nokey", &none())
        .is_ok());
    assert_eq!(
        topo.bind("/", "q", "amq.headers", "", &t(&[("x-match", s("foo"))])).unwrap_err().text,
        "PRECONDITION_FAILED - Invalid x-match field value <<\"foo\">>; expected all, any, all-with-x, or any-with-x"
    );
    // Auto-delete exchange: deleted when its last binding goes (unbind)...
    topo.declare_exchange("/", "ad", "direct", false, false, true, false, &none())
        .unwrap();
    topo.bind("/", "q", "ad", "k", &none()).unwrap();
    topo.bind("/", "q", "ad", "k", &none()).unwrap();
    assert_eq!(
        topo.bindings("/", "ad").len(),
        1,
        "duplicate bind is a no-op"
    );
    topo.unbind("/", "q", "ad", "k", &none()).unwrap();
    assert!(topo.exchange("/", "ad").is_none());
    // ...or when the queue is deleted; an unbound one stays.
    topo.declare_exchange("/", "ad", "direct", false, false, true, false, &none())
        .unwrap();
    topo.declare_exchange("/", "ad2", "direct", false, false, true, false, &none())
        .unwrap();
    topo.bind("/", "q", "ad", "k", &none()).unwrap();
    assert!(topo.delete_queue("/", "q").is_some());
    assert!(topo.exchange("/", "ad").is_none());
    assert!(topo.exchange("/", "ad2").is_some());
}

#[test]
fn routing_all_types() {
    let mut topo = Topology::new();
    for q in ["a", "b", "c", "dlq"] {
        create(&mut topo, &decl(q, true, false, false, none()));
    }
    topo.bind("/", "a", "amq.direct", "k1", &none()).unwrap();
    topo.bind("/", "b", "amq.direct", "k2", &none()).unwrap();
    topo.bind("/", "c", "amq.fanout", "ignored", &none())
        .unwrap();
    topo.bind("/", "a", "amq.topic", "#.dl.routing.key", &none())
        .unwrap();
    topo.bind("/", "b", "amq.topic", "*.normal.routing.key", &none())
        .unwrap();
    topo.bind(
        "/",
        "a",
        "amq.headers",
        "",
        &t(&[("x-match", s("any")), ("h", s("1"))]),
    )
    .unwrap();
    topo.bind(
        "/",
        "b",
        "amq.headers",
        "",
        &t(&[("h", s("1")), ("g", AMQPValue::LongInt(2))]),
    )
    .unwrap();
    let r = |x: &str, keys: &[&str], h: Option<&FieldTable>| {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        topo.route("/", x, &keys, h).unwrap()
    };
    assert_eq!(r("amq.direct", &["k1"], None), vec!["a"]);
    // CC/BCC keys route too; results deduplicated and sorted.
    assert_eq!(r("amq.direct", &["k2", "k1", "k1"], None), vec!["a", "b"]);
    assert_eq!(r("amq.fanout", &["x"], None), vec!["c"]);
    assert_eq!(r("amq.topic", &["x.dl.routing.key"], None), vec!["a"]);
    assert_eq!(r("amq.topic", &["q.normal.routing.key"], None), vec!["b"]);
    assert!(r("amq.topic", &["normal.routing.key"], None).is_empty());
    let h = t(&[("h", s("1")), ("g", AMQPValue::ShortShortInt(2))]);
    assert_eq!(r("amq.headers", &[""], Some(&h)), vec!["a", "b"]);
    assert_eq!(
        r("amq.headers", &[""], Some(&t(&[("h", s("1"))]))),
        vec!["a"]
    );
    // Default exchange routes by queue name, only to existing queues.
    assert_eq!(r("", &["dlq", "missing"], None), vec!["dlq"]);
    // Errors.
    assert_eq!(
        topo.route("/", "nx", &[], None).unwrap_err().text,
        "NOT_FOUND - no exchange 'nx' in vhost '/'"
    );
    topo.declare_exchange("/", "int", "direct", false, false, false, true, &none())
        .unwrap();
    let e = topo.route("/", "int", &[], None).unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            403,
            "ACCESS_REFUSED - cannot publish to internal exchange 'int' in vhost '/'"
        )
    );
}

#[test]
fn alternate_exchange_routing() {
    let mut topo = Topology::new();
    create(&mut topo, &decl("un", true, false, false, none()));
    topo.bind("/", "un", "amq.fanout", "", &none()).unwrap();
    topo.declare_exchange(
        "/",
        "x",
        "direct",
        false,
        true,
        false,
        false,
        &t(&[("alternate-exchange", s("amq.fanout"))]),
    )
    .unwrap();
    assert_eq!(
        topo.route("/", "x", &["nothing".into()], None).unwrap(),
        vec!["un"]
    );
    // Via policy, with a cycle.
    topo.declare_exchange("/", "y", "direct", false, true, false, false, &none())
        .unwrap();
    topo.set_policy(Policy {
        vhost: "/".into(),
        name: "ae".into(),
        pattern: "^y$".into(),
        definition: json!({"alternate-exchange": "y"}),
        priority: 0,
        apply_to: "exchanges".into(),
    })
    .unwrap();
    assert!(topo
        .route("/", "y", &["k".into()], None)
        .unwrap()
        .is_empty());
}

#[test]
fn policies_and_effective_config() {
    let mut topo = Topology::new();
    let args = t(&[
        ("x-dead-letter-exchange", s("dlx")),
        ("x-dead-letter-strategy", s("at-least-once")),
        ("x-overflow", s("drop-head")),
        ("x-max-length", AMQPValue::LongInt(10)),
    ]);
    create(&mut topo, &decl("p_pol_a", true, false, false, args));
    let (c, w, p) = topo.effective_config("/", "p_pol_a").unwrap();
    assert_eq!(p, None);
    assert_eq!(
        (c.strategy, c.overflow, c.max_length),
        (DeadLetterStrategy::AtMostOnce, Overflow::DropHead, Some(10))
    );
    assert_eq!(w.len(), 1);

    let pol = |name: &str, def: serde_json::Value, prio: i32| Policy {
        vhost: "/".into(),
        name: name.into(),
        pattern: "^p_pol".into(),
        definition: def,
        priority: prio,
        apply_to: "queues".into(),
    };
    topo.set_policy(pol(
        "hi",
        json!({"max-length": 5, "queue-mode": "lazy"}),
        10,
    ))
    .unwrap();
    topo.set_policy(pol("lo", json!({"max-length": 7, "overflow": "reject-publish", "dead-letter-exchange": "other", "dead-letter-routing-key": "rk"}), 1)).unwrap();
    let (c, w, p) = topo.effective_config("/", "p_pol_a").unwrap();
    assert_eq!(
        p.as_deref(),
        Some("lo"),
        "queue-mode makes 'hi' inapplicable to a quorum queue"
    );
    assert!(w.is_empty());
    assert_eq!(c.overflow, Overflow::RejectPublish);
    assert_eq!(c.strategy, DeadLetterStrategy::AtLeastOnce);
    assert_eq!(
        c.dead_letter,
        Some(DeadLetterTarget {
            exchange: "dlx".into(),
            routing_key: Some("rk".into())
        })
    );
    assert_eq!(c.max_length, Some(7));
    assert_eq!(topo.policies("/").len(), 2);

    // Invalid policy refused, store unchanged.
    let e = topo
        .set_policy(pol("bad", json!({"max-length": -1}), 0))
        .unwrap_err();
    assert_eq!(
        e.text,
        "Validation failed\n\n-1 is not a valid maximum length\n"
    );
    assert_eq!(topo.policies("/").len(), 2);
    topo.clear_policy("/", "lo").unwrap();
    assert_eq!(
        topo.clear_policy("/", "lo").unwrap_err().text,
        "NOT_FOUND - Parameter does not exist"
    );
    assert_eq!(topo.effective_config("/", "p_pol_a").unwrap().2, None);
    assert!(topo.effective_config("/", "missing").is_none());
}

#[test]
fn serde_round_trip_bincode() {
    let mut topo = Topology::new();
    create(
        &mut topo,
        &decl(
            "q",
            true,
            false,
            false,
            t(&[
                ("x-max-length", AMQPValue::LongInt(5)),
                (
                    "x-arr",
                    AMQPValue::FieldArray(FieldArray::from(vec![s("a")])),
                ),
            ]),
        ),
    );
    create(&mut topo, &decl("ex", false, true, false, none()));
    topo.bind(
        "/",
        "q",
        "amq.headers",
        "",
        &t(&[("x-match", s("any")), ("h", AMQPValue::Double(1.5))]),
    )
    .unwrap();
    topo.set_policy(Policy {
        vhost: "/".into(),
        name: "p".into(),
        pattern: "^q".into(),
        definition: json!({"max-length": 3, "overflow": "reject-publish"}),
        priority: 2,
        apply_to: "all".into(),
    })
    .unwrap();
    topo.add_vhost("other");
    let cfg = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&topo, cfg).unwrap();
    let (back, _): (Topology, usize) = bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
    assert_eq!(
        back.queues().cloned().collect::<Vec<_>>(),
        topo.queues().cloned().collect::<Vec<_>>()
    );
    assert_eq!(back.policies("/"), topo.policies("/"));
    assert_eq!(
        back.bindings("/", "amq.headers"),
        topo.bindings("/", "amq.headers")
    );
    assert_eq!(back.vhosts().collect::<Vec<_>>(), vec!["/", "other"]);
    assert_eq!(back.last_group_id(), 2);
    assert_eq!(
        back.effective_config("/", "q"),
        topo.effective_config("/", "q")
    );
    // Re-encoding gives the same bytes (deterministic).
    assert_eq!(bincode::serde::encode_to_vec(&back, cfg).unwrap(), bytes);
    // JSON too.
    let js = serde_json::to_string(&topo).unwrap();
    let back: Topology = serde_json::from_str(&js).unwrap();
    assert_eq!(back.policies("/"), topo.policies("/"));
}

#[test]
fn exchange_to_exchange_bindings_route_and_unbind() {
    let mut t = Topology::new();
    let none = FieldTable::default();
    t.declare_exchange("/", "src", "topic", false, true, false, false, &none)
        .expect("src");
    t.declare_exchange("/", "dst", "fanout", false, true, false, false, &none)
        .expect("dst");
    create(
        &mut t,
        &decl("q1", true, false, false, FieldTable::default()),
    );
    t.bind("/", "q1", "dst", "", &none).expect("bind q");
    t.bind_exchange("/", "dst", "src", "a.*", &none)
        .expect("bind x");
    // A cycle back to the source must not loop.
    t.bind_exchange("/", "src", "dst", "", &none)
        .expect("bind back");
    assert_eq!(
        t.route("/", "src", &["a.x".into()], None).expect("route"),
        vec!["q1".to_string()]
    );
    assert!(t
        .route("/", "src", &["b.x".into()], None)
        .expect("route")
        .is_empty());
    t.unbind_exchange("/", "dst", "src", "a.*", &none)
        .expect("unbind");
    assert!(t
        .route("/", "src", &["a.x".into()], None)
        .expect("route")
        .is_empty());
    assert_eq!(
        t.bind_exchange("/", "dst", "missing", "", &none)
            .unwrap_err()
            .code,
        404
    );
    t.delete_exchange("/", "dst", false).expect("delete");
    assert!(
        t.bindings("/", "src").is_empty(),
        "bindings to a deleted exchange go too"
    );
}

#[test]
fn server_named_queue_may_use_the_amq_prefix() {
    let mut t = Topology::new();
    let mut d = decl("amq.gen-abc", false, true, false, FieldTable::default());
    assert_eq!(t.check_queue_declare(&d).unwrap_err().code, 403);
    d.server_named = true;
    create(&mut t, &d);
    assert!(t.queue("/", "amq.gen-abc").is_some());
}

#[test]
fn vhost_queue_limit_refuses_new_queues_only() {
    let mut topo = Topology::new();
    topo.set_vhost_limits("/", VhostLimits::parse(r#"{"max-queues": 2}"#).unwrap())
        .unwrap();
    create(&mut topo, &decl("a", true, false, false, none()));
    create(&mut topo, &decl("b", true, false, false, none()));
    // 3.10.8 observed: a new queue (durable or exclusive) is refused with 406 ...
    let e = topo
        .check_queue_declare(&decl("c", true, false, false, none()))
        .unwrap_err();
    assert_eq!(e.code, 406);
    assert_eq!(
        e.text,
        "PRECONDITION_FAILED - cannot declare queue 'c': queue limit in vhost '/' (2) is reached"
    );
    let mut server_named = decl("amq.gen-x", false, true, false, none());
    server_named.server_named = true;
    let e = topo.check_queue_declare(&server_named).unwrap_err();
    assert!(
        e.text.contains("queue limit in vhost '/' (2)"),
        "{}",
        e.text
    );
    // ... while redeclaring an existing one (even over the limit) and passive declares work.
    assert!(matches!(
        topo.check_queue_declare(&decl("a", true, false, false, none())),
        Ok(QueueDeclared::Existing(_))
    ));
    // Other vhosts are not limited; a deleted queue frees a place; -1 lifts the limit.
    topo.add_vhost("other");
    let mut d = decl("c", true, false, false, none());
    d.vhost = "other".into();
    create(&mut topo, &d);
    topo.delete_queue("/", "a");
    create(&mut topo, &decl("c", true, false, false, none()));
    topo.set_vhost_limits("/", VhostLimits::parse(r#"{"max-queues": -1}"#).unwrap())
        .unwrap();
    create(&mut topo, &decl("d", true, false, false, none()));
    // 0 refuses every new queue; clearing (empty limits) removes the entry.
    topo.set_vhost_limits("/", VhostLimits::parse(r#"{"max-queues": 0}"#).unwrap())
        .unwrap();
    assert!(topo
        .check_queue_declare(&decl("e", true, false, false, none()))
        .is_err());
    topo.set_vhost_limits("/", VhostLimits::default()).unwrap();
    assert!(topo.vhost_limits("/").is_empty());
    create(&mut topo, &decl("e", true, false, false, none()));
    assert_eq!(
        topo.set_vhost_limits("nope", VhostLimits::default())
            .unwrap_err()
            .text,
        "NOT_ALLOWED - vhost nope not found"
    );
}

/// The replicas per node placement reads stay equal to a count over the
/// records through creates, member changes, deletes, a vhost deletion and a
/// snapshot round trip (issue 31: kept, not recounted per declare).
#[test]
fn replica_counts_follow_the_queue_records() {
    let recount = |t: &Topology| replica_counts::ReplicaCounts::of(t.queues());
    let counts = |t: &Topology| (1..=4).map(|n| t.replicas_on(n)).collect::<Vec<_>>();
    let mut topo = Topology::new();
    topo.add_vhost("v");
    let with = |name: &str, members: Vec<u64>| QueueDeclare {
        members,
        ..decl(name, true, false, false, none())
    };
    let a = create(&mut topo, &with("a", vec![1, 2, 3]));
    create(&mut topo, &with("b", vec![2, 3, 4]));
    create(
        &mut topo,
        &QueueDeclare {
            vhost: "v".into(),
            ..with("c", vec![1, 4])
        },
    );
    assert_eq!(counts(&topo), vec![2, 2, 2, 2]);
    topo.set_queue_members("/", "a", a.group_id, vec![1, 2])
        .unwrap();
    assert_eq!(counts(&topo), vec![2, 2, 1, 2]);
    topo.delete_queue("/", "b");
    assert_eq!(counts(&topo), vec![2, 1, 0, 1]);
    // A record replacing one of the same name (add_queue's contract).
    topo.add_queue(QueueRecord {
        members: vec![3],
        group_id: 99,
        ..a
    });
    assert_eq!(counts(&topo), vec![1, 0, 1, 1]);
    let bytes = raft_log::codec::encode(&topo).unwrap();
    let back = Topology::decode_snapshot(&bytes).unwrap();
    assert_eq!(counts(&back), counts(&topo), "rebuilt from a snapshot");
    topo.delete_vhost("v");
    assert_eq!(counts(&topo), vec![0, 0, 1, 0]);
    assert_eq!(counts(&topo), {
        let r = recount(&topo);
        (1..=4).map(|n| r.get(n)).collect::<Vec<_>>()
    });
}
