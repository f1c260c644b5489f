//! Policies (rabbitmqctl `set_policy`, `clear_policy`, `list_policies`).

use quorumq_proto::v1::{ClearPolicyRequest, ListPoliciesRequest, Policy, SetPolicyRequest};
use serde_json::{json, Value};

use crate::output::{emit, listing, Formatter, Row};
use crate::{ok_or_bail, Client};

/// `set_policy NAME PATTERN DEFINITION [--priority N] [--apply-to queues|exchanges|all]`:
/// `policy` in its vhost, its definition the JSON object as typed.
///
/// Errors: the call fails, or the node refuses the policy (its validation text).
pub async fn set(c: &mut Client, policy: Policy) -> anyhow::Result<()> {
    let Policy {
        vhost,
        name,
        pattern,
        definition_json: definition,
        priority,
        ..
    } = &policy;
    emit(&format!("Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority \"{priority}\" for vhost \"{vhost}\" ...\n"));
    let r = c
        .set_policy(SetPolicyRequest {
            policy: Some(policy),
        })
        .await?
        .into_inner();
    ok_or_bail(r)
}

/// `clear_policy NAME` in `vhost`.
///
/// Errors: the call fails, or the node refuses (no such policy).
pub async fn clear(c: &mut Client, vhost: String, name: String) -> anyhow::Result<()> {
    emit(&format!(
        "Clearing policy \"{name}\" on vhost \"{vhost}\" ...\n"
    ));
    let r = c
        .clear_policy(ClearPolicyRequest { vhost, name })
        .await?
        .into_inner();
    ok_or_bail(r)
}

/// `list_policies` of `vhost` ([`POLICY_COLUMNS`]).
///
/// Errors: the call fails.
pub async fn list(c: &mut Client, f: Formatter, vhost: String) -> anyhow::Result<()> {
    let r = c.list_policies(ListPoliciesRequest { vhost }).await?;
    let rows: Vec<Row> = r.into_inner().policies.iter().map(policy_row).collect();
    emit(&listing(f, POLICY_COLUMNS, &rows));
    Ok(())
}

/// `list_policies` columns (table and JSON alike), keyed as rabbitmqctl's.
pub const POLICY_COLUMNS: &[&str] = &[
    "vhost",
    "name",
    "pattern",
    "apply-to",
    "definition",
    "priority",
];

/// One policy of `list_policies`; `definition` is the policy's JSON object
/// (its text if it does not parse).
pub fn policy_row(p: &Policy) -> Row {
    let definition = serde_json::from_str(&p.definition_json)
        .unwrap_or_else(|_| Value::String(p.definition_json.clone()));
    Row(vec![
        ("vhost", json!(p.vhost)),
        ("name", json!(p.name)),
        ("pattern", json!(p.pattern)),
        ("apply-to", json!(p.apply_to)),
        ("definition", definition),
        ("priority", json!(p.priority)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{cells, parse};

    fn policy() -> Policy {
        Policy {
            vhost: "/".into(),
            name: "DLX".into(),
            pattern: ".*".into(),
            definition_json: r#"{"dead-letter-exchange":"dlx"}"#.into(),
            priority: 1,
            apply_to: "queues".into(),
        }
    }

    #[test]
    fn list_policies_json_and_table() {
        let rows = [policy_row(&policy())];
        let text = listing(Formatter::Json, POLICY_COLUMNS, &rows);
        assert_eq!(
            parse(&text),
            json!([{"vhost": "/", "name": "DLX", "pattern": ".*", "apply-to": "queues",
                    "definition": {"dead-letter-exchange": "dlx"}, "priority": 1}])
        );
        assert!(
            text.starts_with("[\n{\"vhost\":\"/\",\"name\":\"DLX\","),
            "{text}"
        );
        let t = listing(Formatter::Table, POLICY_COLUMNS, &rows);
        assert_eq!(
            cells(&t),
            [
                [
                    "vhost",
                    "name",
                    "pattern",
                    "apply-to",
                    "definition",
                    "priority"
                ],
                [
                    "/",
                    "DLX",
                    ".*",
                    "queues",
                    r#"{"dead-letter-exchange":"dlx"}"#,
                    "1"
                ],
            ]
        );
        // A definition that is not JSON is shown as its text.
        let mut bad = policy();
        bad.definition_json = "{oops".into();
        let rows = [policy_row(&bad)];
        assert_eq!(
            parse(&listing(Formatter::Json, POLICY_COLUMNS, &rows))[0]["definition"],
            "{oops"
        );
        assert_eq!(
            cells(&listing(Formatter::Table, POLICY_COLUMNS, &rows))[1][4],
            "{oops"
        );
    }
}
