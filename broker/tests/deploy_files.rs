//! The deploy files (`deploy/`) against the binaries they run: fails when a
//! flag, port, probe or config key drifts from what `quorumq` and
//! `quorumqctl` accept.
//!
//! Every file is parsed for real (YAML with yaml-rust2, TOML with
//! `Config::load`/toml, the systemd unit as an INI file, shell scripts with a
//! small POSIX-word tokenizer, the Dockerfile by instruction), and each check
//! is a function from a file's text to the list of problems found, each
//! naming the file and the flag or port. The `drifted_*` tests feed those
//! functions edited copies of the real files and expect the edit reported.
//!
//! Checked:
//! - every `--flag` given to `quorumq` (compose `command`, the Kubernetes
//!   container's `sh -c` script including its `set --` arguments, the unit's
//!   `ExecStart`, the Dockerfile's `CMD`, `sh` blocks of deploy/README.md) is
//!   in `quorumq --help`, and has a value when it takes one; for `quorumqctl`:
//!   the subcommand exists, flags are in the top-level or subcommand help,
//!   positional arguments fit the usage line and its possible values;
//! - ports: each listener flag (`--amqp-listen`, `--cluster-listen`,
//!   `--http-listen`) gives a port of one kind (AMQP, cluster, HTTP); every
//!   other use of a port in the same file must be a listener port of the
//!   right kind: `--advertise`/`--peers`/`--join`/`quorumqctl --node` →
//!   cluster, HTTP probes and health checks → HTTP, `--amqp-advertise` →
//!   AMQP (or a compose host port published onto it), container ports,
//!   Service target ports, compose published ports, Dockerfile `EXPOSE` →
//!   any listener port (by kind when the port is named `amqp`, `cluster` or
//!   `http`); and every listener port is declared where the file declares
//!   ports (containerPort, EXPOSE);
//! - Kubernetes: readiness probe `/health/ready`, liveness and startup probes
//!   `/health/live`; replicas = number of `--peers` entries, which name node
//!   ids 1..=replicas at `<sts>-<id-1>.<serviceName>.…`; Parallel pod
//!   management; the headless Service publishes not-ready addresses; Services
//!   and the PodDisruptionBudget select the pod template's labels; the
//!   script `exec`s quorumq (else sh gets SIGTERM and nothing drains);
//! - compose: every service has a `/health/ready` health check; `--peers`
//!   identical on every node, listing each node at its `--advertise`;
//! - stop grace periods are 60 s (a drain takes up to ~15 s);
//! - data directories: `--data-dir` is the mounted volume / PVC / `VOLUME`,
//!   the TOMLs' `data_dir` is the unit's StateDirectory;
//! - every TOML under deploy/ loads with `Config::load` (unknown keys fail),
//!   the systemd node TOMLs agree with each other and with `ExecStart`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use quorumq::config::Config;
use yaml_rust2::{Yaml, YamlLoader};

/// Seconds every supervisor waits after SIGTERM before SIGKILL: a graceful
/// stop drains (hands queue leaderships over) for up to ~15 s first.
const STOP_GRACE_SECS: u64 = 60;

// ----------------------------------------------------------------------------
// The binaries' help
// ----------------------------------------------------------------------------

/// A positional argument of a usage line.
#[derive(Debug, Clone)]
struct Positional {
    name: String,
    required: bool,
    variadic: bool,
    values: Vec<String>,
}

/// What one `--help` text accepts.
#[derive(Debug, Default, Clone)]
struct Help {
    /// Flag (`--node`, `-p`) → takes a value.
    flags: BTreeMap<String, bool>,
    /// Possible values of a flag, when the help lists them.
    flag_values: BTreeMap<String, Vec<String>>,
    /// Subcommands (top-level `quorumqctl` only).
    subcommands: BTreeSet<String>,
    positionals: Vec<Positional>,
}

/// Parses clap's long help: `Usage:` line, `Commands:`, `Arguments:` and
/// `Options:` sections, with "Possible values" under an entry.
fn parse_help(text: &str, program_words: usize) -> Help {
    let mut help = Help::default();
    let mut section = "";
    // The entry (flag or positional index) possible values belong to.
    enum Entry {
        None,
        Flag(String),
        Arg(usize),
    }
    let mut entry = Entry::None;
    let add_values = |help: &mut Help, entry: &Entry, values: Vec<String>| match entry {
        Entry::Flag(f) => help
            .flag_values
            .entry(f.clone())
            .or_default()
            .extend(values),
        Entry::Arg(i) => help.positionals[*i].values.extend(values),
        Entry::None => {}
    };
    for line in text.lines() {
        if let Some(usage) = line.strip_prefix("Usage: ") {
            for tok in usage.split_whitespace().skip(program_words) {
                if tok == "[OPTIONS]" || tok == "<COMMAND>" {
                    continue;
                }
                let variadic = tok.ends_with("...");
                let tok = tok.trim_end_matches("...");
                let required = tok.starts_with('<');
                let name = tok.trim_matches(|c| "<>[]".contains(c)).to_string();
                help.positionals.push(Positional {
                    name,
                    required,
                    variadic,
                    values: Vec::new(),
                });
            }
            continue;
        }
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line.trim_end_matches(':');
            entry = Entry::None;
            continue;
        }
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(list) = trimmed
            .strip_prefix("[possible values: ")
            .and_then(|r| r.strip_suffix(']'))
        {
            let values = list.split(", ").map(str::to_string).collect();
            add_values(&mut help, &entry, values);
            continue;
        }
        if indent > 6 {
            // "- table: ..." under "Possible values:".
            if let Some((v, _)) = trimmed.strip_prefix("- ").and_then(|r| r.split_once(':')) {
                add_values(&mut help, &entry, vec![v.trim().to_string()]);
            }
            continue;
        }
        match section {
            "Commands" => {
                if let Some(name) = trimmed.split_whitespace().next() {
                    help.subcommands.insert(name.to_string());
                }
            }
            "Arguments" => {
                let name = trimmed.split_whitespace().next().unwrap_or("");
                let name = name
                    .trim_end_matches("...")
                    .trim_matches(|c| "<>[]".contains(c));
                entry = match help.positionals.iter().position(|p| p.name == name) {
                    Some(i) => Entry::Arg(i),
                    None => Entry::None,
                };
            }
            "Options" => {
                let mut toks = trimmed.split_whitespace().peekable();
                let mut names = Vec::new();
                while let Some(t) = toks.peek() {
                    let t = t.trim_end_matches(',');
                    if t.starts_with('-') && t.len() > 1 && !t.starts_with("- ") {
                        names.push(t.to_string());
                        toks.next();
                    } else {
                        break;
                    }
                }
                let takes_value = toks.next().is_some_and(|t| t.starts_with('<'));
                for n in &names {
                    help.flags.insert(n.clone(), takes_value);
                }
                entry = match names.last() {
                    Some(n) => Entry::Flag(n.clone()),
                    None => Entry::None,
                };
            }
            _ => {}
        }
    }
    help
}

/// The help of both binaries and of every `quorumqctl` subcommand.
struct Bins {
    quorumq: Help,
    quorumqctl: Help,
    ctl_sub: BTreeMap<String, Help>,
}

fn run_help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {bin} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let q = env!("CARGO_BIN_EXE_quorumq");
        let ctl = env!("CARGO_BIN_EXE_quorumqctl");
        let quorumq = parse_help(&run_help(q, &["--help"]), 1);
        let quorumqctl = parse_help(&run_help(ctl, &["--help"]), 1);
        assert!(
            quorumq.flags.contains_key("--node-id"),
            "quorumq --help parsed: {quorumq:?}"
        );
        assert!(
            quorumqctl.subcommands.contains("cluster_status"),
            "{quorumqctl:?}"
        );
        let ctl_sub = quorumqctl
            .subcommands
            .iter()
            .filter(|s| *s != "help")
            .map(|s| (s.clone(), parse_help(&run_help(ctl, &[s, "--help"]), 2)))
            .collect();
        Bins {
            quorumq,
            quorumqctl,
            ctl_sub,
        }
    })
}

// ----------------------------------------------------------------------------
// Shell words
// ----------------------------------------------------------------------------

