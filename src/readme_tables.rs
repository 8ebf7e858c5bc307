//! README.md's flags and metrics tables against the code they describe, so neither can drift:
//! every flag of `lazyquota run` (its value name or values, its default, its environment
//! variable) and every metric family (its kind and labels) is in its table, and nothing else.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory as _;

use crate::cli::Cli;

const README: &str = include_str!("../README.md");

/// The rows of the first table under `## {heading}`, split into trimmed cells.
fn table(heading: &str) -> Vec<Vec<String>> {
    let start = README
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("README.md has no section {heading:?}"));
    let section = &README[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|row| {
            let row = row.replace("\\|", "\u{1}");
            row.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().replace('\u{1}', "|"))
                .collect()
        })
        .collect()
}

/// The code spans of a cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Each flag the README's table names, with the code span that shows it (`--mode lazy|eager`),
/// its row's default cell and its first cell.
fn readme_flags() -> BTreeMap<String, (String, String, String)> {
    let mut flags = BTreeMap::new();
    for row in table("Flags") {
        let (first, default) = (&row[0], &row[1]);
        for span in code_spans(first).into_iter().filter(|s| s.starts_with("--")) {
            let name = span.split_whitespace().next().expect("a flag").to_string();
            let previous = flags.insert(name.clone(), (span.to_string(), default.clone(), first.clone()));
            assert!(previous.is_none(), "README.md's flags table lists {name} twice");
        }
    }
    flags
}

#[test]
fn the_readme_flags_table_is_run_s_flags_with_their_values_defaults_and_environment() {
    let mut command = Cli::command();
    command.build();
    let run = command.find_subcommand("run").expect("a run subcommand");
    let mut readme = readme_flags();
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let flag = format!("--{long}");
        let (shown, default, first) = readme
            .remove(&flag)
            .unwrap_or_else(|| panic!("README.md's flags table lacks {flag}"));
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values()) && !arg.is_positional();
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .map(|v| v.get_name().to_string())
            .collect();
        let flag_only = matches!(
            arg.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::Count
        );
        let expected = if flag_only || !takes_value {
            flag.clone()
        } else if possible.is_empty() {
            let name = arg
                .get_value_names()
                .and_then(|n| n.first())
                .map_or("VALUE".to_string(), ToString::to_string);
            format!("{flag} {name}")
        } else {
            format!("{flag} {}", possible.join("|"))
        };
        assert_eq!(
            shown, expected,
            "README.md shows {flag} as `{shown}`; `lazyquota run --help` takes `{expected}`"
        );
        if flag_only {
            assert_eq!(
                default, "off",
                "{flag} is a switch: its README default reads `off`"
            );
        } else {
            for value in arg.get_default_values() {
                let value = value.to_string_lossy();
                if !value.is_empty() {
                    assert!(
                        code_spans(&default).contains(&value.as_ref()),
                        "README.md's default for {flag} is {default:?}; the flag's default is `{value}`"
                    );
                }
            }
        }
        match arg.get_env() {
            Some(env) => {
                let env = env.to_string_lossy();
                assert!(
                    first.contains(&format!("(env `{env}`)")),
                    "README.md's row of {flag} does not name its environment variable {env}"
                );
            }
            None => assert!(
                !first.contains("(env `"),
                "README.md names an environment variable for {flag}, which reads none"
            ),
        }
    }
    assert!(
        readme.is_empty(),
        "README.md's flags table lists flags `lazyquota run` does not take: {:?}",
        readme.keys()
    );
}

/// Expands `lazyquota_jemalloc_{allocated,active}_bytes` into its names.
fn expand(name: &str) -> Vec<String> {
    match (name.find('{'), name.find('}')) {
        (Some(open), Some(close)) => name[open + 1..close]
            .split(',')
            .map(|part| format!("{}{part}{}", &name[..open], &name[close + 1..]))
            .collect(),
        _ => vec![name.to_string()],
    }
}

#[test]
fn the_readme_metrics_table_is_the_registry_with_each_family_s_kind_and_labels() {
    let metrics = lazyquota_kube::operate::metrics::Metrics::new();
    let (_tx, controllers) = tokio::sync::watch::channel(Vec::new());
    let (_tx2, standby) = tokio::sync::watch::channel(false);
    let _admin = crate::server::Admin::new(metrics.clone(), controllers, standby);
    let registered: BTreeMap<String, (String, Vec<String>)> = metrics
        .registry()
        .families()
        .into_iter()
        .map(|f| (f.name, (f.kind.to_string(), f.labels)))
        .collect();
    let mut documented = BTreeSet::new();
    for row in table("Metrics") {
        let (names, kind, labels) = (&row[0], &row[1], &row[2]);
        let labels: Vec<String> = code_spans(labels).into_iter().map(String::from).collect();
        for name in code_spans(names).into_iter().flat_map(expand) {
            let (registered_kind, registered_labels) = registered
                .get(&name)
                .unwrap_or_else(|| panic!("README.md's metrics table lists {name}, which is not registered"));
            assert!(
                kind.starts_with(registered_kind.as_str()),
                "README.md calls {name} a {kind:?}; it is registered as a {registered_kind}"
            );
            assert_eq!(&labels, registered_labels, "README.md's labels of {name}");
            assert!(
                documented.insert(name.clone()),
                "README.md's metrics table lists {name} twice"
            );
        }
    }
    let missing: Vec<&String> = registered.keys().filter(|n| !documented.contains(*n)).collect();
    assert!(missing.is_empty(), "README.md's metrics table lacks {missing:?}");
}
