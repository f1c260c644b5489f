//! How the management API answers a list (RabbitMQ 3.10.8 `rabbit_mgmt_util:reply_list`
//! and `filter_and_paginate`): sorted by `sort` (a dotted field path; default vhost then
//! name) and `sort_reverse=true`; with `page` (and `page_size`, default 100, at most
//! 500; `name` filters names by case-insensitive substring, or by case-insensitive
//! regular expression with `use_regex=true`) the reply is
//! `{"filtered_count", "item_count", "items", "page", "page_count", "page_size",
//! "total_count"}`; `columns=a,b.c` keeps only those fields (of each item).

use std::cmp::Ordering;
use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::body::query_params;
use super::{ok, ApiResult};
use crate::http::ApiError;

/// RabbitMQ's default and largest page sizes.
const DEFAULT_PAGE_SIZE: u64 = 100;
const MAX_PAGE_SIZE: u64 = 500;

/// Sorts, filters, pages and cuts `items` as the request's query string asks.
///
/// Errors: 400 `bad_request` "Invalid pagination parameters: ..." for a page or page
/// size that is not a positive integer (page size ≤ 500), or a bad `name` regex; 400
/// "Page out of range" past the last page.
pub fn reply_list(items: Vec<Value>, uri: &axum::http::Uri) -> ApiResult {
    let q = query_params(uri);
    let v = list_value(items, &q)?;
    ok(v)
}

/// As [`reply_list`], the JSON value (a page object when `page` is given).
///
/// Errors: as [`reply_list`].
pub fn list_page(items: Vec<Value>, uri: &axum::http::Uri) -> Result<Value, ApiError> {
    list_value(items, &query_params(uri))
}

/// `items` cut to the query's `columns` (all of them without).
pub fn columns_of(items: Vec<Value>, q: &HashMap<String, String>) -> Value {
    match q.get("columns").filter(|c| !c.is_empty()) {
        None => Value::Array(items),
        Some(c) => {
            let cols: Vec<Vec<String>> = c
                .split(',')
                .map(|c| c.split('.').map(str::to_owned).collect())
                .collect();
            Value::Array(items.into_iter().map(|i| keep_columns(i, &cols)).collect())
        }
    }
}