/// Splits a POSIX `sh` script into simple commands, each a list of words with
/// quotes removed. Enough for deploy scripts: single and double quotes,
/// backslash escapes and line continuations, `$(…)`, `$((…))` and `${…}`
/// kept whole inside their word, `#` comments; newlines, `;`, `&`, `|`, `(`
/// and `)` end a command. Redirections stay part of the words.
fn shell_commands(script: &str) -> Vec<Vec<String>> {
    let c: Vec<char> = script.chars().collect();
    let n = c.len();
    let mut cmds = Vec::new();
    let mut cmd: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut i = 0;
    fn end_word(cmd: &mut Vec<String>, word: &mut String, in_word: &mut bool) {
        if *in_word {
            cmd.push(std::mem::take(word));
            *in_word = false;
        }
    }
    while i < n {
        match c[i] {
            '\\' => {
                if i + 1 < n && c[i + 1] != '\n' {
                    word.push(c[i + 1]);
                    in_word = true;
                }
                i += 2;
            }
            '\'' => {
                in_word = true;
                i += 1;
                while i < n && c[i] != '\'' {
                    word.push(c[i]);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                in_word = true;
                i += 1;
                while i < n && c[i] != '"' {
                    if c[i] == '\\' && i + 1 < n {
                        match c[i + 1] {
                            '\n' => {}
                            d @ ('"' | '\\' | '$' | '`') => word.push(d),
                            d => {
                                word.push('\\');
                                word.push(d);
                            }
                        }
                        i += 2;
                    } else if c[i] == '$' && i + 1 < n && matches!(c[i + 1], '(' | '{') {
                        i = read_substitution(&c, i, &mut word);
                    } else {
                        word.push(c[i]);
                        i += 1;
                    }
                }
                i += 1;
            }
            '$' if i + 1 < n && matches!(c[i + 1], '(' | '{') => {
                in_word = true;
                i = read_substitution(&c, i, &mut word);
            }
            '#' if !in_word => {
                while i < n && c[i] != '\n' {
                    i += 1;
                }
            }
            ' ' | '\t' | '\r' => {
                end_word(&mut cmd, &mut word, &mut in_word);
                i += 1;
            }
            '\n' | ';' | '&' | '|' | '(' | ')' => {
                end_word(&mut cmd, &mut word, &mut in_word);
                if !cmd.is_empty() {
                    cmds.push(std::mem::take(&mut cmd));
                }
                i += 1;
            }
            ch => {
                word.push(ch);
                in_word = true;
                i += 1;
            }
        }
    }
    end_word(&mut cmd, &mut word, &mut in_word);
    if !cmd.is_empty() {
        cmds.push(cmd);
    }
    // Reserved words in front of a command (`if`, `then`, ...) are not it.
    for cmd in &mut cmds {
        let skip = cmd
            .iter()
            .take_while(|w| {
                [
                    "if", "then", "else", "elif", "do", "while", "until", "!", "{",
                ]
                .contains(&w.as_str())
            })
            .count();
        cmd.drain(..skip);
    }
    cmds.retain(|cmd| !cmd.is_empty());
    cmds
}

/// Copies `$(…)` / `${…}` starting at `c[start]` (the `$`) into `word`,
/// nested parentheses and quotes included; returns the index after it.
fn read_substitution(c: &[char], start: usize, word: &mut String) -> usize {
    let open = c[start + 1];
    let close = if open == '(' { ')' } else { '}' };
    word.push('$');
    word.push(open);
    let mut depth = 1;
    let mut i = start + 2;
    while i < c.len() && depth > 0 {
        let ch = c[i];
        word.push(ch);
        match ch {
            '\\' if i + 1 < c.len() => {
                i += 1;
                word.push(c[i]);
            }
            '\'' | '"' => {
                i += 1;
                while i < c.len() && c[i] != ch {
                    word.push(c[i]);
                    i += 1;
                }
                if i < c.len() {
                    word.push(ch);
                }
            }
            x if x == open => depth += 1,
            x if x == close => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    i
}

// ----------------------------------------------------------------------------
// Invocations of the binaries
// ----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Program {
    Quorumq,
    Quorumqctl,
}

fn program_of(word: &str) -> Option<Program> {
    match word.rsplit('/').next() {
        Some("quorumq") => Some(Program::Quorumq),
        Some("quorumqctl") => Some(Program::Quorumqctl),
        _ => None,
    }
}

/// One run of `quorumq` or `quorumqctl` found in a file.
#[derive(Debug, Clone)]
struct Invocation {
    program: Program,
    args: Vec<String>,
    /// Started by `exec` in a script, or directly as the process (so it,
    /// not a shell, receives SIGTERM).
    execed: bool,
    /// Where: "deploy/x.yml: services.quorumq1.command".
    origin: String,
}

/// The invocations of an argv (a container's command + args, a compose
/// command, a health check): the binary itself, or `sh -c SCRIPT`.
fn invocations_in_argv(argv: &[String], origin: &str) -> Vec<Invocation> {
    let Some(first) = argv.first() else {
        return Vec::new();
    };
    let shell = matches!(first.rsplit('/').next(), Some("sh" | "bash" | "dash"));
    if shell && argv.get(1).map(String::as_str) == Some("-c") {
        return invocations_in_script(argv.get(2).map_or("", String::as_str), origin);
    }
    match program_of(first) {
        Some(program) => vec![Invocation {
            program,
            args: argv[1..].to_vec(),
            execed: true,
            origin: origin.to_string(),
        }],
        None => Vec::new(),
    }
}

/// The invocations in a shell script; `"$@"` in one stands for the
/// arguments of every `set --` in the script (a script that picks some
/// flags per branch). Variables assigned one value (`D="a.${NS}"`) are
/// expanded in the arguments; others (`$(...)`, several values) stay as
/// written.
fn invocations_in_script(script: &str, origin: &str) -> Vec<Invocation> {
    let cmds = shell_commands(script);
    let mut vars: BTreeMap<String, Option<String>> = BTreeMap::new();
    for cmd in cmds
        .iter()
        .filter(|c| c.iter().all(|w| assignment(w).is_some()))
    {
        for (name, value) in cmd.iter().filter_map(|w| assignment(w)) {
            let value = expand(value, &vars);
            let known = vars.get(name).cloned();
            let merged = match known {
                None => Some(value),
                Some(Some(old)) if old == value => Some(old),
                Some(_) => None,
            };
            vars.insert(name.to_string(), merged);
        }
    }
    let set_args: Vec<String> = cmds
        .iter()
        .filter(|c| c.len() >= 2 && c[0] == "set" && c[1] == "--")
        .flat_map(|c| c[2..].iter().map(|w| expand(w, &vars)))
        .collect();
    let mut out = Vec::new();
    for cmd in &cmds {
        let execed = cmd[0] == "exec";
        let words = if execed { &cmd[1..] } else { &cmd[..] };
        let Some(program) = words.first().and_then(|w| program_of(w)) else {
            continue;
        };
        let mut args = Vec::new();
        for w in &words[1..] {
            if w == "$@" {
                args.extend(set_args.iter().cloned());
            } else {
                args.push(expand(w, &vars));
            }
        }
        out.push(Invocation {
            program,
            args,
            execed,
            origin: format!("{origin} (script)"),
        });
    }
    out
}

/// `NAME=VALUE` → (NAME, VALUE).
fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then_some((name, value))
}

/// `word` with `${NAME}` / `$NAME` replaced where `vars` has one value for NAME.
fn expand(word: &str, vars: &BTreeMap<String, Option<String>>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match vars.get(name) {
            Some(Some(value)) if len > 0 => {
                out.push_str(value);
                rest = &after[len..];
            }
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A flag and its value as given (`--flag=v` or `--flag v`).
type FlagValue = (String, Option<String>);

/// Checks an invocation's arguments against the binary's help; returns the
/// flags with their values.
fn check_invocation(inv: &Invocation, bins: &Bins, errs: &mut Vec<String>) -> Vec<FlagValue> {
    let (name, top) = match inv.program {
        Program::Quorumq => ("quorumq", &bins.quorumq),
        Program::Quorumqctl => ("quorumqctl", &bins.quorumqctl),
    };
    let mut help = top;
    let mut help_name = format!("{name} --help");
    let mut subcommand: Option<String> = None;
    let mut positionals: Vec<String> = Vec::new();
    let mut flags = Vec::new();
    let mut i = 0;
    while i < inv.args.len() {
        let arg = &inv.args[i];
        i += 1;
        if arg.starts_with('-') && arg.len() > 1 && arg != "--" {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let Some(&takes_value) = help.flags.get(&flag) else {
                errs.push(format!(
                    "{}: flag {flag} is not in `{help_name}`",
                    inv.origin
                ));
                continue;
            };
            let value = if takes_value {
                match inline {
                    Some(v) => Some(v),
                    None if i < inv.args.len() && !inv.args[i].starts_with("--") => {
                        i += 1;
                        Some(inv.args[i - 1].clone())
                    }
                    None => {
                        errs.push(format!("{}: flag {flag} needs a value", inv.origin));
                        None
                    }
                }
            } else {
                if inline.is_some() {
                    errs.push(format!("{}: flag {flag} takes no value", inv.origin));
                }
                None
            };
            if let (Some(v), Some(allowed)) = (&value, help.flag_values.get(&flag)) {
                if !v.contains('$') && !allowed.contains(v) {
                    errs.push(format!(
                        "{}: {flag} {v}: not one of {allowed:?} (`{help_name}`)",
                        inv.origin
                    ));
                }
            }
            flags.push((flag, value));
        } else if inv.program == Program::Quorumqctl && subcommand.is_none() {
            match bins.ctl_sub.get(arg) {
                Some(h) => {
                    help = h;
                    help_name = format!("quorumqctl {arg} --help");
                }
                None => errs.push(format!(
                    "{}: quorumqctl has no subcommand {arg:?} (`quorumqctl --help`: {:?})",
                    inv.origin, bins.quorumqctl.subcommands
                )),
            }
            subcommand = Some(arg.clone());
        } else {
            positionals.push(arg.clone());
        }
    }
    if inv.program == Program::Quorumqctl && subcommand.is_none() {
        errs.push(format!("{}: quorumqctl without a subcommand", inv.origin));
    }
    // Positional arguments against the usage line.
    let spec = &help.positionals;
    let required = spec.iter().filter(|p| p.required).count();
    let max = if spec.iter().any(|p| p.variadic) {
        usize::MAX
    } else {
        spec.len()
    };
    if positionals.len() < required || positionals.len() > max {
        errs.push(format!(
            "{}: {} positional argument(s) {positionals:?}, `{help_name}` takes {required}..{}",
            inv.origin,
            positionals.len(),
            if max == usize::MAX {
                "".to_string()
            } else {
                max.to_string()
            }
        ));
    } else if positionals.len() == spec.len() {
        // With every positional given, each lines up with its spec.
        for (v, p) in positionals.iter().zip(spec) {
            if !p.values.is_empty() && !v.contains('$') && !p.values.contains(v) {
                errs.push(format!(
                    "{}: {} {v:?}: not one of {:?} (`{help_name}`)",
                    inv.origin, p.name, p.values
                ));
            }
        }
    }
    flags
}

// ----------------------------------------------------------------------------
// Ports
// ----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Amqp,
    Cluster,
    Http,
}

impl Kind {
    fn listen_flag(self) -> &'static str {
        match self {
            Kind::Amqp => "--amqp-listen",
            Kind::Cluster => "--cluster-listen",
            Kind::Http => "--http-listen",
        }
    }
    fn by_port_name(name: &str) -> Option<Kind> {
        match name {
            "amqp" => Some(Kind::Amqp),
            "cluster" => Some(Kind::Cluster),
            "http" => Some(Kind::Http),
            _ => None,
        }
    }
}

/// The ports of one file (or one compose service): what its listener flags
/// give, and every other use.
#[derive(Default)]
struct Ports {
    listen: BTreeMap<Kind, BTreeSet<u16>>,
    /// (port, kind it must be, or any listener port; what uses it).
    uses: Vec<(u16, Option<Kind>, String)>,
    /// Uses naming other nodes (`--peers`, `--join`): in compose, checked
    /// against every service's listeners.
    remote: Vec<(u16, Option<Kind>, String)>,
}

impl Ports {
    fn use_port(&mut self, port: u16, kind: Option<Kind>, what: String) {
        self.uses.push((port, kind, what));
    }

    fn all_listen(&self) -> BTreeSet<u16> {
        self.listen.values().flatten().copied().collect()
    }

    /// Checks every use, the other nodes' too, against this listener set.
    fn check(&self, file: &str, errs: &mut Vec<String>) {
        self.check_uses(file, &self.uses, errs);
        self.check_uses(file, &self.remote, errs);
    }

    fn check_uses(&self, file: &str, uses: &[(u16, Option<Kind>, String)], errs: &mut Vec<String>) {
        let all = self.all_listen();
        for (port, kind, what) in uses {
            match kind {
                Some(k) => {
                    let ok = self.listen.get(k).is_some_and(|s| s.contains(port));
                    if !ok {
                        errs.push(format!(
                            "{file}: {what} uses port {port}, but {} gives {:?}",
                            k.listen_flag(),
                            self.listen.get(k).cloned().unwrap_or_default()
                        ));
                    }
                }
                None => {
                    if !all.contains(port) {
                        errs.push(format!(
                            "{file}: {what} uses port {port}, not a port given to \
                             --amqp-listen/--cluster-listen/--http-listen ({all:?})"
                        ));
                    }
                }
            }
        }
    }
}

/// The port of `HOST:PORT` (also `scheme://HOST:PORT/path`); it must be a
/// literal number.
fn port_of(addr: &str) -> Result<u16, String> {
    let hostport = match addr.split_once("://") {
        Some((_, rest)) => rest.split('/').next().unwrap_or(""),
        None => addr,
    };
    let (_, port) = hostport
        .rsplit_once(':')
        .ok_or_else(|| format!("{addr:?} has no :PORT"))?;
    port.parse::<u16>()
        .map_err(|_| format!("{addr:?}: port {port:?} is not a literal port number"))
}

/// The path of `scheme://host:port/path`.
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// Parsed `--peers` entries: (id text, address).
fn peers_of(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((id, addr)) => (id.trim().to_string(), addr.trim().to_string()),
            None => (String::new(), e.to_string()),
        })
        .collect()
}

