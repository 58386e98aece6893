//! The test binary's harness (`harness = false`): scenarios run one at a time in the order
//! given (the Nova events port is the machine's, the firewall driver is switched once for
//! the scenarios that need it), a panicking or failing scenario is reported and the next
//! one runs, and the binary exits non-zero when any failed.
//!
//! Arguments: words are name filters (a scenario runs when its name contains one of them;
//! none = all), `--list` prints the names; other `--flags` cargo passes are ignored.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::HarnessError;

/// How one scenario ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Passed,
    /// It failed (the message).
    Failed(String),
}

/// The runner.
#[derive(Debug, Default)]
pub struct Runner {
    filters: Vec<String>,
    list: bool,
    results: Vec<(String, Outcome, Duration)>,
}

impl Runner {
    /// From the command line.
    pub fn from_args() -> Runner {
        let mut r = Runner::default();
        for a in std::env::args().skip(1) {
            if a == "--list" {
                r.list = true;
            } else if !a.starts_with('-') {
                r.filters.push(a);
            }
        }
        r
    }

    /// Only listing names.
    pub fn listing(&self) -> bool {
        self.list
    }

    /// Is `name` selected?
    pub fn selected(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }

    /// Is any of `names` selected?
    pub fn any_selected(&self, names: &[&str]) -> bool {
        names.iter().any(|n| self.selected(n))
    }

    /// Run `f` as scenario `name` when selected (or print its name with `--list`).
    pub async fn run<F, Fut>(&mut self, name: &str, f: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), HarnessError>>,
    {
        if !self.selected(name) {
            return;
        }
        if self.list {
            println!("{name}: test");
            return;
        }
        println!("\n=== {name}");
        let start = Instant::now();
        let outcome = match AssertUnwindSafe(f()).catch_unwind().await {
            Ok(Ok(())) => Outcome::Passed,
            Ok(Err(e)) => Outcome::Failed(crate::chain(&e)),
            Err(p) => Outcome::Failed(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".to_owned()),
            ),
        };
        let took = start.elapsed();
        match &outcome {
            Outcome::Passed => println!("--- {name}: ok ({:.1} s)", took.as_secs_f64()),
            Outcome::Failed(m) => println!("--- {name}: FAILED ({:.1} s)\n{m}", took.as_secs_f64()),
        }
        self.results.push((name.to_owned(), outcome, took));
    }

    /// Record a failure outside a scenario (set-up).
    pub fn fail(&mut self, name: &str, e: &HarnessError) {
        println!("--- {name}: FAILED\n{}", crate::chain(e));
        self.results.push((
            name.to_owned(),
            Outcome::Failed(crate::chain(e)),
            Duration::ZERO,
        ));
    }

    /// The results so far.
    pub fn results(&self) -> &[(String, Outcome, Duration)] {
        &self.results
    }

    /// Print the summary; failure when any scenario failed.
    pub fn finish(&self, total: Duration) -> ExitCode {
        if self.list {
            return ExitCode::SUCCESS;
        }
        let failed: Vec<_> = self
            .results
            .iter()
            .filter(|(_, o, _)| *o != Outcome::Passed)
            .collect();
        println!("\nscenarios:");
        for (n, o, t) in &self.results {
            let s = if *o == Outcome::Passed {
                "ok"
            } else {
                "FAILED"
            };
            println!("  {s:<6} {n} ({:.1} s)", t.as_secs_f64());
        }
        println!(
            "\ntest result: {}. {} passed; {} failed; finished in {:.1} s",
            if failed.is_empty() { "ok" } else { "FAILED" },
            self.results.len() - failed.len(),
            failed.len(),
            total.as_secs_f64()
        );
        if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
