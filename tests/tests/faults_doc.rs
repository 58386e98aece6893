//! docs/FAULTS.md holds the fault matrix as the tests run it: the tables between its markers
//! are rendered from the expected outcomes in `fault_matrix` (the same data the
//! `faults_*.rs` tests check every case against), and each family's test file runs every
//! operation. `VIREO_WRITE_FAULTS_DOC=1 cargo test -p vireo-tests --test faults_doc`
//! rewrites the tables after a change of the matrix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::path::PathBuf;

use fault_matrix::*;

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/FAULTS.md")
}

/// The text between the markers, markers included, and where it is.
fn generated(doc: &str) -> Option<(usize, usize)> {
    let begin = doc.find(DOC_BEGIN)?;
    let end = doc[begin..].find(DOC_END)? + begin + DOC_END.len() + 1;
    Some((begin, end.min(doc.len())))
}

#[test]
fn the_document_holds_the_matrix() {
    let path = doc_path();
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = generated(&doc).expect("docs/FAULTS.md lacks the matrix markers");
    let want = render_matrix();
    if doc[begin..end] != want && std::env::var_os("VIREO_WRITE_FAULTS_DOC").is_some() {
        let new = format!("{}{}{}", &doc[..begin], want, &doc[end..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    assert!(
        doc[begin..end] == want,
        "docs/FAULTS.md does not hold the matrix the tests run; regenerate it with \
         VIREO_WRITE_FAULTS_DOC=1 cargo test -p vireo-tests --test faults_doc"
    );
}

#[test]
fn the_document_explains_every_family() {
    let doc = std::fs::read_to_string(doc_path()).unwrap();
    for section in [
        "## Network service",
        "## Plugging",
        "## Events",
        "## Real failures: libvirtd and the agent",
        "## Bugs found",
    ] {
        assert!(
            doc.lines().any(|l| l == section),
            "docs/FAULTS.md lacks the section {section:?}"
        );
    }
}

/// Each family's test file has one test per operation, running that operation's row: the
/// files run their column through `row_tests!`, which lists every operation.
#[test]
fn every_family_runs_every_operation() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    let support = std::fs::read_to_string(dir.join("fault_matrix/mod.rs")).unwrap();
    let rows = &support[support.find("macro_rules! row_tests").unwrap()..];
    for op in Op::ALL {
        let line = format!("{} => Op::{op:?},", op.test_name());
        assert!(
            rows.lines().any(|l| l.trim() == line),
            "row_tests! does not run {op} (no line {line:?})"
        );
    }
    for (file, matrix) in [
        ("faults_network.rs", "network_matrix"),
        ("faults_plug.rs", "plug_matrix"),
        ("faults_events.rs", "event_matrix"),
    ] {
        let src = std::fs::read_to_string(dir.join(file)).unwrap();
        let call = format!("fault_matrix::row_tests!({matrix});");
        assert!(
            src.lines().any(|l| l == call),
            "{file} does not run its column (no line {call:?})"
        );
    }
}

/// The rendering keeps what a reader needs: every operation has a row, every case is
/// counted once.
#[test]
fn the_matrix_counts_every_case() {
    let m = render_matrix();
    for op in Op::ALL {
        assert!(
            m.contains(&format!("| {} |", op.label())),
            "{op} has no row"
        );
    }
    let total: usize = Op::ALL
        .iter()
        .map(|op| net_cases(*op) + plug_cases(*op) + event_cases(*op))
        .sum();
    assert!(
        m.contains("| **all** |") && m.contains(&format!("| {total} |")),
        "the total of {total} cases is not in the table"
    );
}