/// Records the ports a quorumq/quorumqctl invocation listens on and uses.
fn ports_of_invocation(
    inv: &Invocation,
    flags: &[FlagValue],
    ports: &mut Ports,
    errs: &mut Vec<String>,
    // Host ports published onto container ports (compose), for --amqp-advertise.
    published: &BTreeMap<u16, u16>,
) {
    for (flag, value) in flags {
        let Some(value) = value else { continue };
        let port = |addr: &str, errs: &mut Vec<String>| -> Option<u16> {
            match port_of(addr) {
                Ok(p) => Some(p),
                Err(e) => {
                    errs.push(format!("{}: {flag}: {e}", inv.origin));
                    None
                }
            }
        };
        let what = format!("{} {flag} {value}", inv.origin);
        match (inv.program, flag.as_str()) {
            (Program::Quorumq, "--amqp-listen" | "--cluster-listen" | "--http-listen") => {
                let kind = match flag.as_str() {
                    "--amqp-listen" => Kind::Amqp,
                    "--cluster-listen" => Kind::Cluster,
                    _ => Kind::Http,
                };
                if let Some(p) = port(value, errs) {
                    ports.listen.entry(kind).or_default().insert(p);
                }
            }
            (Program::Quorumq, "--advertise") => {
                if let Some(p) = port(value, errs) {
                    ports.use_port(p, Some(Kind::Cluster), what);
                }
            }
            (Program::Quorumq, "--join") => {
                if let Some(p) = port(value, errs) {
                    ports.remote.push((p, Some(Kind::Cluster), what));
                }
            }
            (Program::Quorumq, "--amqp-advertise") => {
                if let Some(p) = port(value, errs) {
                    let (p, what) = match published.get(&p) {
                        Some(&inner) => (inner, format!("{what} (published onto {inner})")),
                        None => (p, what),
                    };
                    ports.use_port(p, Some(Kind::Amqp), what);
                }
            }
            (Program::Quorumq, "--peers") => {
                for (id, addr) in peers_of(value) {
                    if let Some(p) = port(&addr, errs) {
                        let what = format!("{} --peers entry {id}={addr}", inv.origin);
                        ports.remote.push((p, Some(Kind::Cluster), what));
                    }
                }
            }
            (Program::Quorumqctl, "--node") => {
                if let Some(p) = port(value, errs) {
                    ports.use_port(p, Some(Kind::Cluster), what);
                }
            }
            _ => {}
        }
    }
}

/// The value of a flag in checked flags (the last one given).
fn flag<'a>(flags: &'a [FlagValue], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .rev()
        .find(|(f, _)| f == name)
        .and_then(|(_, v)| v.as_deref())
}

/// `60`, `60s`, `1m`, `1min 30s`, `1m30s`, `2h` → seconds.
fn duration_secs(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut num = String::new();
    let mut unit = String::new();
    let mut flush = |num: &mut String, unit: &mut String| -> Option<()> {
        if num.is_empty() {
            return if unit.is_empty() { Some(()) } else { None };
        }
        let n: u64 = num.parse().ok()?;
        total += match unit.as_str() {
            "" | "s" | "sec" => n,
            "m" | "min" => n * 60,
            "h" => n * 3600,
            "ms" => n / 1000,
            _ => return None,
        };
        num.clear();
        unit.clear();
        Some(())
    };
    for ch in text.trim().chars() {
        if ch.is_ascii_digit() {
            if !unit.is_empty() {
                flush(&mut num, &mut unit)?;
            }
            num.push(ch);
        } else if ch.is_ascii_alphabetic() {
            unit.push(ch);
        } else if ch != ' ' {
            return None;
        }
    }
    flush(&mut num, &mut unit)?;
    Some(total)
}

/// A supervisor's wait between SIGTERM and SIGKILL must be [`STOP_GRACE_SECS`].
fn check_grace(file: &str, what: &str, secs: Option<u64>, errs: &mut Vec<String>) {
    if secs != Some(STOP_GRACE_SECS) {
        let got = secs.map_or("missing or unreadable".to_string(), |s| format!("{s} s"));
        errs.push(format!(
            "{file}: {what} is {got}, expected {STOP_GRACE_SECS} s (SIGTERM first drains the \
             node's queue leaderships, up to ~15 s)"
        ));
    }
}