fn list_value(mut items: Vec<Value>, q: &HashMap<String, String>) -> Result<Value, ApiError> {
    let sort: Vec<String> = match q.get("sort").map(String::as_str) {
        None | Some("") => vec!["vhost".into(), "name".into()],
        Some(s) => {
            let mut v = vec![s.to_owned()];
            for d in ["vhost", "name"] {
                if s != d {
                    v.push(d.into());
                }
            }
            v
        }
    };
    items.sort_by(|a, b| {
        for key in &sort {
            let o = compare(dotted(a, key), dotted(b, key));
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    });
    if q.get("sort_reverse").map(String::as_str) == Some("true") {
        items.reverse();
    }
    let columns = q.get("columns").filter(|c| !c.is_empty()).map(|c| {
        c.split(',')
            .map(|c| c.split('.').map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    });
    let cut = |items: Vec<Value>| -> Vec<Value> {
        match &columns {
            None => items,
            Some(cols) => items.into_iter().map(|i| keep_columns(i, cols)).collect(),
        }
    };
    let Some(page) = q.get("page") else {
        return Ok(Value::Array(cut(items)));
    };
    let invalid = || {
        ApiError::bad_request(format!(
            "Invalid pagination parameters: page number {page}, page size {}",
            q.get("page_size").map_or("undefined", String::as_str)
        ))
    };
    let page: u64 = page.parse().ok().filter(|p| *p > 0).ok_or_else(invalid)?;
    let page_size: u64 = match q.get("page_size") {
        None => DEFAULT_PAGE_SIZE,
        Some(s) => s
            .parse()
            .ok()
            .filter(|s| *s > 0 && *s <= MAX_PAGE_SIZE)
            .ok_or_else(invalid)?,
    };
    let total = items.len();
    let filtered: Vec<Value> = match q.get("name").filter(|n| !n.is_empty()) {
        None => items,
        Some(name) => {
            let matches: Box<dyn Fn(&str) -> bool> =
                if q.get("use_regex").map(String::as_str) == Some("true") {
                    let re = regex::RegexBuilder::new(name)
                        .case_insensitive(true)
                        .build()
                        .map_err(|e| ApiError::bad_request(format!("invalid regex: {e}")))?;
                    Box::new(move |s| re.is_match(s))
                } else {
                    let needle = name.to_lowercase();
                    Box::new(move |s| s.to_lowercase().contains(&needle))
                };
            items
                .into_iter()
                .filter(|i| i.get("name").and_then(Value::as_str).is_some_and(&matches))
                .collect()
        }
    };
    let filtered_count = filtered.len();
    let page_count = filtered_count.div_ceil(page_size as usize);
    let offset = ((page - 1) * page_size) as usize;
    if offset > filtered_count || (offset == filtered_count && filtered_count > 0) {
        return Err(ApiError::bad_request(format!(
            "Page out of range, page: {page} page size: {page_size}, len: {filtered_count}"
        )));
    }
    let page_items: Vec<Value> = filtered
        .into_iter()
        .skip(offset)
        .take(page_size as usize)
        .collect();
    Ok(json!({
        "total_count": total,
        "item_count": page_items.len(),
        "filtered_count": filtered_count,
        "page": page,
        "page_size": page_size,
        "page_count": page_count,
        "items": cut(page_items),
    }))
}

/// The value at a dotted path (`message_stats.publish`), absent as `null`.
fn dotted<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

/// RabbitMQ puts a missing value first; numbers by value, strings by bytes.
fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        (Value::Number(_), _) => Ordering::Less,
        (_, Value::Number(_)) => Ordering::Greater,
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// Keeps the fields named by `cols` (each a path; a one-element path keeps the whole
/// field), as `rabbit_mgmt_util:extract_column_items/2`.
fn keep_columns(item: Value, cols: &[Vec<String>]) -> Value {
    let Value::Object(m) = item else {
        return item;
    };
    let mut out = Map::new();
    for (k, v) in m {
        let sub: Vec<Vec<String>> = cols
            .iter()
            .filter(|c| c.first() == Some(&k))
            .map(|c| c[1..].to_vec())
            .collect();
        if sub.is_empty() {
            continue;
        }
        if sub.iter().any(Vec::is_empty) {
            out.insert(k, v);
        } else {
            out.insert(k, keep_columns(v, &sub));
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn items(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"name": format!("Q{i:03}"), "vhost": "/", "messages": n - i, "arguments": {"x": i}}))
            .collect()
    }

    #[test]
    fn pages_filter_by_name_and_count_as_rabbitmq() {
        let v = list_value(items(250), &q(&[("page", "2"), ("page_size", "100")])).unwrap();
        assert_eq!(v["total_count"], 250);
        assert_eq!(v["filtered_count"], 250);
        assert_eq!(v["item_count"], 100);
        assert_eq!(v["page_count"], 3);
        assert_eq!(v["items"][0]["name"], "Q100");
        let v = list_value(items(250), &q(&[("page", "1"), ("name", "q01")])).unwrap();
        assert_eq!(v["filtered_count"], 10, "Q010..Q019, case-insensitive");
        assert_eq!(v["page_size"], 100);
        let v = list_value(
            items(250),
            &q(&[("page", "1"), ("name", "^q00[12]$"), ("use_regex", "true")]),
        )
        .unwrap();
        assert_eq!(v["filtered_count"], 2);
        let empty = list_value(vec![], &q(&[("page", "1")])).unwrap();
        assert_eq!(empty["page_count"], 0);
        assert_eq!(empty["items"], json!([]));
        for bad in [
            q(&[("page", "0")]),
            q(&[("page", "1"), ("page_size", "501")]),
            q(&[("page", "x")]),
            q(&[("page", "4"), ("page_size", "100")]),
        ] {
            assert!(list_value(items(250), &bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sorts_and_cuts_columns() {
        let v = list_value(
            items(3),
            &q(&[("sort", "messages"), ("columns", "name,arguments.x")]),
        )
        .unwrap();
        assert_eq!(
            v,
            json!([{"name": "Q002", "arguments": {"x": 2}},
                   {"name": "Q001", "arguments": {"x": 1}},
                   {"name": "Q000", "arguments": {"x": 0}}])
        );
        let v = list_value(
            items(3),
            &q(&[("sort_reverse", "true"), ("columns", "name")]),
        )
        .unwrap();
        assert_eq!(
            v,
            json!([{"name": "Q002"}, {"name": "Q001"}, {"name": "Q000"}])
        );
    }
}
