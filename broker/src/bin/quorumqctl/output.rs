//! How results are printed: `--formatter table|json`, listings as rabbitmqctl
//! lays them out, and stdout writes that end quietly on a closed pipe.

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;

/// Output format (rabbitmqctl `--formatter`); other values are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Formatter {
    /// Tab-separated columns after a header line.
    Table,
    /// JSON: an array of objects for lists, an object otherwise.
    Json,
}

/// Prints a progress line before a result table (not in JSON output,
/// which must stay one JSON document).
pub fn banner(formatter: Formatter, text: &str) {
    if formatter == Formatter::Table {
        emit(text);
    }
}

/// Writes `text` to stdout. A closed stdout (`quorumqctl list_queues | head`)
/// ends the process quietly (status 0) instead of panicking as `println!` does.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("quorumqctl: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// One listed item (a queue, a policy, a node): keys and values in output
/// order. JSON prints it as an object with the keys in this order (a
/// `serde_json::Map` would sort them); the table picks its cells by key.
pub struct Row(pub Vec<(&'static str, Value)>);

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl Row {
    /// Table cell of `key` ("" when the row has no such key).
    pub fn cell(&self, key: &str) -> String {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map_or_else(String::new, |(_, v)| cell(v))
    }
}

/// A value as a table cell: strings as they are, arrays comma-separated
/// (`1,2,3`), null empty, anything else as JSON.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

/// One JSON value on one line.
pub fn to_json<T: Serialize>(v: &T) -> String {
    // Serializing rows, strings, numbers and `Value`s cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A listing command's output. JSON: laid out as rabbitmqctl's json
/// formatter does — `[`, one object per line (comma-separated), `]`; `[]`
/// when empty. Table: a header line of `columns`, then one tab-separated line
/// of those cells per row.
pub fn listing(formatter: Formatter, columns: &[&str], rows: &[Row]) -> String {
    match formatter {
        Formatter::Json if rows.is_empty() => "[]\n".into(),
        Formatter::Json => {
            let lines: Vec<String> = rows.iter().map(to_json).collect();
            format!("[\n{}\n]\n", lines.join(",\n"))
        }
        Formatter::Table => {
            let mut out = columns.join("\t") + "\n";
            for row in rows {
                let cells: Vec<String> = columns.iter().map(|c| row.cell(c)).collect();
                out += &cells.join("\t");
                out.push('\n');
            }
            out
        }
    }
}

/// Parsing and splitting printed output, for the commands' unit tests.
#[cfg(test)]
pub mod testing {
    use serde_json::Value;

    /// `text` as JSON; panics (a test failure) when it is not.
    pub fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}): {text}"))
    }

    /// Table lines split into cells.
    pub fn cells(text: &str) -> Vec<Vec<&str>> {
        text.lines().map(|l| l.split('\t').collect()).collect()
    }
}