// ----------------------------------------------------------------------------
// YAML helpers
// ----------------------------------------------------------------------------

fn load_yaml(file: &str, text: &str, errs: &mut Vec<String>) -> Vec<Yaml> {
    match YamlLoader::load_from_str(text) {
        Ok(docs) => docs.into_iter().filter(|d| !d.is_null()).collect(),
        Err(e) => {
            errs.push(format!("{file}: YAML does not parse: {e}"));
            Vec::new()
        }
    }
}

/// A scalar as text (ports and counts may be written as numbers).
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A list of scalars, or a string split into shell words.
fn words(y: &Yaml) -> Vec<String> {
    match y {
        Yaml::Array(a) => a.iter().filter_map(scalar).collect(),
        Yaml::String(s) => shell_commands(s).into_iter().next().unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn entries(y: &Yaml) -> Vec<(String, &Yaml)> {
    match y {
        Yaml::Hash(h) => h
            .iter()
            .filter_map(|(k, v)| scalar(k).map(|k| (k, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn labels(y: &Yaml) -> BTreeMap<String, String> {
    entries(y)
        .into_iter()
        .filter_map(|(k, v)| scalar(v).map(|v| (k, v)))
        .collect()
}

/// Errors unless every label of `selector` is on `pod` (and there is one).
fn check_selects(
    file: &str,
    what: &str,
    selector: &Yaml,
    pod: &BTreeMap<String, String>,
    errs: &mut Vec<String>,
) {
    let sel = labels(selector);
    if sel.is_empty() {
        errs.push(format!("{file}: {what} has no matchLabels/selector"));
    }
    for (k, v) in &sel {
        if pod.get(k) != Some(v) {
            errs.push(format!(
                "{file}: {what} selects {k}={v}, which the StatefulSet's pods do not have ({pod:?})"
            ));
        }
    }
}

// ----------------------------------------------------------------------------
// docker-compose.yml
// ----------------------------------------------------------------------------

fn check_compose(file: &str, text: &str, bins: &Bins) -> Vec<String> {
    let mut errs = Vec::new();
    let docs = load_yaml(file, text, &mut errs);
    let Some(doc) = docs.first() else {
        errs.push(format!("{file}: empty"));
        return errs;
    };
    // Listeners of every service, and the uses naming other nodes.
    let mut all_nodes = Ports::default();
    let services = entries(&doc["services"]);
    if services.is_empty() {
        errs.push(format!("{file}: no services"));
    }
    // (service, node id, advertise, peers value)
    let mut nodes: Vec<(String, String, Option<String>, Option<String>)> = Vec::new();
    for (name, svc) in &services {
        let at = format!("services.{name}");
        // Each service is its own container: its ports against its flags.
        let mut ports = Ports::default();
        // Host port → container port.
        let mut published = BTreeMap::new();
        if let Yaml::Array(list) = &svc["ports"] {
            for p in list {
                let (host, target) = match p {
                    Yaml::Hash(_) => (
                        scalar(&p["published"]),
                        scalar(&p["target"]).unwrap_or_default(),
                    ),
                    other => {
                        let s = scalar(other).unwrap_or_default();
                        let s = s.split('/').next().unwrap_or("").to_string();
                        let mut parts: Vec<&str> = s.split(':').collect();
                        let target = parts.pop().unwrap_or("").to_string();
                        (parts.pop().map(str::to_string), target)
                    }
                };
                match target.parse::<u16>() {
                    Ok(t) => {
                        ports.use_port(
                            t,
                            None,
                            format!("{at}.ports {}", scalar(p).unwrap_or(target.clone())),
                        );
                        if let Some(h) = host.and_then(|h| h.parse::<u16>().ok()) {
                            published.insert(h, t);
                        }
                    }
                    Err(_) => errs.push(format!(
                        "{file}: {at}.ports: {p:?}: no literal container port"
                    )),
                }
            }
        }
        for e in words(&svc["expose"]) {
            match e.split('/').next().unwrap_or("").parse::<u16>() {
                Ok(p) => ports.use_port(p, None, format!("{at}.expose {e}")),
                Err(_) => errs.push(format!("{file}: {at}.expose {e:?}: not a port")),
            }
        }
        // The image's ENTRYPOINT is quorumq unless the service sets one.
        let mut argv = match &svc["entrypoint"] {
            Yaml::BadValue | Yaml::Null => vec!["quorumq".to_string()],
            e => words(e),
        };
        argv.extend(words(&svc["command"]));
        let invs = invocations_in_argv(&argv, &format!("{file}: {at}.command"));
        if !invs.iter().any(|i| i.program == Program::Quorumq) {
            errs.push(format!("{file}: {at} runs no quorumq"));
        }
        for inv in &invs {
            let flags = check_invocation(inv, bins, &mut errs);
            ports_of_invocation(inv, &flags, &mut ports, &mut errs, &published);
            if inv.program == Program::Quorumq {
                nodes.push((
                    name.clone(),
                    flag(&flags, "--node-id").unwrap_or("").to_string(),
                    flag(&flags, "--advertise").map(str::to_string),
                    flag(&flags, "--peers").map(str::to_string),
                ));
                // The data directory must be a mounted volume.
                let data = flag(&flags, "--data-dir").unwrap_or("./data");
                let mounted = words(&svc["volumes"]).iter().any(|v| {
                    let parts: Vec<&str> = v.split(':').collect();
                    parts.len() >= 2 && parts[1].trim_end_matches('/') == data.trim_end_matches('/')
                });
                if !mounted {
                    errs.push(format!(
                        "{file}: {at}: --data-dir {data} is not a mounted volume"
                    ));
                }
            }
        }
        // Health check: the readiness endpoint.
        let hc = &svc["healthcheck"]["test"];
        let hc_words = words(hc);
        let hc_argv: Vec<String> = match hc_words.first().map(String::as_str) {
            Some("CMD") => hc_words[1..].to_vec(),
            Some("CMD-SHELL") => vec!["sh".into(), "-c".into(), hc_words[1..].join(" ")],
            _ if matches!(hc, Yaml::String(_)) => {
                vec!["sh".into(), "-c".into(), scalar(hc).unwrap_or_default()]
            }
            _ => Vec::new(),
        };
        if hc_argv.is_empty() {
            errs.push(format!("{file}: {at}: no healthcheck.test"));
        }
        let hc_origin = format!("{file}: {at}.healthcheck");
        let hc_cmds: Vec<Vec<String>> = if hc_argv.first().map(String::as_str) == Some("sh") {
            shell_commands(&hc_argv[2])
        } else if hc_argv.is_empty() {
            Vec::new()
        } else {
            vec![hc_argv.clone()]
        };
        let mut probes_ready = false;
        for cmd in &hc_cmds {
            for inv in invocations_in_argv(cmd, &hc_origin) {
                let flags = check_invocation(&inv, bins, &mut errs);
                ports_of_invocation(&inv, &flags, &mut ports, &mut errs, &published);
            }
            if program_of(&cmd[0]).is_some() {
                continue;
            }
            for w in cmd
                .iter()
                .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
            {
                match port_of(w) {
                    Ok(p) => ports.use_port(p, Some(Kind::Http), format!("{at}.healthcheck {w}")),
                    Err(e) => errs.push(format!("{hc_origin}: {e}")),
                }
                if url_path(w) == "/health/ready" {
                    probes_ready = true;
                } else {
                    errs.push(format!(
                        "{hc_origin}: {w}: path {:?}, expected /health/ready",
                        url_path(w)
                    ));
                }
            }
        }
        if !hc_argv.is_empty() && !probes_ready {
            errs.push(format!("{hc_origin}: does not GET /health/ready"));
        }
        let grace = scalar(&svc["stop_grace_period"]).and_then(|d| duration_secs(&d));
        check_grace(file, &format!("{at}.stop_grace_period"), grace, &mut errs);
        ports.check_uses(file, &ports.uses, &mut errs);
        for (kind, set) in ports.listen {
            all_nodes.listen.entry(kind).or_default().extend(set);
        }
        all_nodes.remote.extend(ports.remote);
    }
    all_nodes.check(file, &mut errs);
    check_static_peers(file, &nodes, &mut errs);
    errs
}

/// Every node given `--peers` has the same list, and it lists each node at
/// that node's `--advertise`.
fn check_static_peers(
    file: &str,
    nodes: &[(String, String, Option<String>, Option<String>)],
    errs: &mut Vec<String>,
) {
    let lists: BTreeSet<&str> = nodes.iter().filter_map(|n| n.3.as_deref()).collect();
    if lists.len() > 1 {
        errs.push(format!(
            "{file}: nodes are given different --peers: {lists:?}"
        ));
    }
    let mut ids = BTreeSet::new();
    for (name, id, advertise, peers) in nodes {
        if !ids.insert(id) {
            errs.push(format!("{file}: {name}: --node-id {id} given to two nodes"));
        }
        let Some(peers) = peers else { continue };
        match peers_of(peers).into_iter().find(|(pid, _)| pid == id) {
            None => errs.push(format!(
                "{file}: {name}: --peers does not list its own --node-id {id}"
            )),
            Some((_, addr)) => {
                if advertise.as_deref() != Some(addr.as_str()) {
                    errs.push(format!(
                        "{file}: {name}: --peers lists node {id} at {addr}, but its --advertise is {advertise:?}"
                    ));
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// k8s/quorumq.yaml
// ----------------------------------------------------------------------------

fn check_k8s(file: &str, text: &str, bins: &Bins) -> Vec<String> {
    let mut errs = Vec::new();
    let docs = load_yaml(file, text, &mut errs);
    let kind_of = |d: &Yaml| scalar(&d["kind"]).unwrap_or_default();
    let name_of = |d: &Yaml| scalar(&d["metadata"]["name"]).unwrap_or_default();
    let mut ports = Ports::default();
    // Named container ports → (number, kind by name).
    let mut named: BTreeMap<String, u16> = BTreeMap::new();

    let sets: Vec<&Yaml> = docs
        .iter()
        .filter(|d| kind_of(d) == "StatefulSet")
        .collect();
    if sets.len() != 1 {
        errs.push(format!(
            "{file}: expected one StatefulSet, found {}",
            sets.len()
        ));
        return errs;
    }
    let sts = sets[0];
    let sts_name = name_of(sts);
    let at = format!("StatefulSet {sts_name}");
    let spec = &sts["spec"];
    let pod = &spec["template"]["spec"];
    let pod_labels = labels(&spec["template"]["metadata"]["labels"]);
    let service_name = scalar(&spec["serviceName"]).unwrap_or_default();
    check_selects(
        file,
        &format!("{at} spec.selector"),
        &spec["selector"]["matchLabels"],
        &pod_labels,
        &mut errs,
    );

    if scalar(&spec["podManagementPolicy"]).as_deref() != Some("Parallel") {
        errs.push(format!(
            "{file}: {at}: podManagementPolicy must be Parallel (a node is ready only once a \
             quorum runs: OrderedReady never starts the second pod)"
        ));
    }
    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .map(|s| s as u64);
    check_grace(
        file,
        &format!("{at}: terminationGracePeriodSeconds"),
        grace,
        &mut errs,
    );

    let mut peers_values: Vec<String> = Vec::new();
    let mut data_dirs: Vec<String> = Vec::new();
    let containers: Vec<&Yaml> = match &pod["containers"] {
        Yaml::Array(a) => a.iter().collect(),
        _ => Vec::new(),
    };
    let mut runs_quorumq = false;
    for c in &containers {
        let cname = scalar(&c["name"]).unwrap_or_default();
        let cat = format!("{at} container {cname}");
        for p in c["ports"].as_vec().into_iter().flatten() {
            let Some(n) = p["containerPort"].as_i64() else {
                errs.push(format!("{file}: {cat}: a port without containerPort"));
                continue;
            };
            let pname = scalar(&p["name"]).unwrap_or_default();
            named.insert(pname.clone(), n as u16);
            ports.use_port(
                n as u16,
                Kind::by_port_name(&pname),
                format!("{cat} containerPort {pname} {n}"),
            );
        }
        // No `command`: the image's ENTRYPOINT, quorumq.
        let mut argv = match &c["command"] {
            Yaml::BadValue | Yaml::Null => vec!["quorumq".to_string()],
            cmd => words(cmd),
        };
        argv.extend(words(&c["args"]));
        let through_shell = argv.first().is_some_and(|a| program_of(a).is_none());
        for inv in invocations_in_argv(&argv, &format!("{file}: {cat}")) {
            let flags = check_invocation(&inv, bins, &mut errs);
            ports_of_invocation(&inv, &flags, &mut ports, &mut errs, &BTreeMap::new());
            if inv.program == Program::Quorumq {
                runs_quorumq = true;
                if through_shell && !inv.execed {
                    errs.push(format!(
                        "{}: quorumq is not started with `exec`: sh would get SIGTERM, and the node \
                         would be killed without draining",
                        inv.origin
                    ));
                }
                if let Some(p) = flag(&flags, "--peers") {
                    peers_values.push(p.to_string());
                }
                data_dirs.push(flag(&flags, "--data-dir").unwrap_or("./data").to_string());
            }
        }
        // Probes.
        for (probe, path) in [
            ("readinessProbe", "/health/ready"),
            ("livenessProbe", "/health/live"),
            ("startupProbe", "/health/live"),
        ] {
            let p = &c[probe];
            if p.is_badvalue() {
                if probe != "startupProbe" {
                    errs.push(format!(
                        "{file}: {cat}: no {probe} (expected httpGet {path})"
                    ));
                }
                continue;
            }
            let get = &p["httpGet"];
            if get.is_badvalue() {
                errs.push(format!(
                    "{file}: {cat}: {probe} is not an httpGet of {path}"
                ));
                continue;
            }
            let got = scalar(&get["path"]).unwrap_or_default();
            if got != path {
                errs.push(format!(
                    "{file}: {cat}: {probe} path {got:?}, expected {path}"
                ));
            }
            let port = match &get["port"] {
                Yaml::Integer(n) => Some(*n as u16),
                other => {
                    let name = scalar(other).unwrap_or_default();
                    let n = named.get(&name).copied();
                    if n.is_none() {
                        errs.push(format!(
                            "{file}: {cat}: {probe} port {name:?} is no containerPort name"
                        ));
                    }
                    n
                }
            };
            if let Some(n) = port {
                ports.use_port(n, Some(Kind::Http), format!("{cat} {probe} port {n}"));
            }
        }
    }
    if !runs_quorumq {
        errs.push(format!("{file}: {at}: no container runs quorumq"));
    }
    // Every listener port is declared as a containerPort.
    let declared: BTreeSet<u16> = named.values().copied().collect();
    for p in ports.all_listen() {
        if !declared.contains(&p) {
            errs.push(format!(
                "{file}: {at}: quorumq listens on {p}, which is no containerPort"
            ));
        }
    }

    // The data directory is a volumeClaimTemplate's mount.
    let claims: BTreeSet<String> = spec["volumeClaimTemplates"]
        .as_vec()
        .into_iter()
        .flatten()
        .filter_map(|t| scalar(&t["metadata"]["name"]))
        .collect();
    for dir in &data_dirs {
        let mounted = containers.iter().any(|c| {
            c["volumeMounts"].as_vec().into_iter().flatten().any(|m| {
                scalar(&m["mountPath"]).as_deref() == Some(dir.as_str())
                    && scalar(&m["name"]).is_some_and(|n| claims.contains(&n))
            })
        });
        if !mounted {
            errs.push(format!(
                "{file}: {at}: --data-dir {dir} is not a volumeClaimTemplate's mountPath"
            ));
        }
    }

    // Replicas against the static peer list.
    let replicas = spec["replicas"].as_i64().unwrap_or(1);
    if peers_values.is_empty() {
        errs.push(format!(
            "{file}: {at}: no --peers in the container's script"
        ));
    }
    for value in &peers_values {
        let peers = peers_of(value);
        if peers.len() as i64 != replicas {
            errs.push(format!(
                "{file}: {at}: replicas is {replicas}, but --peers lists {} nodes ({value})",
                peers.len()
            ));
        }
        for (k, (id, addr)) in peers.iter().enumerate() {
            let want_id = (k + 1).to_string();
            let want_host = format!("{sts_name}-{k}.{service_name}.");
            if *id != want_id || !addr.starts_with(&want_host) {
                errs.push(format!(
                    "{file}: {at}: --peers entry {} is {id}={addr}; expected {want_id}={want_host}… \
                     (pod ordinal + 1, the pod's name under serviceName)",
                    k + 1
                ));
            }
        }
    }

    // Services.
    let mut headless_ok = false;
    for svc in docs.iter().filter(|d| kind_of(d) == "Service") {
        let sname = name_of(svc);
        let sat = format!("Service {sname}");
        check_selects(file, &sat, &svc["spec"]["selector"], &pod_labels, &mut errs);
        for p in svc["spec"]["ports"].as_vec().into_iter().flatten() {
            match &p["targetPort"] {
                Yaml::Integer(n) => {
                    ports.use_port(*n as u16, None, format!("{sat} targetPort {n}"))
                }
                Yaml::String(name) => {
                    if !named.contains_key(name) {
                        errs.push(format!(
                            "{file}: {sat}: targetPort {name:?} is no containerPort name"
                        ));
                    }
                }
                _ => {
                    // Without targetPort, the Service port is the pod's port.
                    if let Some(n) = p["port"].as_i64() {
                        ports.use_port(n as u16, None, format!("{sat} port {n} (no targetPort)"));
                    }
                }
            }
        }
        if sname == service_name {
            headless_ok = scalar(&svc["spec"]["clusterIP"]).as_deref() == Some("None")
                && svc["spec"]["publishNotReadyAddresses"].as_bool() == Some(true);
            if !headless_ok {
                errs.push(format!(
                    "{file}: {sat} (the StatefulSet's serviceName) must be headless (clusterIP: None) \
                     with publishNotReadyAddresses: true, so peers resolve before they are ready"
                ));
            }
        }
    }
    if !headless_ok
        && !docs
            .iter()
            .any(|d| kind_of(d) == "Service" && name_of(d) == service_name)
    {
        errs.push(format!(
            "{file}: no Service named {service_name:?} (the StatefulSet's serviceName)"
        ));
    }

    // The disruption budget.
    let pdbs: Vec<&Yaml> = docs
        .iter()
        .filter(|d| kind_of(d) == "PodDisruptionBudget")
        .collect();
    if pdbs.is_empty() {
        errs.push(format!("{file}: no PodDisruptionBudget"));
    }
    for pdb in pdbs {
        let pat = format!("PodDisruptionBudget {}", name_of(pdb));
        check_selects(
            file,
            &pat,
            &pdb["spec"]["selector"]["matchLabels"],
            &pod_labels,
            &mut errs,
        );
        if pdb["spec"]["maxUnavailable"].as_i64() != Some(1) {
            errs.push(format!(
                "{file}: {pat}: maxUnavailable must be 1 (two of three keep the quorum)"
            ));
        }
    }

    ports.check(file, &mut errs);
    errs
}

// ----------------------------------------------------------------------------
// Dockerfile
// ----------------------------------------------------------------------------

/// The final stage's instructions: (INSTRUCTION, rest of line), continuation
/// lines joined, comments dropped.
fn dockerfile_final_stage(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            pending.push_str(body);
            pending.push(' ');
            continue;
        }
        pending.push_str(t);
        let full = std::mem::take(&mut pending);
        let (inst, rest) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
        let inst = inst.to_ascii_uppercase();
        if inst == "FROM" {
            out.clear();
        }
        out.push((inst, rest.trim().to_string()));
    }
    out
}

/// Exec form `["a","b"]`, or the shell form as `sh -c`.
fn dockerfile_argv(rest: &str) -> Vec<String> {
    serde_json::from_str::<Vec<String>>(rest)
        .unwrap_or_else(|_| vec!["/bin/sh".into(), "-c".into(), rest.to_string()])
}

fn check_dockerfile(file: &str, text: &str, bins: &Bins) -> Vec<String> {
    let mut errs = Vec::new();
    let stage = dockerfile_final_stage(text);
    let last = |inst: &str| {
        stage
            .iter()
            .rev()
            .find(|(i, _)| i == inst)
            .map(|(_, r)| r.clone())
    };
    let entry = last("ENTRYPOINT")
        .map(|r| dockerfile_argv(&r))
        .unwrap_or_default();
    if entry.first().and_then(|e| program_of(e)) != Some(Program::Quorumq) {
        errs.push(format!("{file}: ENTRYPOINT is {entry:?}, expected quorumq"));
    }
    let mut argv = entry;
    argv.extend(last("CMD").map(|r| dockerfile_argv(&r)).unwrap_or_default());
    let mut ports = Ports::default();
    let mut data_dir = None;
    for inv in invocations_in_argv(&argv, &format!("{file}: ENTRYPOINT + CMD")) {
        let flags = check_invocation(&inv, bins, &mut errs);
        ports_of_invocation(&inv, &flags, &mut ports, &mut errs, &BTreeMap::new());
        data_dir = Some(flag(&flags, "--data-dir").unwrap_or("./data").to_string());
    }
    let mut exposed = BTreeSet::new();
    for (_, rest) in stage.iter().filter(|(i, _)| i == "EXPOSE") {
        for p in rest.split_whitespace() {
            match p.split('/').next().unwrap_or("").parse::<u16>() {
                Ok(n) => {
                    exposed.insert(n);
                    ports.use_port(n, None, format!("EXPOSE {p}"));
                }
                Err(_) => errs.push(format!("{file}: EXPOSE {p}: not a port")),
            }
        }
    }
    for p in ports.all_listen() {
        if !exposed.contains(&p) {
            errs.push(format!(
                "{file}: CMD listens on {p}, which is not in EXPOSE"
            ));
        }
    }
    ports.check(file, &mut errs);
    if let Some(dir) = data_dir {
        let volumes: Vec<String> = stage
            .iter()
            .filter(|(i, _)| i == "VOLUME")
            .flat_map(|(_, r)| {
                serde_json::from_str::<Vec<String>>(r)
                    .unwrap_or_else(|_| r.split_whitespace().map(str::to_string).collect())
            })
            .collect();
        if !volumes.contains(&dir) {
            errs.push(format!(
                "{file}: CMD's --data-dir {dir} is not a VOLUME ({volumes:?})"
            ));
        }
    }
    errs
}

// ----------------------------------------------------------------------------
// systemd unit and TOML configs
// ----------------------------------------------------------------------------

/// `[Section]` → key → values (a key may repeat), continuation lines joined.
fn parse_unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if pending.is_empty() && (t.is_empty() || t.starts_with('#') || t.starts_with(';')) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            pending.push_str(body);
            pending.push(' ');
            continue;
        }
        pending.push_str(t);
        let full = std::mem::take(&mut pending);
        if full.starts_with('[') && full.ends_with(']') {
            section = full[1..full.len() - 1].to_string();
        } else if let Some((k, v)) = full.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .entry(k.trim().to_string())
                .or_default()
                .push(v.trim().to_string());
        }
    }
    out
}

/// Checks the unit; returns the `--config` path template of its ExecStart
/// and its StateDirectory.
fn check_unit(
    file: &str,
    text: &str,
    bins: &Bins,
    errs: &mut Vec<String>,
) -> (Option<String>, Option<String>) {
    let unit = parse_unit(text);
    let service = unit.get("Service").cloned().unwrap_or_default();
    let one = |key: &str| service.get(key).and_then(|v| v.last()).cloned();
    let mut config = None;
    let execs = service.get("ExecStart").cloned().unwrap_or_default();
    if execs.is_empty() {
        errs.push(format!("{file}: no ExecStart"));
    }
    for exec in &execs {
        let mut argv = shell_commands(exec).into_iter().next().unwrap_or_default();
        if let Some(first) = argv.first_mut() {
            *first = first
                .trim_start_matches(['-', '@', ':', '+', '!'])
                .to_string();
        }
        let invs = invocations_in_argv(&argv, &format!("{file}: ExecStart"));
        if !invs.iter().any(|i| i.program == Program::Quorumq) {
            errs.push(format!("{file}: ExecStart runs no quorumq: {exec}"));
        }
        for inv in &invs {
            let flags = check_invocation(inv, bins, errs);
            config = flag(&flags, "--config").map(str::to_string).or(config);
        }
    }
    let grace = one("TimeoutStopSec").as_deref().and_then(duration_secs);
    check_grace(file, "TimeoutStopSec", grace, errs);
    if let Some(sig) = one("KillSignal") {
        if sig != "SIGTERM" && sig != "TERM" {
            errs.push(format!(
                "{file}: KillSignal={sig}: only SIGTERM drains the node"
            ));
        }
    }
    (config, one("StateDirectory"))
}

/// Loads one TOML with the broker's own loader (unknown keys fail).
fn load_config(path: &Path, errs: &mut Vec<String>) -> Option<Config> {
    match Config::load(path) {
        Ok(c) => Some(c),
        Err(e) => {
            errs.push(format!(
                "{}: does not load as a quorumq config: {e}",
                rel(path)
            ));
            None
        }
    }
}

/// The systemd node TOMLs: each file named by the unit's `--config`
/// template loads, has the id of its name, the unit's data directory, a
/// cluster port its peers agree with, and the same `peers` as the others.
fn check_systemd(dir: &Path, unit_name: &str, unit_text: &str, bins: &Bins) -> Vec<String> {
    let mut errs = Vec::new();
    let unit_file = format!("deploy/systemd/{unit_name}");
    let (config, state_dir) = check_unit(&unit_file, unit_text, bins, &mut errs);
    let Some(config) = config else {
        errs.push(format!("{unit_file}: ExecStart gives no --config"));
        return errs;
    };
    // /etc/quorumq/node%i.toml → files node<N>.toml here.
    let template = config.rsplit('/').next().unwrap_or("").to_string();
    let Some((prefix, suffix)) = template.split_once("%i") else {
        errs.push(format!(
            "{unit_file}: --config {config} has no %i (instance = node id)"
        ));
        return errs;
    };
    let mut nodes: Vec<(u64, Config, String)> = Vec::new();
    for entry in std::fs::read_dir(dir).expect("deploy/systemd") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".toml") {
            continue;
        }
        let file = format!("deploy/systemd/{name}");
        let Some(instance) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(suffix))
        else {
            errs.push(format!(
                "{file}: not named as {unit_file}'s --config {config} expects"
            ));
            continue;
        };
        let Some(c) = load_config(&path, &mut errs) else {
            continue;
        };
        match instance.parse::<u64>() {
            Ok(id) if id == c.node_id => nodes.push((id, c, file)),
            _ => errs.push(format!(
                "{file}: node_id {} but run as instance {instance:?} of {unit_name}",
                c.node_id
            )),
        }
    }
    if nodes.is_empty() {
        errs.push(format!(
            "deploy/systemd: no {prefix}N{suffix} for {unit_file}"
        ));
    }
    let peer_lists: BTreeSet<Vec<String>> = nodes.iter().map(|(_, c, _)| c.peers.clone()).collect();
    if peer_lists.len() > 1 {
        errs.push(format!(
            "deploy/systemd: the node TOMLs have different peers: {peer_lists:?}"
        ));
    }
    for (id, c, file) in &nodes {
        if let Some(sd) = &state_dir {
            let want = Path::new("/var/lib").join(sd);
            if c.data_dir != want {
                errs.push(format!(
                    "{file}: data_dir {} is not the unit's StateDirectory {}",
                    c.data_dir.display(),
                    want.display()
                ));
            }
        }
        let mut ports = Ports::default();
        for (kind, addr) in [
            (Kind::Amqp, Some(&c.amqp_listen)),
            (Kind::Cluster, Some(&c.cluster_listen)),
            (Kind::Http, c.http_listen.as_ref()),
        ] {
            if let Some(addr) = addr {
                match port_of(addr) {
                    Ok(p) => {
                        ports.listen.entry(kind).or_default().insert(p);
                    }
                    Err(e) => errs.push(format!("{file}: {e}")),
                }
            }
        }
        if c.http_listen.is_none() {
            errs.push(format!("{file}: no http_listen (health endpoints)"));
        }
        let advertised = c.advertised();
        for (what, addr, kind) in [
            ("advertise", advertised.clone(), Kind::Cluster),
            ("amqp_advertise", c.amqp_advertised(), Kind::Amqp),
        ] {
            match port_of(&addr) {
                Ok(p) => ports.use_port(p, Some(kind), format!("{what} {addr}")),
                Err(e) => errs.push(format!("{file}: {what}: {e}")),
            }
        }
        match c.parsed_peers() {
            Ok(peers) => match peers.iter().find(|p| p.id == *id) {
                Some(me) if me.addr == advertised => {}
                Some(me) => errs.push(format!(
                    "{file}: peers lists node {id} at {}, but it advertises {advertised}",
                    me.addr
                )),
                None if peers.is_empty() && c.join.is_some() => {}
                None => errs.push(format!("{file}: peers does not list node {id} itself")),
            },
            Err(e) => errs.push(format!("{file}: {e}")),
        }
        ports.check(file, &mut errs);
    }
    errs
}

// ----------------------------------------------------------------------------
// deploy/README.md
// ----------------------------------------------------------------------------

/// The `quorumq`/`quorumqctl` commands in the README's sh blocks: a command
/// starting with the binary, or running it through `kubectl exec … --` or
/// `docker compose exec SERVICE`.
fn check_readme(file: &str, text: &str, bins: &Bins) -> Vec<String> {
    let mut errs = Vec::new();
    let mut in_block = false;
    let mut block = String::new();
    let mut blocks = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            if in_block {
                blocks.push(std::mem::take(&mut block));
                in_block = false;
            } else if ["sh", "bash", "shell", "console"].contains(&info.trim()) {
                in_block = true;
            }
            continue;
        }
        if in_block {
            block.push_str(line);
            block.push('\n');
        }
    }
    let mut found = 0;
    for (b, script) in blocks.iter().enumerate() {
        for cmd in shell_commands(script) {
            for i in 0..cmd.len() {
                let Some(program) = program_of(&cmd[i]) else {
                    continue;
                };
                let started = i == 0
                    || cmd[i - 1] == "--"
                    || cmd[i - 1] == "exec"
                    || (i >= 2 && cmd[i - 2] == "exec");
                if !started {
                    continue;
                }
                found += 1;
                let inv = Invocation {
                    program,
                    args: cmd[i + 1..].to_vec(),
                    execed: true,
                    origin: format!("{file}: sh block {}: `{}`", b + 1, cmd.join(" ")),
                };
                check_invocation(&inv, bins, &mut errs);
                break;
            }
        }
    }
    if found == 0 {
        errs.push(format!(
            "{file}: no quorumq/quorumqctl command in its sh blocks"
        ));
    }
    errs
}

// ----------------------------------------------------------------------------
// The real files
// ----------------------------------------------------------------------------

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn rel(path: &Path) -> String {
    let s = path.to_string_lossy();
    match s.find("/deploy/") {
        Some(i) => s[i + 1..].to_string(),
        None => s.to_string(),
    }
}

fn read(name: &str) -> String {
    let path = deploy().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn assert_clean(errs: Vec<String>) {
    assert!(
        errs.is_empty(),
        "{} problem(s):\n  {}",
        errs.len(),
        errs.join("\n  ")
    );
}

const UNIT: &str = "quorumq@.service";

#[test]
fn compose_file_matches_the_binary() {
    assert_clean(check_compose(
        "deploy/docker-compose.yml",
        &read("docker-compose.yml"),
        bins(),
    ));
}

#[test]
fn kubernetes_manifest_matches_the_binary() {
    assert_clean(check_k8s(
        "deploy/k8s/quorumq.yaml",
        &read("k8s/quorumq.yaml"),
        bins(),
    ));
}

#[test]
fn dockerfile_matches_the_binary() {
    assert_clean(check_dockerfile(
        "deploy/Dockerfile",
        &read("Dockerfile"),
        bins(),
    ));
}

#[test]
fn systemd_unit_and_node_configs_match_the_binary() {
    let text = read(&format!("systemd/{UNIT}"));
    assert_clean(check_systemd(
        &deploy().join("systemd"),
        UNIT,
        &text,
        bins(),
    ));
}

#[test]
fn every_deploy_toml_loads_as_a_config() {
    let mut errs = Vec::new();
    let mut paths = vec![deploy().join("quorumq.toml")];
    for dir in [deploy(), deploy().join("systemd"), deploy().join("k8s")] {
        for e in std::fs::read_dir(&dir).expect("deploy dir") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "toml") && !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    assert!(
        paths.len() >= 4,
        "deploy/quorumq.toml and deploy/systemd/node*.toml: {paths:?}"
    );
    for p in &paths {
        load_config(p, &mut errs);
    }
    assert_clean(errs);
}

#[test]
fn readme_commands_match_the_binaries() {
    assert_clean(check_readme("deploy/README.md", &read("README.md"), bins()));
}

// ----------------------------------------------------------------------------
// Drifted copies: each check reports the edit
// ----------------------------------------------------------------------------

/// `text` with the first `from` replaced by `to`; fails when `from` is not
/// there, so these tests follow the files.
fn drift(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the file no longer contains {from:?}: update this test"
    );
    text.replacen(from, to, 1)
}

/// Asserts some problem mentions every one of `needles`.
fn assert_reported(errs: &[String], needles: &[&str]) {
    assert!(
        errs.iter().any(|e| needles.iter().all(|n| e.contains(n))),
        "expected a problem mentioning {needles:?}, got:\n  {}",
        errs.join("\n  ")
    );
}

#[test]
fn drifted_compose_is_reported() {
    let text = read("docker-compose.yml");
    let check = |from: &str, to: &str| check_compose("compose", &drift(&text, from, to), bins());
    // A misspelt flag.
    let errs = check("--amqp-listen=", "--amqp-listn=");
    assert_reported(&errs, &["compose", "--amqp-listn", "quorumq --help"]);
    // One node's HTTP listener moves; its health check still probes 15680.
    let errs = check("--http-listen=0.0.0.0:15680", "--http-listen=0.0.0.0:15681");
    assert_reported(
        &errs,
        &[
            "quorumq1.healthcheck",
            "15680",
            "--http-listen gives {15681}",
        ],
    );
    // A published port onto a container port nothing listens on.
    let errs = check("\"5673:5672\"", "\"5673:5673\"");
    assert_reported(&errs, &["quorumq2.ports", "5673"]);
    // A peer at a port no --cluster-listen gives.
    let errs = check("3=quorumq3:5680", "3=quorumq3:5690");
    assert_reported(&errs, &["--peers entry 3=quorumq3:5690", "5690"]);
    assert_reported(&errs, &["different --peers"]);
    // The health check on the liveness endpoint; a short grace period.
    let errs = check("15680/health/ready", "15680/health/live");
    assert_reported(
        &errs,
        &["healthcheck", "/health/live", "expected /health/ready"],
    );
    let errs = check("stop_grace_period: 60s", "stop_grace_period: 10s");
    assert_reported(&errs, &["stop_grace_period is 10 s", "expected 60 s"]);
    // The data volume mounted elsewhere.
    let errs = check("quorumq1-data:/var/lib/quorumq", "quorumq1-data:/data");
    assert_reported(&errs, &["quorumq1", "--data-dir /var/lib/quorumq"]);
}

#[test]
fn drifted_kubernetes_manifest_is_reported() {
    let text = read("k8s/quorumq.yaml");
    let check = |from: &str, to: &str| check_k8s("k8s", &drift(&text, from, to), bins());
    let errs = check("replicas: 3", "replicas: 5");
    assert_reported(&errs, &["replicas is 5", "lists 3 nodes"]);
    let errs = check("path: /health/ready", "path: /healthz");
    assert_reported(&errs, &["readinessProbe", "/healthz", "/health/ready"]);
    let errs = check("--http-listen 0.0.0.0:15680", "--http-listen 0.0.0.0:8080");
    assert_reported(&errs, &["readinessProbe port 15680", "--http-listen"]);
    assert_reported(&errs, &["listens on 8080", "no containerPort"]);
    let errs = check(
        "--cluster-listen 0.0.0.0:5680",
        "--cluster-listn 0.0.0.0:5680",
    );
    assert_reported(&errs, &["--cluster-listn", "quorumq --help"]);
    // The --join of the replacement branch.
    let errs = check("${DOMAIN}:5680\"\n", "${DOMAIN}:5681\"\n");
    assert_reported(&errs, &["--join", "5681"]);
    let errs = check("exec quorumq", "quorumq");
    assert_reported(&errs, &["exec", "without draining"]);
    let errs = check(
        "podManagementPolicy: Parallel",
        "podManagementPolicy: OrderedReady",
    );
    assert_reported(&errs, &["podManagementPolicy must be Parallel"]);
    let errs = check(
        "terminationGracePeriodSeconds: 60",
        "terminationGracePeriodSeconds: 30",
    );
    assert_reported(&errs, &["terminationGracePeriodSeconds is 30 s"]);
    let errs = check(
        "publishNotReadyAddresses: true",
        "publishNotReadyAddresses: false",
    );
    assert_reported(&errs, &["publishNotReadyAddresses"]);
    let errs = check("2=quorumq-1.", "2=quorumq-5.");
    assert_reported(&errs, &["--peers entry 2", "quorumq-1."]);
    let errs = check("DOMAIN=\"quorumq-headless.", "DOMAIN=\"quorumq-peers.");
    assert_reported(&errs, &["--peers entry 1", "quorumq-0.quorumq-headless."]);
    // The PDB (the last document) selecting a label the pods lack.
    let at = text.rfind("kind: PodDisruptionBudget").expect("a PDB");
    let (head, pdb) = text.split_at(at);
    let pdb = drift(pdb, "app.kubernetes.io/name: quorumq", "app: quorumq");
    let errs = check_k8s("k8s", &format!("{head}{pdb}"), bins());
    assert_reported(&errs, &["PodDisruptionBudget", "app=quorumq"]);
}

#[test]
fn drifted_dockerfile_is_reported() {
    let text = read("Dockerfile");
    let check =
        |from: &str, to: &str| check_dockerfile("Dockerfile", &drift(&text, from, to), bins());
    let errs = check("EXPOSE 5672 5680 15680", "EXPOSE 5672 5680 15690");
    assert_reported(&errs, &["EXPOSE 15690"]);
    assert_reported(&errs, &["listens on 15680", "not in EXPOSE"]);
    let errs = check("\"--data-dir\"", "\"--datadir\"");
    assert_reported(&errs, &["--datadir", "quorumq --help"]);
    let errs = check("VOLUME [\"/var/lib/quorumq\"]", "VOLUME [\"/data\"]");
    assert_reported(&errs, &["--data-dir /var/lib/quorumq", "not a VOLUME"]);
}

#[test]
fn drifted_systemd_unit_and_configs_are_reported() {
    let unit = read(&format!("systemd/{UNIT}"));
    let dir = deploy().join("systemd");
    let check = |from: &str, to: &str| check_systemd(&dir, UNIT, &drift(&unit, from, to), bins());
    let errs = check("--config", "--conf");
    assert_reported(&errs, &["ExecStart", "--conf", "quorumq --help"]);
    let errs = check("TimeoutStopSec=60", "TimeoutStopSec=20s");
    assert_reported(&errs, &["TimeoutStopSec is 20 s"]);
    let errs = check("node%i.toml", "quorumq-%i.toml");
    assert_reported(&errs, &["node1.toml", "not named"]);

    // Edited copies of the node TOMLs: (file, from, to).
    let tmp = tempfile::tempdir().expect("tempdir");
    let check_copies = |file: &str, from: &str, to: &str| {
        for n in 1..=3 {
            let name = format!("node{n}.toml");
            let mut t = std::fs::read_to_string(dir.join(&name)).expect("node TOML");
            if name == file {
                t = drift(&t, from, to);
            }
            std::fs::write(tmp.path().join(&name), t).expect("write copy");
        }
        check_systemd(tmp.path(), UNIT, &unit, bins())
    };
    assert_clean(check_copies("", "", ""));
    let errs = check_copies("node2.toml", "http_listen", "http_listn");
    assert_reported(&errs, &["node2.toml", "http_listn"]);
    let errs = check_copies("node3.toml", "node_id = 3", "node_id = 4");
    assert_reported(&errs, &["node3.toml", "node_id 4"]);
    let errs = check_copies("node1.toml", "\"3=10.0.0.3:5680\"", "\"3=10.0.0.3:5690\"");
    assert_reported(&errs, &["different peers"]);
    let errs = check_copies("node1.toml", "\"10.0.0.1:5680\"\n", "\"10.0.0.1:5681\"\n");
    assert_reported(&errs, &["node1.toml", "5681"]);
    let errs = check_copies("node2.toml", "\"/var/lib/quorumq\"", "\"/srv/quorumq\"");
    assert_reported(&errs, &["node2.toml", "StateDirectory"]);
}

#[test]
fn drifted_readme_commands_are_reported() {
    let check = |body: &str| check_readme("R", &format!("text\n\n```sh\n{body}\n```\n"), bins());
    let errs = check("quorumqctl --nod http://h:5680 cluster_status");
    assert_reported(&errs, &["--nod", "quorumqctl --help"]);
    let errs = check("kubectl exec quorumq-0 -- quorumqctl cluster_stat");
    assert_reported(&errs, &["no subcommand", "cluster_stat"]);
    let errs = check("docker compose exec quorumq1 quorumqctl grow 4 some");
    assert_reported(&errs, &["\"some\"", "not one of"]);
    let errs = check("quorumqctl forget_cluster_node");
    assert_reported(&errs, &["forget_cluster_node", "takes 1..1"]);
    let errs = check("quorumqctl cluster_status --formatter yaml");
    assert_reported(&errs, &["--formatter yaml", "not one of"]);
    let errs = check("quorumq --node-id 1 \\\n  --peer 1=a:5680");
    assert_reported(&errs, &["--peer ", "quorumq --help"]);
    // Not invocations: an image tag, an install line.
    assert_clean(check(
        "docker build -f deploy/Dockerfile -t quorumq .\n\
         install -m 0755 target/release/quorumq target/release/quorumqctl /usr/local/bin/\n\
         quorumqctl status",
    ));
}

#[test]
fn shell_words_keep_substitutions_and_quotes_whole() {
    let cmds = shell_commands(
        "set -eu # comment\nX=\"$(cat \"/a b\")\"; exec quorumq \\\n  --n \"$((A + 1))\" '--q x' \"${P}.d:1\" \"$@\"\nif [ -s f ]; then set -- --join h:1; fi",
    );
    assert_eq!(cmds[0], vec!["set", "-eu"]);
    assert_eq!(cmds[1], vec!["X=$(cat \"/a b\")"]);
    assert_eq!(
        cmds[2],
        vec![
            "exec",
            "quorumq",
            "--n",
            "$((A + 1))",
            "--q x",
            "${P}.d:1",
            "$@"
        ]
    );
    assert_eq!(cmds[3], vec!["[", "-s", "f", "]"]);
    assert_eq!(cmds[4], vec!["set", "--", "--join", "h:1"]);
    let invs = invocations_in_script("set -- --join h:1\nexec quorumq --a \"$@\"", "x");
    assert_eq!(invs[0].args, vec!["--a", "--join", "h:1"]);
    assert!(invs[0].execed);
    assert_eq!(duration_secs("1m30s"), Some(90));
    assert_eq!(duration_secs("1min 30s"), Some(90));
    assert_eq!(duration_secs("60"), Some(60));
    assert_eq!(duration_secs("abc"), None);
    assert_eq!(port_of("http://127.0.0.1:15680/health/ready"), Ok(15680));
    assert!(port_of("${HOST}:$PORT").is_err());
}
