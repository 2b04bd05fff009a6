//! The committed results folder (`reports/results/`), read as files: its size and its figures.

use std::path::{Path, PathBuf};

/// The files under `dir`, recursively, with their sizes.
fn files(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if let Ok(m) = e.metadata() {
            out.push((p, m.len()));
        }
    }
}

fn results() -> Vec<(PathBuf, u64)> {
    let mut all = Vec::new();
    files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("results"),
        &mut all,
    );
    assert!(!all.is_empty(), "no reports/results");
    all
}

/// The results folder stays within the budget ARCHITECTURE.md states (12 MB): figures as SVG
/// only, no Python caches.
#[test]
fn the_results_folder_keeps_its_budget() {
    let all = results();
    let total: u64 = all.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 12_000_000,
        "reports/results holds {total} bytes, over 12 MB"
    );
    for (p, _) in &all {
        let s = p.to_string_lossy();
        assert!(
            !s.ends_with(".png"),
            "{s}: figures are committed as SVG only"
        );
        assert!(!s.contains("__pycache__"), "{s}: a Python cache");
    }
}

/// Every committed figure is compact SVG, as `rlany report` writes it now
/// (`rlany_reports::svg::compact`). The figures of reports made before it — the suites whose
/// runs are not in the repository among them — were converted by this test once:
/// `RLANY_BLESS=1 cargo test -p rlany-reports --test committed`.
#[test]
fn committed_figures_are_compact() {
    let all: Vec<PathBuf> = results()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(all.len() > 100, "only {} figures found", all.len());
    let bless = std::env::var_os("RLANY_BLESS").is_some();
    let mut loose = Vec::new();
    for p in &all {
        let text = std::fs::read_to_string(p).expect("a readable figure");
        let compact =
            rlany_reports::svg::compact(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if compact != text {
            if bless {
                std::fs::write(p, &compact).expect("rewrite the figure");
            } else {
                loose.push(p.display().to_string());
            }
        }
    }
    assert!(
        loose.is_empty(),
        "figures not compact (`RLANY_BLESS=1 cargo test -p rlany-reports --test committed` \
         rewrites them):\n  {}",
        loose.join("\n  ")
    );
}
